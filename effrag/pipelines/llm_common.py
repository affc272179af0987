"""Shared parts of the LLM-based methods (Direct, CoT, Decompose-R, Iter-RetGen, Self-Ask, IRCoT,
SearChain, MCR): prompt sets, per-question LLM accounting, answer extraction and the base class.

Prompts are data: ``effrag/prompts/methods/<method>.yaml`` holds each method's
instruction, example/query templates (``str.format`` syntax; every field ``x``
is also offered as ``x_json``, its JSON encoding) and few-shot examples per
dataset (``hotpotqa``, ``2wikimqa``, ``musique``). Other datasets (Bamboogle,
StrategyQA) use the file's ``fallback`` set. README.md in that folder gives
each file's source.

Every method returns the MethodOutput fields plus ``parse_failures``: how many
generations did not have the expected form and were handled the way the paper
does (e.g. the whole generation taken as the answer).
"""
from __future__ import annotations

import json
import re
import string
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import yaml

from .base import Pipeline

METHODS_DIR = Path(__file__).resolve().parent.parent / "prompts" / "methods"
PROMPT_DATASETS = ("hotpotqa", "2wikimqa", "musique")


# ------------------------------------------------------------------ prompt sets

class _Fields(dict):
    """Format mapping that offers ``x_json`` for every field ``x`` and names missing keys."""

    def __init__(self, where: str, values: dict[str, Any]):
        super().__init__(values)
        self.where = where

    def __missing__(self, key: str) -> str:
        if key.endswith("_json") and key[:-5] in self:
            return json.dumps(self[key[:-5]], ensure_ascii=False)
        raise KeyError(f"{self.where}: template needs field {key!r}, have {sorted(self)}")


def fill(template: str, where: str = "template", **values: Any) -> str:
    """``template.format(**values)`` with ``x_json`` fields; braces inside values are left alone."""
    return string.Formatter().vformat(template, (), _Fields(where, values))


@dataclass
class PromptSet:
    """One ``<method>.yaml`` file."""

    name: str
    data: dict[str, Any]
    path: Path

    def dataset_key(self, dataset: str | None, section: str = "examples") -> str:
        sets = self.data.get(section) or {}
        if dataset in sets:
            return dataset
        fallback = self.data.get("fallback")
        if fallback not in sets:
            raise ValueError(f"{self.path}: no {section} for dataset {dataset!r} and fallback {fallback!r} "
                             f"is not one of {sorted(sets)}")
        return fallback

    def examples(self, dataset: str | None, section: str = "examples") -> list[dict[str, Any]]:
        """The few-shot examples for ``dataset`` (a copy), or the fallback set."""
        return [dict(e) for e in self.data[section][self.dataset_key(dataset, section)]]

    def text(self, key: str, variant: str | None = None) -> str:
        """A template; a dict-valued key is looked up by ``variant`` (dataset or mode), else ``default``."""
        if key not in self.data:
            raise KeyError(f"{self.path}: no field {key!r}")
        val = self.data[key]
        if isinstance(val, dict):
            if variant in val:
                return val[variant]
            if "default" in val:
                return val["default"]
            raise KeyError(f"{self.path}: field {key!r} has no entry for {variant!r} and no 'default'")
        return val

    def render_examples(self, dataset: str | None, n: int | None = None, template_key: str = "example",
                        section: str = "examples", variant: str | None = None, sep: str = "\n\n") -> str:
        exs = self.examples(dataset, section)[: n if n is not None else None]
        tmpl = self.text(template_key, variant)
        return sep.join(fill(tmpl, f"{self.path}:{template_key}", **e) for e in exs)


@lru_cache(maxsize=None)
def load_prompt_set(name: str) -> PromptSet:
    path = METHODS_DIR / f"{name}.yaml"
    if not path.is_file():
        have = sorted(p.stem for p in METHODS_DIR.glob("*.yaml"))
        raise FileNotFoundError(f"no prompt set {name!r} in {METHODS_DIR}; available: {', '.join(have)}")
    with path.open(encoding="utf-8") as f:
        data = yaml.safe_load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    return PromptSet(name, data, path)


# ------------------------------------------------------------------ answer extraction

_FINAL = [
    re.compile(r"so the final answer is\s*[:\-]?\s*(.+)", re.I),
    re.compile(r"\banswer is\s*[:\-]?\s*(.+)", re.I),
    re.compile(r"(?<!intermediate )\banswer\s*:\s*(.+)", re.I),
]
_SENT_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\[])")


