#!/usr/bin/env python
"""Run EfficientRAG's LLM synthesis path on the first N questions of a dataset file.

Writes ``labeler.jsonl``, ``filter.jsonl``, ``rejects.jsonl``, ``done.jsonl``
(resumable: a rerun skips finished questions unless ``--fresh``), ``config.json``
and ``stats.json`` (record counts, reject reasons, wall time, LLM calls, cache hits
and tokens) into ``--output``. Example (SmolLM2 in process, 20 HotpotQA questions)::

    nice .venv/bin/python scripts/synthesize_llm_sample.py \
        --questions ../shared/data/hotpotqa/train.jsonl --n 20 --llm default --output runs/llm_sample

Hard negatives are not added here (that is the negatives step of ``effrag synthesize``).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_synthesis.llm_steps import LLMStepsConfig, SynthesisReject, synthesize_question_llm  # noqa: E402
from effrag.cli_args import add_llm_arg, add_output_arg, add_questions_arg, add_seed_arg  # noqa: E402
from effrag.data import load_questions  # noqa: E402
from effrag.jsonl import ResumableWriter, read_jsonl  # noqa: E402
from effrag.llm import load_llm  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_questions_arg(ap, aliases=("--data",), help="dataset file (HotpotQA / 2Wiki / MuSiQue, original format)")
    ap.add_argument("--n", type=int, default=20, help="first N questions (0 = all)")
    add_llm_arg(ap, "default")
    add_output_arg(ap, required=True, dest="out", help="output directory")
    ap.add_argument("--cache", default=None, help="sqlite response cache (default: $EFFRAG_CACHE_DIR or ~/.cache/effrag)")
    ap.add_argument("--max-retries", type=int, default=2)
    add_seed_arg(ap, help="the synthesis steps' seed")
    ap.add_argument("--n-ctx", type=int, default=4096, help="context size of a GGUF model")
    ap.add_argument("--fresh", action="store_true", help="delete previous outputs in --output first")
    args = ap.parse_args(argv)

    from tqdm import tqdm

    out = Path(args.out)
    if args.fresh and out.exists():
        for name in ("labeler", "filter", "rejects", "done"):
            (out / f"{name}.jsonl").unlink(missing_ok=True)
    questions = load_questions(args.questions)
    if args.n:
        questions = questions[: args.n]
    cfg = LLMStepsConfig(max_retries=args.max_retries, seed=args.seed)
    options = {"cache": args.cache if args.cache else True}
    if not args.llm.startswith("openai:"):
        options["n_ctx"] = args.n_ctx
    llm = load_llm(args.llm, **options)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(
        {"data": args.questions, "n": args.n, "llm": args.llm, "model_id": llm.model_id, "steps": cfg.__dict__},
        indent=2))

    t0 = time.perf_counter()
    processed = 0
    with ResumableWriter(out) as w:
        for q in tqdm(questions, desc="llm synthesis", unit="q"):
            if w.is_done(q.dataset, q.id):
                continue
            processed += 1
            try:
                lab, filt = synthesize_question_llm(q, llm, config=cfg)
            except SynthesisReject as e:
                rej = {"qid": q.id, "dataset": q.dataset, "stage": e.reason.split("_")[0], "reason": e.reason,
                       "detail": e.detail[:1000], "source": "llm"}
                w.write_item(q.dataset, q.id, rejects=[rej], status="rejected")
                continue
            w.write_item(q.dataset, q.id, labeler=lab, filters=filt)
    wall = time.perf_counter() - t0

    recs = {name: list(read_jsonl(out / f"{name}.jsonl")) for name in ("labeler", "filter", "rejects")}
    stats = {
        "questions": len(questions),
        "processed_this_run": processed,
        "accepted": len({r["qid"] for r in recs["labeler"]}),
        "rejected": len(recs["rejects"]),
        "labeler_records": len(recs["labeler"]),
        "filter_records": len(recs["filter"]),
        "reject_reasons": dict(Counter(r["reason"] for r in recs["rejects"]).most_common()),
        "labeled_word_fraction": round(
            sum(sum(r["labels"]) for r in recs["labeler"]) / max(1, sum(len(r["labels"]) for r in recs["labeler"])), 4),
        "wall_time_s": round(wall, 2),
        "llm": {"model": llm.model_id, **llm.usage.to_json()},
    }
    (out / "stats.json").write_text(json.dumps(stats, indent=2))
    print(json.dumps(stats, indent=2))
    return stats


if __name__ == "__main__":
    main()
