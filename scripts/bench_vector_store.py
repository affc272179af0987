#!/usr/bin/env python
"""The late ranker's reads at 10k, 200k and 1M stored chunks: what a question pays, what the store holds (issue #68).

    nice -n 5 .venv/bin/python scripts/bench_vector_store.py --out reports/scale/vector-store

For each size, a store of the shipped ``ranker-late``'s chunk codes (format 2, its codec) is written, then opened
in a child process of its own (so its peak RSS is its own), and 64 dev questions are each read one at a time as the
loop's ranker reads them: ``predict`` of the question against 47 stored chunks (what the shipped ``loop.json`` reads
per question), drawn at random (seeded) over the whole store, from its memory maps (the page cache warm: the store was
just written; a cold disk adds its reads). Time per question is given in plain pair forwards (the fastest plain
MiniLM-L6 forward, fp32 or bf16, length-sorted batches of 64, over (dev question, dev passage) pairs,
:class:`effrag.tuning.loop_cost.PlainForward`), timed in the same child.

How the chunks are made: 2,048 real dev passages are encoded by the shipped model and coded by its codec; the
store's N chunks are keyed by N distinct synthetic word lists and each holds the codes of real passage ``i mod 2048``
(no 1M-passage corpus exists offline, and encoding one would take about 3 hours on 2 cores). The bytes, shard layout,
lookup and reads are those of a real store of N chunks; the scores are not a retrieval figure. Store write time is the
writing alone: encoding is about 10 ms a chunk on these cores (``effrag index build --system`` reports it).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from effrag.cli_args import DATASETS

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REAL = 2048
READS = 47
SYSTEM = "effrag/pretrained/efficientrag-all"


def rss_mb(field: str = "VmRSS") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def words_of(i: int) -> tuple[str, ...]:
    return ("distractor", str(i))


def dev_text(data: Path) -> tuple[list[str], list[str]]:
    from effrag.data import load_questions

    qs, ps = [], []
    for d in DATASETS:
        for q in load_questions(data / d / "dev.jsonl"):
            qs.append(q.question)
            ps += [f"{p.title} {p.text}" for p in q.contexts]
    return qs, list(dict.fromkeys(ps))


def build(size: int, folder: Path, data: Path) -> dict:
    """Write a store of ``size`` chunks (skipped when its shards are there)."""
    import torch

    from effrag.models import load_model
    from effrag.models.late_vectors import SHARD_CHUNKS, chunk_digest

    model = load_model(f"{SYSTEM}/ranker-late").eval()
    store = model.vector_store(folder, True, None)
    want = -(-size // SHARD_CHUNKS)
    have = len(list(store.folder.glob("vectors-*.safetensors"))) if store.folder.is_dir() else 0
    if have == want:
        return {"written_s": None, "shards": have}
    _, passages = dev_text(data)
    random.Random(0).shuffle(passages)
    torch.manual_seed(0)
    codes = model._encode(model._encode_all(passages[:REAL], model.max_length, 32, True))
    t0 = time.perf_counter()
    for s in range(0, size, SHARD_CHUNKS):
        ids = range(s, min(size, s + SHARD_CHUNKS))
        store.add([chunk_digest(words_of(i)) for i in ids], [codes[i % REAL] for i in ids])
    return {"written_s": time.perf_counter() - t0, "shards": want}


def measure(size: int, folder: Path, data: Path, questions: int) -> dict:
    """In a child of its own: open the store, read ``questions`` questions one at a time."""
    import torch

    from effrag.models import load_model
    from effrag.models.late_vectors import chunk_digest
    from effrag.tuning.loop_cost import PlainForward

    torch.manual_seed(0)
    qs, passages = dev_text(data)
    labeler = load_model(f"{SYSTEM}/labeler").eval()
    rng = random.Random(1)
    unit = PlainForward(labeler, [(rng.choice(qs), rng.choice(passages)) for _ in range(256)])
    unit.seconds_per_pair()
    base = rss_mb()
    model = load_model(f"{SYSTEM}/ranker-late").eval()
    t0 = time.perf_counter()
    store = model.vector_store(folder, True, None)
    known = store.refresh()
    opened = time.perf_counter() - t0
    model.attach_store(store, None, True)
    rss_open = rss_mb() - base
    per_q, reads = [], []
    for qi in range(questions):
        chunks = [words_of(rng.randrange(size)) for _ in range(READS)]
        t0 = time.perf_counter()
        got = store.load([chunk_digest(c) for c in chunks])
        [model.codec.decompress(v) for v in got.values()]
        reads.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        model.predict([qs[qi]] * READS, chunks, bf16=True)
        per_q.append(time.perf_counter() - t0)
        model._vectors._d.clear()  # every question reads from the store, as a cold question would
    per_pair = unit.seconds_per_pair()
    disk = sum(p.stat().st_size for p in store.folder.glob("vectors-*.safetensors"))
    return {"size": size, "known": known, "open_s": opened, "rss_store_mb": rss_open,
            "peak_rss_mb": rss_mb("VmHWM"), "anon_rss_mb": rss_mb("RssAnon"), "file_rss_mb": rss_mb("RssFile"), "disk_bytes_per_chunk": disk / size,
            "question_s": sorted(per_q)[len(per_q) // 2], "read_s": sorted(reads)[len(reads) // 2],
            "unit_s": per_pair, "unit_mode": unit.last_mode,
            "question_pfe": sorted(per_q)[len(per_q) // 2] / per_pair,
            "read_pfe": sorted(reads)[len(reads) // 2] / per_pair, "questions": questions}


def main(argv=None) -> None:
    from effrag.cli_args import add_data_dir_arg, add_output_arg, add_source_args, add_work_arg

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 200_000, 1_000_000])
    add_data_dir_arg(ap)
    add_work_arg(ap, "runs/bench-vector-store", help="scratch folder: each size's corpus and index")
    ap.add_argument("--questions", type=int, default=64, help="dev questions timed per size (default 64)")
    add_output_arg(ap, "reports/scale/vector-store", dest="out")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child: measure this size
    add_source_args(ap)
    args = ap.parse_args(argv)
    if args.one:  # a child of the run below, which checked the tree
        print(json.dumps(measure(args.one, args.work / str(args.one), args.data, args.questions)))
        return
    from effrag.provenance import report_source, write_report

    commit = report_source(args.out, args.allow_dirty)
    rows = []
    for size in args.sizes:
        made = build(size, args.work / str(size), args.data)
        out = subprocess.run([sys.executable, __file__, "--one", str(size), "--work", str(args.work), "--data",
                              str(args.data), "--questions", str(args.questions)], capture_output=True, text=True)
        if out.returncode:
            sys.exit(out.stderr[-3000:])
        rows.append({**json.loads(out.stdout.strip().splitlines()[-1]), **made})
        print(rows[-1], file=sys.stderr)
    small = rows[0]
    lines = ["| chunks | disk / chunk | store written (s) | opened (s) | store headers (MB) | peak RSS (MB) | "
             "at the end: private / mapped files (MB) | read 47 chunks (ms) | question: query + 47 reads + MaxSim "
             "(ms) | pfe | x smallest |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        written = "-" if r["written_s"] is None else f"{r['written_s']:.0f}"
        lines.append(f"| {r['size']:,} | {r['disk_bytes_per_chunk']:.0f} B | {written} | {r['open_s']:.2f} | "
                     f"{r['rss_store_mb']:.0f} | {r['peak_rss_mb']:.0f} | {r['anon_rss_mb']:.0f} / "
                     f"{r['file_rss_mb']:.0f} | {r['read_s'] * 1e3:.1f} | "
                     f"{r['question_s'] * 1e3:.1f} | {r['question_pfe']:.2f} | "
                     f"{r['question_s'] / small['question_s']:.2f} |")
    md = "\n".join([
        "# The late ranker's stored vectors at 10k, 200k and 1M chunks (issue #68)", "",
        f"Commit `{commit}`, {time.strftime('%Y-%m-%d')}. Command: `python scripts/bench_vector_store.py "
        f"--sizes {' '.join(map(str, args.sizes))} --out {args.out}`. Medians over {args.questions} questions, one at "
        f"a time; the unit (plain MiniLM-L6 pair forward, {rows[-1]['unit_mode']}) is "
        f"{rows[-1]['unit_s'] * 1e3:.2f} ms a pair in the last child.", "",
        *lines, "",
        "Peak RSS counts the pages of the shards a process has mapped and touched: page cache, shared and "
        "reclaimable (the kernel maps whole cached folios on a fault, so a few KB read can map more). The private "
        "memory at the end is the process's own: the models, the store's headers and lookup.", "",
        "How the stores were made, and what that means, is in the script's docstring: real codes of 2,048 dev "
        "passages, repeated under distinct keys. The first stage's search time is apart (it grows with the "
        "corpus): see `docs/scale.md`.",
    ]) + "\n"
    write_report(args.out, md, {"commit": commit, "rows": rows}, args=args)
    print(md)


if __name__ == "__main__":
    main()
