"""Reading the short answer out of an LLM generation: :func:`parse_answer`, used by every method.

Prompts ask for the answer in one of three forms, and small models often miss it, so the
parser knows the form the prompt asked for and what to fall back to:

* ``form="json"``: ``{"answer": ...}`` in JSON (the retrieval-QA prompts of Tables 14-16, Direct,
  CoT, Decompose-R, Iter-RetGen). Stated when a complete JSON object has a non-empty ``answer``.
  Otherwise, in order: with ``sentences``, a ``So the answer is X`` sentence in a JSON ``thought``,
  or (when the text has no ``"answer":`` field) anywhere in the text; a JSON ``answer`` that is
  empty gives ""; a cut-off ``"answer": "...`` field; JSON without an answer gives ""; the first
  line after ``Answer:`` / ``The answer is:``; the first line. Echoed prompt tags (``<doc>``) and
  code fences are skipped. ``sentences=False`` is how the shared retrieval-QA generator has
  always read its answers (its prompt has no thought to state an answer in).
* ``form="sentence"``: ``So the final answer is: X`` (Self-Ask, SearChain, MCR), ``... answer is: X``
  (IRCoT's and CoT chains), ``Answer: X``; the last occurrence wins (a chain may restate). Else the
  whole generation, IRCoT's rule for readers that do not end in "answer is".
* ``form="line"``: the answer alone on the first line, after an optional ``A:`` label (IRCoT's
  direct reader). Else the whole generation.

It returns ``(answer, stated)``: ``stated`` is False when the answer came from a fallback, which
the methods count as ``parse_failures``.
"""
from __future__ import annotations

import re
from typing import Any

from effrag.llm import JSONParseError, parse_json_loose

FORMS = ("json", "sentence", "line")

_STATED = [
    re.compile(r"so the final answer is\s*[:\-]?\s*(.+)", re.I),
    re.compile(r"\banswer is\s*[:\-]?\s*(.+)", re.I),
    re.compile(r"(?<!intermediate )\banswer\s*:\s*(.+)", re.I),
]
_ANSWER_FIELD_NAME = re.compile(r"[\"']answer[\"']\s*:", re.I)
_ANSWER_FIELD = re.compile(r"""["']answer["']\s*:\s*(?:"((?:[^"\\]|\\.)*)"?|'([^']*)'?|([^,}\n]+))""", re.I)
_ANSWER_LEAD = re.compile(r"(?:<answer>|\banswer\b)[^:\n]{0,40}?:", re.I)  # "Answer:", "The answer to it is:"
_NOISE = re.compile(r"</?doc>|</?answer>|```(?:json)?", re.I)  # prompt tags and fences the model echoes
_LINE_LABEL = re.compile(r"^\s*A\s*:\s*")
_ABBREVIATION_END = re.compile(r"\b[A-Z]\.$|\b(?:Jr|Sr|St|Inc|Co|Ltd|M\.D)\.$")


def parse_answer(text: str | None, form: str = "json", *, sentences: bool = True) -> tuple[str, bool]:
    """``(answer, stated)`` of a generation in the ``form`` its prompt asked for (see the module doc)."""
    text = text or ""
    if form == "sentence":
        stated = _stated_answer(text)
        return (stated, True) if stated else (" ".join(text.split()), False)
    if form == "line":
        answer = clean_answer(_LINE_LABEL.sub("", text))
        return (answer, True) if answer else (" ".join(text.split()), False)
    if form != "json":
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    if not text.strip():
        return "", False
    obj = _json_object(text)
    if obj is not None and obj.get("answer") not in (None, ""):
        return _json_value(obj["answer"]), True
    if sentences:
        if obj is not None and isinstance(obj.get("thought"), str):
            stated = _stated_answer(obj["thought"])
            if stated:
                return stated, False
        if not _ANSWER_FIELD_NAME.search(text):
            stated = _stated_answer(text)
            if stated:
                return stated, False
    return _tolerant_answer(text, obj), False


def clean_answer(span: str) -> str:
    """The first line of an answer span, without quotes, brackets, markdown, citation marks ``[1]`` or a
    trailing full stop (kept after an initial or an abbreviation such as ``Jr.``)."""
    line = span.strip().splitlines()[0] if span.strip() else ""
    line = line.strip().strip("*`").strip().strip("\"'").rstrip("}").strip().strip("\"'").strip()
    line = re.sub(r"\s*\[\d+\]", "", line)
    if line.endswith(".") and not _ABBREVIATION_END.search(line):
        line = line[:-1]
    return line.strip().strip("\"'").strip()


def _stated_answer(text: str) -> str:
    """The cleaned answer of the last ``... answer is: X`` / ``Answer: X`` sentence, or ""."""
    for pat in _STATED:
        hits = list(pat.finditer(text))
        if hits:
            answer = clean_answer(hits[-1].group(1))
            if answer:
                return answer
    return ""


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        return parse_json_loose(text)
    except JSONParseError:
        return None


def _json_value(val: Any) -> str:
    if isinstance(val, list):
        return ", ".join(str(v) for v in val).strip()
    return ("" if val is None else str(val)).strip()


def _tolerant_answer(text: str, obj: dict[str, Any] | None) -> str:
    """The JSON answer however empty, a cut-off ``"answer":`` field, "" for JSON without an answer,
    else the first line after an ``Answer:`` lead, else the first line."""
    if obj is not None and "answer" in obj:
        return _json_value(obj["answer"])
    m = _ANSWER_FIELD.search(text)
    if m:
        val = next(g for g in m.groups() if g is not None)
        return val.replace('\\"', '"').strip().strip("\"'").strip()
    if obj is not None:  # JSON without an answer field (e.g. only a "thought")
        return ""
    m = _ANSWER_LEAD.search(text)
    rest = text[m.end():] if m else text
    for line in _NOISE.sub("\n", rest).splitlines():
        line = line.strip().strip("`\"'").strip()
        if line:
            return line
    return ""