def clean_answer(text: str) -> str:
    """First line of a span, without quotes, brackets, markdown or a trailing full stop."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    line = line.strip().strip("*`").strip().strip("\"'").rstrip("}").strip().strip("\"'").strip()
    line = re.sub(r"\s*\[\d+\]", "", line)  # citation marks like [1]
    if line.endswith(".") and not re.search(r"\b[A-Z]\.$|\b(?:Jr|Sr|St|Inc|Co|Ltd|M\.D)\.$", line):
        line = line[:-1]
    return line.strip().strip("\"'").strip()


def extract_answer(text: str) -> tuple[str, bool]:
    """The answer stated in a generation and whether it was stated in a recognised form.

    Recognised, in order: ``So the final answer is: X`` (Self-Ask, SearChain, MCR),
    ``... answer is: X`` / ``answer is X`` (IRCoT, CoT), ``Answer: X``. The last
    occurrence wins (a chain may restate). Otherwise ``(whole generation, False)``,
    IRCoT's rule for readers that do not end in "answer is:".
    """
    for pat in _FINAL:
        hits = list(pat.finditer(text or ""))
        if hits:
            ans = clean_answer(hits[-1].group(1))
            if ans:
                return ans, True
    return " ".join((text or "").split()), False


def json_answer(text: str) -> tuple[str, bool]:
    """Answer of a JSON-format generation (EfficientRAG prompts): ``(answer, parsed)``.

    ``parsed`` is True only for a complete JSON object with an ``answer`` key. Otherwise the
    answer comes from the tolerant reader shared with Direct-R (unterminated JSON, ``Answer:``
    lines, first line), or from a ``So the answer is X`` sentence in a thought.
    """
    from effrag.llm import JSONParseError, parse_json_loose

    from .generation import parse_answer

    try:
        obj = parse_json_loose(text or "")
    except JSONParseError:
        obj = None
    if isinstance(obj, dict) and obj.get("answer") not in (None, ""):
        val = obj["answer"]
        return (", ".join(map(str, val)) if isinstance(val, list) else str(val)).strip(), True
    if isinstance(obj, dict) and isinstance(obj.get("thought"), str):
        ans, ok = extract_answer(obj["thought"])
        if ok:
            return ans, False
    if re.search(r"[\"']answer[\"']\s*:", text or "", re.I):
        return parse_answer(text), False
    ans, ok = extract_answer(text or "")
    return (ans if ok else parse_answer(text or "")), False


def first_sentence(text: str) -> str:
    """The first sentence of a generation (IRCoT keeps one CoT sentence per reason-step)."""
    t = " ".join((text or "").split())
    if not t:
        return ""
    parts = _SENT_END.split(t, maxsplit=1)
    return parts[0].strip()


def same_answer(a: str, b: str) -> bool:
    """SearChain's consistency test for short answers: the normalised ``a`` occurs inside ``b``."""
    from effrag.evaluation.metrics import normalize_answer

    na, nb = normalize_answer(a), normalize_answer(b)
    return bool(na) and (na in nb or (bool(nb) and nb in na and len(nb) >= 0.6 * len(na)))


# ------------------------------------------------------------------ LLM accounting

@dataclass
class Session:
    """Per-question LLM usage: every call through here is counted (cached calls included)."""

    llm: Any
    max_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    llm_seconds: float = 0.0
    log: list[dict[str, Any]] = field(default_factory=list)

    def chat(self, messages: str | Sequence[dict[str, str]], **kw: Any) -> list:
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        kw.setdefault("max_tokens", self.max_tokens)
        kw.setdefault("temperature", self.temperature)
        kw.setdefault("seed", self.seed)
        t0 = time.perf_counter()
        comps = self.llm.chat(list(messages), **kw)
        self.llm_seconds += time.perf_counter() - t0
        self.calls += 1
        self.prompt_tokens += sum(c.prompt_tokens for c in comps)
        self.completion_tokens += sum(c.completion_tokens for c in comps)
        self.log.append({"prompt_chars": sum(len(m["content"]) for m in messages),
                         "outputs": [c.text for c in comps], "temperature": kw["temperature"]})
        return comps

    def record(self, generation: Any) -> None:
        """Count a call made elsewhere (e.g. the shared :class:`~.generation.Generator`)."""
        self.calls += int(getattr(generation, "llm_calls", 1))
        self.prompt_tokens += int(getattr(generation, "prompt_tokens", 0))
        self.completion_tokens += int(getattr(generation, "completion_tokens", 0))
        self.llm_seconds += float(getattr(generation, "latency_s", 0.0))
        self.log.append({"prompt_chars": len(getattr(generation, "prompt", "")),
                         "outputs": [getattr(generation, "raw", "")], "temperature": None})

    def ask(self, prompt: str | Sequence[dict[str, str]], **kw: Any) -> str:
        return self.chat(prompt, **kw)[0].text

    def usage(self) -> dict[str, Any]:
        return {"llm_calls": self.calls, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens}


