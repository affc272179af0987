"""``effrag retrieve``: questions over one's own index, no gold passages needed.

``effrag eval`` scores a method against a dataset file's gold passages; a user with their own documents
has an index (``effrag index build --corpus my_docs/ --retriever bm25 --output idx``) and a question. This
prints the ranked chunks (rank, the score the ranking used, EfficientRAG's p(<Continue>) under its own
name, title, the text's start), or one JSON object per question with
``--json``, and an answer with ``--llm SPEC`` or ``--reader DIR|NAME``::

    effrag retrieve --index idx "Which person went into space later, Sigmund Jähn or Christer Fuglesang?"
    effrag retrieve --index idx --questions questions.txt --method direct-r --k 5 --json

The method is ``effrag.pipelines.DEFAULT_METHOD`` (the shipped EfficientRAG system, no LLM call) unless
``--method`` names another registered one; ``--model`` names another system folder for a method that loads one.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SNIPPET_CHARS = 200
BATCH = 16  # questions per pipeline call


def add_retrieve_parser(sub) -> None:
    from effrag.cli_args import positive_int
    from effrag.pipelines.base import DEFAULT_METHOD

    p = sub.add_parser("retrieve", help="ranked chunks (and an answer) for questions over a saved index")
    p.add_argument("question", nargs="*", help="one or more questions (or --questions FILE)")
    p.add_argument("--index", required=True, metavar="DIR", help="a saved index (`effrag index build`)")
    p.add_argument("--questions", metavar="FILE", help="a text file of questions, one per line")
    p.add_argument("--method", default=DEFAULT_METHOD,
                   help=f"registered method (default {DEFAULT_METHOD}: the shipped system; direct-r: the index alone)")
    p.add_argument("--model", metavar="DIR|NAME", default=None,
                   help="a method that loads a trained system: a system folder or a shipped name (default: the "
                        "method's own)")
    p.add_argument("--er-config", metavar="JSON", help="a method that loads a trained system: its settings file "
                                                       "(default: the system's own, e.g. loop.json)")
    p.add_argument("--k", type=positive_int, metavar="N",
                   help="chunks per retrieval (default 10; a method with its own depth, e.g. EfficientRAG's per hop, "
                        "keeps it unless given)")
    a = p.add_mutually_exclusive_group()
    a.add_argument("--llm", metavar="SPEC", help="answer with an LLM: 'default', gguf:PATH, hf:..., openai:URL#MODEL")
    a.add_argument("--reader", metavar="DIR|NAME", help="answer with a trained extractive reader (no LLM)")
    p.add_argument("--json", action="store_true", help="one JSON object per question (JSONL) instead of text")
    p.set_defaults(func=_cmd_retrieve)


def read_questions(args) -> list[str]:
    """The questions given on the command line, then those of ``--questions`` (blank lines skipped)."""
    questions = [q.strip() for q in args.question if q.strip()]
    if args.questions:
        path = Path(args.questions)
        if not path.is_file():
            raise FileNotFoundError(f"questions file not found: {path}")
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            from effrag.data.loaders import utf8_error

            raise utf8_error(path, raw, e) from None
        questions += [line.strip() for line in text.splitlines() if line.strip()]
        if not questions:
            raise ValueError(f"{path}: no questions in it (one per line)")
    if not questions:
        raise ValueError("no question: give one or more questions, or --questions FILE")
    return questions


def _method_options(cls, args) -> dict[str, Any]:
    """The method's keywords: its trained system and settings file (a method that ``uses_system``)."""
    from effrag.pipelines import available_pipelines, get_pipeline_class

    opts: dict[str, Any] = {}
    if cls.uses_system:
        opts.update(cls.system_options(args.model, args.er_config))
    elif args.model or args.er_config:
        takers = [n for n in available_pipelines() if get_pipeline_class(n).uses_system]
        raise ValueError(f"--model and --er-config apply to --method {' / '.join(takers)}, not {cls.name}")
    return opts


def _answer_options(cls, args) -> dict[str, Any]:
    """The answer step's keywords: ``--llm`` or ``--reader``."""
    from effrag.pipelines import llm_options, reader_options

    return {**llm_options(cls, args.llm, None), **reader_options(cls, args.reader)}


def _row(result, score_name: str = "score") -> dict[str, Any]:
    """One question's JSON row. ``score`` is what the ranking sorted by (a chunk's ``order_score`` where the method
    orders by one, e.g. EfficientRAG's ranker logit with its bonuses); the method's own chunk score, when that is
    another value, follows under its name (``score_name``, e.g. EfficientRAG's ``p_continue``)."""
    chunks = []
    for i, c in enumerate(result.chunks, start=1):
        chunk: dict[str, Any] = {"rank": i, "id": c.id}
        if c.order_score is not None:
            chunk["score"] = round(float(c.order_score), 6)
            if score_name != "score":
                chunk[score_name] = round(float(c.score), 6)
        else:
            chunk["score"] = round(float(c.score), 6)
        chunks.append({**chunk, "title": c.title, "text": c.text})
    row: dict[str, Any] = {"question": result.question, "chunks": chunks}
    if result.answer is not None:
        row["answer"] = result.answer
    return row


def _text(row: dict[str, Any], score_name: str = "score") -> str:
    """The text form: rank, the ranking's score (and the method's own chunk score where it differs), title and
    the text's start."""
    own = score_name != "score" and any(score_name in c for c in row["chunks"])
    lines = [f"question: {row['question']}",
             f"{'rank':>4}  {'score':>8}" + (f"  {score_name:>10}" if own else "") + "  title: text"]
    for c in row["chunks"]:
        text = " ".join(c["text"].split())
        snippet = text if len(text) <= SNIPPET_CHARS else text[:SNIPPET_CHARS - 1].rstrip() + "…"
        extra = f"  {c[score_name]:10.4f}" if own else ""
        lines.append(f"{c['rank']:>4}  {c['score']:8.4f}{extra}  {c['title'] or '(no title)'}: {snippet}")
    if not row["chunks"]:
        lines.append("  (no chunks)")
    if "answer" in row:
        lines.append(f"answer: {row['answer']}")
    return "\n".join(lines)


def _cmd_retrieve(args) -> None:
    from effrag.pipelines import get_pipeline_class
    from effrag.setup import open_index

    questions = read_questions(args)  # before any model or index loads: a bad file fails at once
    cls = get_pipeline_class(args.method)
    plan = cls.plan(_method_options(cls, args), k=args.k, default_k=10)  # its own depth unless --k is given
    answer = _answer_options(cls, args)
    retriever = open_index(args.index)
    for warning in plan.warnings(None, retriever):  # e.g. the shipped system (tuned over e5-small) over a MiniLM index
        print(f"effrag: warning: {warning}", file=sys.stderr)
    pipeline = plan.build(retriever, **answer)
    for start in range(0, len(questions), BATCH):
        for result in pipeline.run_batch(questions[start:start + BATCH]):
            row = _row(result, cls.chunk_score_name)
            print(json.dumps(row, ensure_ascii=False) if args.json else _text(row, cls.chunk_score_name) + "\n",
                  flush=True)
    if not args.json:
        print(f"({len(questions)} question(s), method {pipeline.name}, index {args.index})", file=sys.stderr)
