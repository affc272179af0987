#!/usr/bin/env python
"""In-process LLM throughput, side by side (issue #18 part 2): tokens/s for prompts and for generation.

The prompts are real: the paper's QA prompt over Direct-R@K chunks (dense MiniLM) for the first N dev
questions of a dataset, answered as ``effrag eval`` answers them (``Generator``, 64 new tokens at most,
greedy). Each variant is timed twice over the same prompts with its response cache off:

* *prefill*: ``max_tokens=1``; prompt tokens/s = prompt tokens / seconds, nothing reused between prompts;
* *generation*: a short prompt that makes the model count, 64 new tokens per question; tokens/s = new
  tokens / (seconds - its prompt's share at the prefill rate);
* *answer*: the generator's real call (llama.cpp reuses the KV cache of a prompt prefix shared with the
  previous prompt here, as it does in ``effrag eval``): seconds per question.

Batched variants send all prompts at once (``chat_many``): the transformers backend decodes up to
``--max-batch`` of them together; their tokens/s are throughput over the whole set. EM/F1 of the parsed
answers and agreement with the first variant's answer texts are reported beside the speed.

Variants: ``gguf-old`` (effrag's default before this benchmark: the shipped Q4_1 file, 1 of 2 threads),
llama.cpp settings one at a time (:data:`GGUF_VARIANTS`; re-quantized copies are made once by
``effrag.llm.gguf.requantized``), ``gguf`` (the default now), ``hf-fp32`` / ``hf-int8`` (transformers, one
request at a time) and ``hf-fp32-batch`` / ``hf-int8-batch``.

    nice -n 5 .venv/bin/python scripts/bench_llm.py --n 16 --output reports/llm
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# name -> backend and options. "gguf-old" is effrag's default before this benchmark: the Q4_1 file as
# shipped, half the cores (1 of 2), llama.cpp's 512-token micro-batches, no flash attention.
OLD = {"quant": None, "threads": 1, "flash_attn": False, "n_ubatch": 512}
GGUF_VARIANTS = {
    "gguf-old": OLD,
    "gguf-q4_1-all-cores": {**OLD, "threads": None},
    "gguf-q4_1-fa": {**OLD, "threads": None, "flash_attn": True, "n_ubatch": 128},
    "gguf-q4_0-nofa": {**OLD, "threads": None, "quant": "q4_0"},
    "gguf-q4_0-fa": {"quant": "q4_0"},
    "gguf-f16-fa": {"quant": "f16"},
    "gguf": {},  # the default now: re-quantized to Q8_0, every core, flash attention, 128-token micro-batches
}
VARIANTS = [*GGUF_VARIANTS, "hf-fp32", "hf-int8", "hf-fp32-batch", "hf-int8-batch"]


def build(variant: str, gguf: Path, default_model: bool, threads: int, max_batch: int):
    from effrag.llm import GGUFBackend, TransformersBackend

    if variant in GGUF_VARIANTS:
        o = dict(GGUF_VARIANTS[variant])
        n_threads = o.pop("threads", None) or threads
        return GGUFBackend(None if default_model else gguf, n_threads=n_threads, cache=False, **o)
    precision = variant.split("-")[1]
    return TransformersBackend(gguf, precision=precision, cache=False,
                               max_batch=max_batch if variant.endswith("-batch") else 1)


COUNT_PROMPT = "List the numbers from 1 to 200, separated by commas."


def measure(llm, generator_cls, questions, chunks, dataset: str, batched: bool) -> dict:
    """Prompt tokens/s with nothing reused between prompts (llama.cpp's context is reset before each, so a
    shared prompt prefix is processed again), generation tokens/s on a short prompt that makes the model
    count (64 new tokens, one per question, all at once when batched), and the real answer pass."""
    gen = generator_cls(llm=llm, dataset=dataset)
    msgs = [[{"role": "user", "content": gen.build_prompt(q, c)}] for q, c in zip(questions, chunks)]
    reset = getattr(getattr(llm, "llm", None), "reset", None)  # llama_cpp.Llama.reset: forget the KV prefix
    llm.chat(msgs[0], max_tokens=1)  # warm-up (thread pools, first-call allocations)
    t0 = time.perf_counter()
    if batched:
        pre = [c[0] for c in llm.chat_many(msgs, max_tokens=1)]
    else:
        pre = []
        for m in msgs:
            if reset:
                reset()
            pre += llm.chat(m, max_tokens=1)
    prefill_s = time.perf_counter() - t0
    count = [[{"role": "user", "content": COUNT_PROMPT}]] * len(questions)
    t0 = time.perf_counter()
    counted = llm.chat_many(count, max_tokens=64, seed=None) if batched else [llm.chat(m, max_tokens=64) for m in count]
    count_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    answers = gen.generate_batch(questions, chunks)
    answer_s = time.perf_counter() - t0
    prompt_tokens = sum(c.prompt_tokens for c in pre)
    prompt_tok_s = prompt_tokens / prefill_s
    count_tokens = sum(c[0].completion_tokens for c in counted)
    count_prompt = sum(c[0].prompt_tokens for c in counted)
    return {"prompt_tokens": prompt_tokens, "prefill_s": prefill_s, "prompt_tok_s": prompt_tok_s,
            "gen_tokens": count_tokens, "gen_s": count_s,
            "gen_tok_s": count_tokens / max(1e-9, count_s - count_prompt / prompt_tok_s),
            "completion_tokens": sum(a.completion_tokens for a in answers), "answer_s": answer_s,
            "s_per_question": answer_s / len(questions), "answers": [a.answer for a in answers],
            "raw": [a.raw for a in answers]}


def main(argv=None) -> int:
    import torch

    from effrag.cli_args import add_data_args, add_output_arg, add_source_args, add_threads_arg
    from effrag.evaluation.metrics import exact_match, f1
    from effrag.hardware import usable_cores
    from effrag.llm import default_gguf_path
    from effrag.pipelines.generation import Generator
    from effrag.provenance import provenance, report_source
    from effrag.setup import RunSetup

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_data_args(p, one=True, limit=False)
    p.add_argument("--n", type=int, default=16, help="first N dev questions")
    p.add_argument("--k", type=int, default=5, help="Direct-R chunks per prompt")
    p.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    add_threads_arg(p, help="threads for the multi-thread variants", unset="all usable cores")
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--gguf", default=None, help="GGUF file (default: the bundled SmolLM2-135M-Instruct)")
    add_output_arg(p, "reports/llm")
    add_source_args(p)
    args = p.parse_args(argv)
    commit = report_source(args.output, args.allow_dirty)
    threads = args.threads or usable_cores()
    torch.set_num_threads(threads)
    gguf = Path(args.gguf) if args.gguf else default_gguf_path()  # "auto" re-quantizes only the default model
    data = Path(args.data) / args.dataset
    setup = RunSetup.build(data / "dev.jsonl", corpus_from=[data / "train.jsonl"], retriever="dense", limit=args.n)
    questions = setup.texts
    chunks = [[setup.corpus[h.id] for h in hits] for hits in setup.retriever.search(questions, args.k)]
    golds = [q.answers for q in setup.questions]
    rows = []
    for v in args.variants:
        t0 = time.perf_counter()
        llm = build(v, gguf, args.gguf is None, threads, args.max_batch)
        load_s = time.perf_counter() - t0
        m = measure(llm, Generator, questions, chunks, args.dataset, batched=v.endswith("-batch"))
        m.update(variant=v, load_s=load_s, model=llm.model_id,
                 em=100 * sum(exact_match(a, g) for a, g in zip(m["answers"], golds)) / len(golds),
                 f1=100 * sum(f1(a, g) for a, g in zip(m["answers"], golds)) / len(golds))
        if rows:
            m["same_text_as_first"] = sum(a == b for a, b in zip(m["raw"], rows[0]["raw"])) / len(questions)
        rows.append(m)
        print(f"{v}: prompt {m['prompt_tok_s']:.0f} tok/s, generation {m['gen_tok_s']:.0f} tok/s, "
              f"{m['s_per_question']:.2f} s/question, EM {m['em']:.1f}", file=sys.stderr, flush=True)
        del llm
        gc.collect()
    base = rows[0]
    lines = [f"# In-process LLM throughput: {args.dataset} dev, first {len(questions)} questions\n",
             f"Model `{gguf.name}`; prompts: the paper's QA prompt over Direct-R@{args.k} chunks (dense MiniLM), "
             f"answered with at most 64 new tokens, greedy, response cache off; {threads} threads "
             f"(`gguf-old`: 1). Prompt tokens/s from a `max_tokens=1` pass (llama.cpp's context reset before "
             f"each prompt); generation tokens/s from a counting prompt, 64 new tokens per question; "
             f"s/question from the real answer pass (llama.cpp reuses a shared prompt prefix there). Batched variants: all prompts through `chat_many`, up to "
             f"{args.max_batch} decoded together. *x* = prompt tokens/s over `{base['variant']}`'s.\n",
             "| variant | load s | prompt tok/s | x | generation tok/s | s/question | EM | F1 | same text as first |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        same = f"{100 * r['same_text_as_first']:.0f}%" if "same_text_as_first" in r else "-"
        lines.append(f"| {r['variant']} | {r['load_s']:.1f} | {r['prompt_tok_s']:.0f} | "
                     f"{r['prompt_tok_s'] / base['prompt_tok_s']:.1f} | {r['gen_tok_s']:.0f} | "
                     f"{r['s_per_question']:.2f} | {r['em']:.1f} | {r['f1']:.1f} | {same} |")
    lines.append(f"\nPrompt tokens per question: {base['prompt_tokens'] / len(questions):.0f} on average.\n"
                 f"Command: `{' '.join(['python', 'scripts/bench_llm.py'] + (argv if argv is not None else sys.argv[1:]))}`\n")
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text("\n".join(lines))
    (out / "results.json").write_text(json.dumps(
        {"provenance": provenance(prog="scripts/bench_llm.py", files=[data / "dev.jsonl", gguf], commit=commit),
         "setup": {"dataset": args.dataset, "n": len(questions), "k": args.k, "threads": threads,
                   "max_batch": args.max_batch}, "rows": rows}, indent=2, default=str))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
