"""SearChain (Xu et al., 2023): a global Chain-of-Query checked node by node against retrieval.

Each round the LLM writes a Chain-of-Query (CoQ): ``[Query i]`` / ``[Answer i]``
nodes, ``[Unsolved Query]`` for what it does not know, and ``[Final Content]``.
Algorithm 1 then visits the nodes in order, skipping queries already processed.
For each node it retrieves the top-1 document ``d`` and reads it with a trained
extractive reader (:mod:`effrag.models.reader`), getting an answer ``g`` and a
confidence logit ``f``:

- ``[Unsolved Query]``: *completion*. ``g`` and ``d`` go back to the LLM, whatever ``f`` is.
- ``f > theta`` and ``g`` does not occur in the LLM's answer: *verification*. The
  correction goes back to the LLM.
- otherwise the node passes (the LLM's answer is kept, ``d`` is its support).

Feedback ends the round; the LLM answers it with a new CoQ (the conversation
continues). When a CoQ passes entirely, or after ``max_rounds``, *tracing* asks the
LLM for the final content from the recorded (query, answer) pairs, and its
``[k]`` marks become ``[Reference: <doc id>]`` of the node's document.
``retrieved`` lists the documents of the recorded nodes, in order.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from effrag.prompts import load_prompt

from .answers import parse_answer
from .base import register_pipeline
from .llm_common import LLMMethod, Session, add_llm_args, same_answer
from .result import Result

DEFAULT_READER = "reader-all"  # the shipped reader (effrag.pretrained)
_LINE = re.compile(r"^\[(Query|Answer|Unsolved Query|Final Content|Question)\s*(\d*)\]\s*:?\s*(.*)$", re.I)
_MARK = re.compile(r"\[(\d+)\]")


@dataclass
class Node:
    query: str
    answer: str | None = None
    unsolved: bool = False


@dataclass
class Feedback:
    """What IR says about one node: ``kind`` is ``pass``, ``verify`` or ``complete``."""

    kind: str
    node: Node
    doc: Any  # the top-1 Hit
    reader_answer: str
    confidence: float
    message: str = ""

    @property
    def recorded_answer(self) -> str:
        return (self.node.answer or "") if self.kind == "pass" else self.reader_answer


@dataclass
class CoQ:
    nodes: list[Node] = field(default_factory=list)
    final_content: str | None = None
    raw: str = ""


def _strip(s: str) -> str:
    return s.strip().strip('"').strip()


def parse_coq(text: str) -> CoQ:
    """Nodes of a Chain-of-Query generation; the template's "If you (don't) know" lines are ignored."""
    coq = CoQ(raw=text or "")
    for raw in (text or "").splitlines():
        m = _LINE.match(raw.strip())
        if not m:
            if coq.final_content is not None and raw.strip():
                coq.final_content += " " + raw.strip()
            continue
        kind, num, value = m.group(1).lower(), m.group(2), _strip(m.group(3))
        if kind == "query" and value:
            coq.nodes.append(Node(value))
        elif kind == "unsolved query" and value:
            same = [n for n in coq.nodes if n.query.lower() == value.lower()]
            if same:
                same[-1].unsolved = same[-1].answer is None
            else:
                coq.nodes.append(Node(value, unsolved=True))
        elif kind == "answer" and value:
            idx = int(num) - 1 if num else len(coq.nodes) - 1
            target = coq.nodes[idx] if 0 <= idx < len(coq.nodes) else (coq.nodes[-1] if coq.nodes else None)
            if target is not None and target.answer is None:
                target.answer, target.unsolved = value, False
        elif kind == "final content":
            coq.final_content = value
    for n in coq.nodes:
        if n.answer is None:
            n.unsolved = True  # a query the LLM left unanswered is an unsolved one
    return coq


def load_reader(reader: Any):
    """SearChain's verifier: a reader or reader-vote folder, a shipped reader's name (default ``reader-all``), or a
    loaded reader."""
    if reader is None or isinstance(reader, (str, Path)):
        from effrag.models import load_reader as open_reader

        return open_reader(reader or DEFAULT_READER)
    if not hasattr(reader, "predict"):
        raise TypeError(f"reader must be a checkpoint path or an ExtractiveReader, got {type(reader).__name__}")
    return reader


