"""Labeler inference cost by backbone: (question, passage) pairs per second on this machine.

    python scripts/bench_labeler_backbones.py --questions ../shared/data/hotpotqa/dev.jsonl \
        --backbones minilm smollm2 --pairs 256 --output reports/efficientrag/backbone-latency

Each backbone gets fresh heads (the cost does not depend on trained weights): the pairs are dev questions
with their context passages as spaCy words, run through ``LabelerModel.predict`` at the Labeler's
max_length (256) in length-sorted batches, after one warm-up batch. Writes latency.json and latency.md
(pairs/s, ms per pair, ms per question at 25 chunks = the loop's typical seen set, parameters, threads).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from effrag.cli_args import add_batch_size_arg, add_bf16_arg, add_output_arg, add_questions_arg, add_source_args
from effrag.evaluation.report import md_table
from effrag.provenance import provenance, report_source


def pairs_from(questions_file: str, n: int) -> tuple[list[str], list[list[str]]]:
    from effrag.data.loaders import load_questions
    from effrag.text import words_batch

    queries, texts = [], []
    for q in load_questions(questions_file):
        for p in q.contexts:
            queries.append(q.question)
            texts.append(f"{p.title}. {p.text}")
            if len(texts) >= n:
                return queries, words_batch(texts)
    return queries, words_batch(texts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_questions_arg(ap, help="dataset file whose questions and context passages make the pairs")
    ap.add_argument("--backbones", nargs="+", default=["minilm", "smollm2"])
    ap.add_argument("--pairs", type=int, default=256)
    add_batch_size_arg(ap, 32, of="pairs per forward pass")
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_bf16_arg(ap, help="bfloat16 autocast for the Labeler")
    add_output_arg(ap, required=True, help="folder latency.json and latency.md are written to")
    add_source_args(ap)
    args = ap.parse_args()
    commit = report_source(args.output, args.allow_dirty)

    from effrag.models import LabelerModel

    queries, chunks = pairs_from(args.questions, args.pairs)
    rows = []
    for name in args.backbones:
        torch.manual_seed(0)
        model = LabelerModel.from_encoder(name, {"max_length": args.max_length}).to(args.device).eval()
        with torch.inference_mode():
            model.predict(queries[: args.batch_size], chunks[: args.batch_size], batch_size=args.batch_size, bf16=args.bf16)
            t0 = time.perf_counter()
            model.predict(queries, chunks, batch_size=args.batch_size, bf16=args.bf16)
            dt = time.perf_counter() - t0
        rows.append({"backbone": name, "parameters_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
                     "pairs": len(chunks), "seconds": round(dt, 2), "pairs_per_s": round(len(chunks) / dt, 1),
                     "ms_per_pair": round(1000 * dt / len(chunks), 2),
                     "ms_per_question_25_chunks": round(25 * 1000 * dt / len(chunks), 1)})
        print(json.dumps(rows[-1]), flush=True)
        del model
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"questions": args.questions, "device": args.device, "bf16": args.bf16, "batch_size": args.batch_size,
            "max_length": args.max_length, "torch_threads": torch.get_num_threads(),
            "machine": platform.processor() or platform.machine(),
            **provenance(prog="scripts/bench_labeler_backbones.py", files=[args.questions], commit=commit)}
    (out / "latency.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    base = rows[0]["ms_per_pair"]
    md = [md_table(["backbone", "parameters (M)", "pairs/s", "ms / pair", "ms / question (25 chunks)", "x first"],
                   [[r["backbone"], r["parameters_m"], r["pairs_per_s"], r["ms_per_pair"],
                     r["ms_per_question_25_chunks"], f"{r['ms_per_pair'] / base:.1f}"] for r in rows], "lrrrrr")]
    md += [f"{len(chunks)} (question, passage) pairs from `{args.questions}`, device {args.device}, "
           f"bf16 {args.bf16}, batch {args.batch_size}, max_length {args.max_length}, {meta['torch_threads']} threads.",
           f"Command: `{meta['command']}`", ""]
    (out / "latency.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
