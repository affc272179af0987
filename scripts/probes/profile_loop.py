"""Where the EfficientRAG loop's time goes: ``cProfile`` of the shipped system over dev questions, by kind of work.

The shipped system by name (``--checkpoints``, or ``--model`` as before; its ``loop-<dataset>.json`` and retriever,
as ``effrag eval`` runs it: the corpus prepared first, ``EfficientRAGLoop.prepare``), one warm-up batch, then
``--limit`` questions in batches of ``--batch``. Writes ``OUTPUT/profile.md``: the share of the profiled time in
torch's kernels (linear, attention, GELU, layer norm, embedding), the Rust tokenizer, spaCy's word splitting and the
rest, and the 25 functions of most own time. Profiling adds overhead to Python-heavy parts, so
the shares bound them from above.

    python scripts/probes/profile_loop.py --dataset 2wikimqa --limit 32 --output reports/efficientrag/loop-cost/profile-2wikimqa
"""
from __future__ import annotations

import argparse
import cProfile
import io
import logging
import os
import pstats
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

KINDS = {  # kind of work -> substrings of the profiled function's name
    "torch: linear layers": ("torch._C._nn.linear",),
    "torch: attention": ("scaled_dot_product_attention",),
    "torch: GELU, layer norm, embedding": ("torch._C._nn.gelu", "torch.layer_norm", "torch.embedding"),
    "tokenizer (Rust)": ("encode_batch",),
    "spaCy word splitting": ("spacy",),
}


def main(argv=None) -> int:
    from effrag.cli_args import (
        DATASETS,
        add_checkpoints_arg,
        add_data_args,
        add_limit_arg,
        add_output_arg,
        add_source_args,
    )
    from effrag.pipelines.efficientrag import EfficientRAGLoop, build_config, load_models
    from effrag.pipelines.efficientrag.system import open_system
    from effrag.provenance import provenance, report_source
    from effrag.setup import RunSetup

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = add_data_args(p, datasets=DATASETS[1:2], one=True, limit=False)  # --dataset: 2WikiMQA unless given
    add_limit_arg(g, 32, help="dev questions profiled, after the warm-up batch")
    add_checkpoints_arg(p, "efficientrag-all", help="the shipped system by name, or a system folder")
    p.add_argument("--batch", type=int, default=16, help="questions per loop call (default 16)")
    add_output_arg(p, required=True, help="folder profile.md is written to")
    add_source_args(p)
    args = p.parse_args(argv)
    commit = report_source(args.output, args.allow_dirty)
    logging.disable(logging.WARNING)
    data = args.data / args.dataset
    system = open_system(args.checkpoints, dataset=args.dataset)
    setup = RunSetup.build(data / "dev.jsonl", corpus_from=[data / "train.jsonl"], retriever=system.retriever or "dense",
                           bf16=True, limit=args.limit + args.batch)
    labeler, filter_model, ranker = load_models(system.labeler, system.filter, "cpu", ranker=system.ranker)
    loop = EfficientRAGLoop(labeler, filter_model, setup.retriever, build_config(system.config), ranker=ranker)
    loop.prepare()  # the corpus split and tokenised before the questions, as effrag eval and serve do
    texts = setup.texts
    loop.run(texts[: args.batch])  # warm-up: first-call allocations and lazy loads
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for i in range(args.batch, len(texts), args.batch):
        loop.run(texts[i:i + args.batch])
    prof.disable()
    wall = time.perf_counter() - t0
    stats = pstats.Stats(prof)
    own = {f"{path}:{name}" if path != "~" else name: tt for (path, _, name), (_, _, tt, _, _) in stats.stats.items()}
    total = sum(own.values())
    shares = {kind: sum(t for fn, t in own.items() if any(k in fn for k in keys)) / total for kind, keys in KINDS.items()}
    shares["the rest (retrieval, pool, Python)"] = 1.0 - sum(shares.values())
    top = io.StringIO()
    pstats.Stats(prof, stream=top).sort_stats("tottime").print_stats(25)
    n = len(texts) - args.batch
    lines = [f"# Where the loop's time goes: {args.checkpoints}, {system.config.name if system.config else 'defaults'}, "
             f"{args.dataset}", "",
             f"{n} dev questions in batches of {args.batch} after one warm-up batch; {wall / n * 1000:.0f} ms per "
             f"question under the profiler. Command: `{provenance(argv=argv, prog='python scripts/probes/profile_loop.py')['command']}`"
             f", at commit {commit}.",
             "", "| kind of work | share of the profiled time |", "|---|---:|",
             *(f"| {kind} | {100 * share:.1f}% |" for kind, share in shares.items()), "",
             "The 25 functions of most own time:", "", "```",
             *(line.rstrip().replace(str(Path.cwd()) + "/", "").replace(sys.prefix + "/", "<venv>/")
               .replace(sys.base_prefix + "/", "<python>/")
               for line in top.getvalue().splitlines() if line.strip() and "function calls" not in line), "```", ""]
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "profile.md").write_text("\n".join(lines))
    print("\n".join(lines[:12 + len(shares)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