@register_pipeline("searchain")
class SearChain(LLMMethod):
    default_max_tokens = 256
    uses_reader = True  # its verifier: effrag eval --reader DIR|NAME (default the shipped reader-all)

    def __init__(self, retriever, k: int = 1, llm: Any = "default", dataset: str | None = None,
                 reader: Any = DEFAULT_READER, theta: float = 1.5, max_rounds: int = 3, **kw: Any):
        super().__init__(retriever, k=k, llm=llm, dataset=dataset, **kw)
        self.reader = load_reader(reader)
        self.theta, self.max_rounds = theta, max_rounds
        self.prompts = load_prompt("methods/searchain")

    @classmethod
    def add_args(cls, parser) -> None:
        add_llm_args(parser)
        parser.add_argument("--theta", type=float, default=1.5, help="reader confidence threshold (paper: 1.5)")
        parser.add_argument("--max-rounds", type=int, default=3, help="r_max: LLM-IR interaction rounds")

    # ------------------------------------------------------------- prompts
    def chain_prompt(self, question: str) -> str:
        p = self.prompts
        examples = "\n".join(e["text"] for e in p.examples(self.dataset))
        return p.fill("chain", question=question, examples=examples)

    @staticmethod
    def doc_text(hit) -> str:
        return f"{hit.title}: {hit.text}" if getattr(hit, "title", "") else hit.text

    # ------------------------------------------------------------- IR side (Algorithm 1, function IR)
    def check_node(self, question: str, node: Node, session: Session | None = None) -> Feedback:
        """Retrieve the top-1 document for the node, read it, and decide pass / verify / complete."""
        hits = self.search([node.query], 1, session)[0]
        if not hits:
            return Feedback("pass", node, None, "", float("-inf"))
        doc = hits[0]
        ra = self.reader.predict([node.query], [doc.text])[0]
        return self.decide(question, node, doc, ra.answer, ra.confidence)

    def decide(self, question: str, node: Node, doc, g: str, f: float) -> Feedback:
        p = self.prompts
        if node.unsolved:
            msg = p.fill("complete", query=node.query, answer=g, question=question, reference=self.doc_text(doc))
            return Feedback("complete", node, doc, g, f, msg)
        if f > self.theta and g and not same_answer(g, node.answer or ""):
            msg = p.fill("verify", query=node.query, answer=g, question=question, reference=self.doc_text(doc))
            return Feedback("verify", node, doc, g, f, msg)
        return Feedback("pass", node, doc, g, f)

    def traverse(self, question: str, coq: CoQ, processed: set[str], record: list[Feedback],
                 session: Session | None = None) -> Feedback | None:
        """Algorithm 1, function Traverse: the first non-pass feedback, or None ("Finish")."""
        for node in coq.nodes:
            key = " ".join(node.query.lower().split())
            if key in processed:
                continue
            processed.add(key)
            fb = self.check_node(question, node, session)
            if fb.doc is not None:
                record.append(fb)
            if fb.kind != "pass":
                return fb
        return None

    # ------------------------------------------------------------- main loop
    def run(self, question: str) -> Result:
        s = self.session(question)
        messages = [{"role": "user", "content": self.chain_prompt(question)}]
        processed: set[str] = set()
        record: list[Feedback] = []
        rounds, failures, coq, events = 0, 0, CoQ(), []
        while rounds < self.max_rounds:
            gen = s.ask(messages)
            rounds += 1
            messages.append({"role": "assistant", "content": gen})
            coq = parse_coq(gen)
            if not coq.nodes:
                failures += 1
                events.append({"round": rounds, "nodes": 0, "feedback": "none (no [Query] nodes)"})
                break
            fb = self.traverse(question, coq, processed, record, s)
            events.append({"round": rounds, "nodes": len(coq.nodes),
                           "feedback": fb.kind if fb else "finish",
                           "node": fb.node.query if fb else None,
                           "reader": {"answer": fb.reader_answer, "confidence": fb.confidence} if fb else None})
            if fb is None:
                break
            messages.append({"role": "user", "content": fb.message})
        answer, content, refs, ok = self.trace_answer(s, question, record, coq)
        failures += 0 if ok else 1
        hits = [fb.doc for fb in record]
        return s.result(hits, answer, iterations=rounds, parse_failures=failures,
                        trace={"rounds": events, "final_content": content, "references": refs,
                               "nodes": [{"query": fb.node.query, "answer": fb.recorded_answer, "kind": fb.kind,
                                          "doc": fb.doc.id, "confidence": fb.confidence} for fb in record]})

    def trace_answer(self, s, question: str, record: list[Feedback], coq: CoQ) -> tuple[str, str, list, bool]:
        """Tracing: final content from the recorded pairs, ``[k]`` marks turned into document references."""
        if record:
            pairs = "\n".join(f"[Query {i}]: {fb.node.query}\n[Answer {i}]: {fb.recorded_answer}"
                              for i, fb in enumerate(record, 1))
            p = self.prompts
            content = s.ask(p.fill("trace", question=question, pairs=pairs))
            content = re.sub(r"^\s*\[Final Content\]\s*:?\s*", "", content.strip(), flags=re.I)
        else:
            content = coq.final_content or ""
        refs = []

        def ref(m: re.Match) -> str:
            i = int(m.group(1)) - 1
            if 0 <= i < len(record):
                refs.append({"mark": m.group(0), "doc": record[i].doc.id, "title": record[i].doc.title})
                return f"[Reference: {record[i].doc.id}]"
            return m.group(0)

        answer, ok = parse_answer(_MARK.sub("", content), "sentence")
        if not ok:  # fall back to the last CoQ's final content, the last recorded node, the last generation
            alt, alt_ok = parse_answer(_MARK.sub("", coq.final_content), "sentence") if coq.final_content \
                else ("", False)
            if alt_ok:
                answer = alt
            elif record:
                answer = record[-1].recorded_answer
            else:
                answer = parse_answer(_MARK.sub("", coq.raw), "sentence")[0]
        return answer, _MARK.sub(ref, content), refs, ok