# ------------------------------------------------------------------ base class

def resolve_llm(llm: Any):
    """An :class:`effrag.llm.LLM` from an instance or a spec string (``default``, ``gguf:PATH``, ``openai:URL#M``)."""
    if llm is None:
        llm = "default"
    if isinstance(llm, str):
        from effrag.llm import load_llm

        return load_llm(llm)
    if not hasattr(llm, "chat"):
        raise TypeError(f"llm must be an effrag.llm.LLM or a spec string, got {type(llm).__name__}")
    return llm


def canonical_dataset(dataset: str | None) -> str | None:
    if dataset is None:
        return None
    from effrag.data.loaders import _ALIASES

    d = dataset.strip().lower()
    return _ALIASES.get(d, d)


class LLMMethod(Pipeline):
    """Base of the LLM-based methods: holds retriever, LLM, prompt dataset and generation settings."""

    retrieves = True
    default_max_tokens = 128

    def __init__(self, retriever=None, k: int = 5, llm: Any = "default", dataset: str | None = None,
                 max_tokens: int | None = None, temperature: float = 0.0, seed: int = 0,
                 prompt_dataset: str | None = None):
        if k <= 0:
            raise ValueError(f"k must be positive, got {k}")
        if self.retrieves and retriever is None:
            raise ValueError(f"method {self.name!r} needs a retriever")
        self.retriever, self.k = retriever, k
        self.llm = resolve_llm(llm)
        # few-shot set: --prompt-dataset if given, else the questions' dataset, else each file's fallback
        self.dataset = canonical_dataset(prompt_dataset or dataset)
        self.max_tokens = max_tokens or self.default_max_tokens
        self.temperature, self.seed = temperature, seed

    @classmethod
    def add_args(cls, parser) -> None:
        add_llm_args(parser)

    def session(self, max_tokens: int | None = None) -> Session:
        return Session(self.llm, max_tokens or self.max_tokens, self.temperature, self.seed)

    def search(self, queries: list[str], k: int | None = None) -> list[list]:
        return self.retriever.search([q if q.strip() else "?" for q in queries], k or self.k)

    def finish(self, session: Session, hits: Sequence, answer: str, *, iterations: int, parse_failures: int,
               t0: float, trace: dict[str, Any] | None = None) -> dict[str, Any]:
        """MethodOutput dict; ``hits`` are all chunks given to the LLM, in order (deduplicated here)."""
        seen: dict[str, float] = {}
        for h in hits:
            seen.setdefault(h.id, float(h.score))
        out = self.output(list(seen), list(seen.values()), answer, iterations=iterations,
                          trace={**(trace or {}), "llm_log": session.log}, **session.usage())
        out["parse_failures"] = parse_failures
        out["method_latency_s"] = round(time.perf_counter() - t0, 4)
        return out


def add_llm_args(parser) -> None:
    """Options shared by the LLM methods (``--llm`` only if the CLI does not define it already)."""
    have = getattr(parser, "_option_string_actions", {})
    if "--llm" not in have:
        parser.add_argument("--llm", default="default", metavar="SPEC",
                            help="LLM spec: default (SmolLM2 GGUF), gguf:PATH or openai:URL#MODEL")
    if "--prompt-dataset" not in have:
        parser.add_argument("--prompt-dataset", default=None, choices=PROMPT_DATASETS,
                            help="whose few-shot examples to use (default: the questions' dataset if the "
                                 "caller passes it, else the prompt file's fallback set)")
    if "--max-tokens" not in have:
        parser.add_argument("--max-tokens", type=int, default=None,
                            help="generation cap per LLM call (default: the method's)")
