"""Multi-Chain Reasoning (Yoran et al., 2023) and its baselines SC@k and SCR.

Decomposition chains are Self-Ask chains with retrieval (section 3.1): each
intermediate question retrieves its top-1 evidence, which is prepended to the
chain as ``ContextN: <title>: <snippet>`` together with the evidence retrieved
for the original question, and the LLM then writes the intermediate answer. One
chain is decoded greedily and ``chains - 1`` more are sampled at temperature 0.7.

- ``mcr``: the meta-reasoner reads the (question, answer) pairs of all chains as
  its multi-chain context and writes an explanation and ``So the answer is: X``.
- ``scr``: the same meta-reasoner with the greedy chain only (one chain is built).
- ``sc``: self-consistency, the majority final answer over the chains (no
  meta-reasoner); chains without a final answer or answering "Unknown" do not vote.
"""
from __future__ import annotations

import random
from collections import Counter
from typing import Any

from effrag.prompts import load_prompt
from effrag.text import normalize_answer

from .answers import parse_answer
from .base import register_pipeline
from .llm_common import LLMMethod, add_llm_args
from .result import Result
from .self_ask import STOP, Chain, run_chain

MODES = ("mcr", "scr", "sc")


def _snippet(hit, words: int) -> str:
    w = hit.text.split()
    return f"{hit.title}: {' '.join(w[:words])}{' ...' if len(w) > words else ''}"


def majority_answer(answers: list[str | None]) -> tuple[str | None, Counter]:
    """Most frequent normalised answer (ties: the earliest chain's); None/empty/"unknown" do not vote."""
    votes = [(normalize_answer(a), a) for a in answers if a and normalize_answer(a) not in ("", "unknown")]
    counts = Counter(n for n, _ in votes)
    if not counts:
        return None, counts
    best = max(counts.values())
    for n, a in votes:
        if counts[n] == best:
            return a, counts
    return None, counts


@register_pipeline("mcr")
class MCR(LLMMethod):
    default_max_tokens = 96

    def __init__(self, retriever, k: int = 1, llm: Any = "default", dataset: str | None = None,
                 mode: str = "mcr", chains: int = 5, sample_temperature: float = 0.7, max_follow_ups: int = 4,
                 retrieve_question: bool = True, snippet_words: int = 60, meta_max_tokens: int = 128,
                 n_examples: int | None = None, **kw: Any):
        super().__init__(retriever, k=k, llm=llm, dataset=dataset, **kw)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if chains < 1:
            raise ValueError(f"chains must be >= 1, got {chains}")
        self.mode, self.n_chains = mode, (1 if mode == "scr" else chains)
        self.sample_temperature, self.max_follow_ups = sample_temperature, max_follow_ups
        self.retrieve_question, self.snippet_words = retrieve_question, snippet_words
        self.meta_max_tokens, self.n_examples = meta_max_tokens, n_examples
        self.prompts = load_prompt("methods/mcr")

    @classmethod
    def add_args(cls, parser) -> None:
        add_llm_args(parser)
        parser.add_argument("--mode", choices=MODES, default="mcr", help="mcr, scr (greedy chain only) or sc (vote)")
        parser.add_argument("--chains", type=int, default=5, help="reasoning chains (1 greedy + samples at t=0.7)")
        parser.add_argument("--max-follow-ups", type=int, default=4, help="step cap per chain")
        parser.add_argument("--snippet-words", type=int, default=60, help="evidence snippet length")
        parser.add_argument("--n-examples", type=int, default=None, help="exemplars per prompt (default: all)")

    # ------------------------------------------------------------- prompts
    def decompose_prompt(self, question: str, evidence: list, chain: Chain) -> str:
        p = self.prompts
        contexts = "\n".join(f"Context{i}: {_snippet(h, self.snippet_words)}" for i, h in enumerate(evidence, 1))
        return "\n".join([p.text("decompose_instruction"),
                          p.render_examples(self.dataset, self.n_examples, "decompose_example", "decompose_examples",
                                            sep="\n"),
                          p.fill("decompose_query", contexts=contexts, question=question, partial=chain.partial())])

    def meta_prompt(self, question: str, context: str) -> str:
        p = self.prompts
        return "\n".join([p.text("meta_instruction"),
                          p.render_examples(self.dataset, self.n_examples, "meta_example", "meta_examples", sep="\n"),
                          p.fill("meta_query", context=context, question=question)])

    def multi_chain_context(self, chains: list[Chain]) -> str:
        pairs = [f"{st.question} {st.answer}" for c in chains for st in c.steps if st.answer]
        if len(chains) > 1:
            random.Random(self.seed).shuffle(pairs)  # the paper's contexts mix the chains' steps
        return "\n".join(pairs)

    # ------------------------------------------------------------- run
    def build_chain(self, s, question: str, base_evidence: list, temperature: float, seed: int) -> Chain:
        def render(chain: Chain) -> str:
            return self.decompose_prompt(question, base_evidence + chain.hits, chain)

        return run_chain(lambda prompt: s.ask(prompt, stop=STOP, temperature=temperature, seed=seed), render,
                         lambda q: self.search([q], 1, s)[0], self.max_follow_ups)

    def run(self, question: str) -> Result:
        s = self.session(question)
        base = self.search([question], 1, s)[0] if self.retrieve_question else []
        chains = [self.build_chain(s, question, base, 0.0 if i == 0 else self.sample_temperature, self.seed + i)
                  for i in range(self.n_chains)]
        failures = sum(1 for c in chains if not c.final)
        trace: dict[str, Any] = {"mode": self.mode,
                                 "chains": [{"text": c.partial(), "final": c.final, "stop_reason": c.stop_reason}
                                            for c in chains]}
        if self.mode == "sc":
            answer, counts = majority_answer([c.final for c in chains])
            trace["votes"] = dict(counts)
            if answer is None:
                answer = chains[0].answer
        else:
            context = self.multi_chain_context(chains)
            raw = s.ask(self.meta_prompt(question, context), max_tokens=self.meta_max_tokens, stop=["\n#"])
            answer, ok = parse_answer(raw, "sentence")
            failures += 0 if ok else 1
            trace.update({"context": context, "meta_output": raw})
        hits = base + [h for c in chains for h in c.hits]
        return s.result(hits, answer, iterations=sum(len(c.steps) for c in chains), parse_failures=failures,
                        trace=trace)
