"""A trained ranker's scores on ranker groups (``effrag ranker-teacher``): soft targets to distill a smaller ranker.

Every candidate of every group of an ``effrag ranker-data`` file gets ``"teacher"``: the teacher's relevance logit
of (query, candidate), read exactly as the loop reads it (``[CLS] query [SEP] title + text [SEP]`` at the teacher's
own ``max_length`` unless told otherwise). A student trained with ``model.extra_options.distill_weight`` > 0
(``configs/ranker_distilled.yaml``) then learns the teacher's whole order of each group, not only its gold.

Scoring 40k pairs takes minutes on a CPU, so the output grows by whole records in ``ranker.jsonl.partial`` and a
killed run resumes after the last complete line; the finished file is renamed into place with
``ranker_teacher.json`` (settings, counts, the teacher's fingerprint), and a finished output with the same
settings is reused.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from effrag.state_files import commit, read_json, write_json_atomic
from effrag.text import chunk_text, words_batch

DONE_NAME = "ranker_teacher.json"


def _read_records(path: Path) -> list[dict]:
    """The groups of ``path``; a line that is not a ranker group, a field of the wrong type, a byte that is not UTF-8
    or a file without any group is a ValueError naming the file (and line, and field): before the teacher loads."""
    from effrag.jsonl import numbered_jsonl

    records = []
    for n, rec in numbered_jsonl(path):
        if not isinstance(rec, dict) or not isinstance(rec.get("query"), str) \
                or not isinstance(rec.get("candidates"), list) or not rec["candidates"]:
            raise ValueError(f"{path}:{n}: not a ranker group (needs 'query' and a non-empty 'candidates' list)")
        for i, c in enumerate(rec["candidates"]):
            if not isinstance(c, dict) or "text" not in c:
                raise ValueError(f"{path}:{n}: candidates[{i}] has no field 'text'")
            for field in ("text", "title"):
                if field in c and not isinstance(c[field], str):
                    raise ValueError(f"{path}:{n}: candidates[{i}] field {field!r}: expected a string, got "
                                     f"{type(c[field]).__name__} {c[field]!r:.40}")
        records.append(rec)
    if not records:
        raise ValueError(f"{path}: no ranker groups (an empty file); make it with `effrag ranker-data`")
    return records


def _complete_lines(path: Path) -> int:
    """How many whole records a partial output holds; a torn last line (a kill mid-write) is cut off."""
    from effrag.jsonl import truncate_partial_line

    if not path.is_file():
        return 0
    truncate_partial_line(path)
    with path.open("rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


def score_records(teacher, records: list[dict], max_length: int | None, batch_size: int, bf16: bool) -> list[dict]:
    """``records`` with each candidate's ``teacher`` logit set."""
    queries, chunks = [], []
    texts = [chunk_text(c.get("title", ""), c["text"]) for r in records for c in r["candidates"]]
    words = iter(words_batch(texts))
    for r in records:
        for _ in r["candidates"]:
            queries.append(r["query"])
            chunks.append(next(words))
    scores = iter(teacher.predict(queries, chunks, batch_size=batch_size, max_length=max_length, bf16=bf16))
    out = []
    for r in records:
        out.append({**r, "candidates": [{**c, "teacher": round(next(scores), 5)} for c in r["candidates"]]})
    return out


def write_teacher_scores(data: str | Path, teacher_dir: str | Path, output: str | Path, *, max_length: int | None = None,
                         batch_size: int = 64, bf16: bool = False, records_per_step: int = 64,
                         show_progress: bool = True) -> dict:
    """Score ``data`` (a ranker.jsonl, or the folder holding one) with the ranker in ``teacher_dir`` into
    ``output/ranker.jsonl``; resumes a killed run. Returns the info written to ``output/ranker_teacher.json``."""
    from effrag.models import load_model
    from effrag.models.model_files import fingerprint
    from effrag.models.ranker import RankerModel

    src = Path(data)
    if src.is_dir():
        src = src / "ranker.jsonl"
    if not src.is_file():
        raise FileNotFoundError(f"{src} not found (an `effrag ranker-data` output is needed)")
    records = _read_records(src)
    teacher = load_model(str(teacher_dir))
    if not isinstance(teacher, RankerModel):
        raise ValueError(f"{teacher_dir}: a {teacher.model_type} model, not a ranker")
    teacher.eval()
    from effrag.hardware import resolve_bf16

    bf16 = resolve_bf16(bf16, teacher.device.type)  # asked for where the CPU has no native bf16: fp32, with a warning
    out_dir = Path(output)
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = out_dir / "ranker.jsonl.partial"
    settings = {"data": str(data), "data_bytes": src.stat().st_size, "teacher_fingerprint": fingerprint(teacher_dir),
                "max_length": max_length or teacher.max_length, "bf16": bf16}
    started = out_dir / "ranker_teacher.partial.json"
    fix = f"remove it and {partial.name} to score this output again"
    if partial.exists() and (not started.is_file() or read_json(started, fix) != settings):
        partial.unlink()  # begun with another teacher, data or length: its scores must not be mixed in
    write_json_atomic(started, settings, indent=2)
    done = _complete_lines(partial)
    if done > len(records):
        raise ValueError(f"{partial} holds {done} records but {src} has {len(records)}: remove it and run again")
    start = time.perf_counter()
    bar = None
    if show_progress:
        from tqdm import tqdm

        bar = tqdm(total=len(records), initial=done, unit="group", desc="teacher scores")
    with partial.open("a", encoding="utf-8") as f:
        for i in range(done, len(records), records_per_step):
            chunk = score_records(teacher, records[i:i + records_per_step], max_length, batch_size, bf16)
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in chunk))
            f.flush()
            os.fsync(f.fileno())  # whole records on disk: a resume counts only complete lines
            if bar is not None:
                bar.update(len(chunk))
    if bar is not None:
        bar.close()
    commit(partial, out_dir / "ranker.jsonl")
    started.unlink()
    info = {**settings, "teacher": str(teacher_dir), "groups": len(records),
            "pairs": sum(len(r["candidates"]) for r in records), "resumed_at": done,
            "seconds": round(time.perf_counter() - start, 1)}
    src_info = src.parent / "ranker_data.json"
    if src_info.is_file():
        info["ranker_data"] = read_json(src_info, "remove it, or make that output again with `effrag ranker-data`")
    write_json_atomic(out_dir / DONE_NAME, info, indent=2)
    return info
