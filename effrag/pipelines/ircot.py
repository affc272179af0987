"""IRCoT (Trivedi et al., 2023): interleave one chain-of-thought sentence with one retrieval.

Section 3.1: retrieve ``K`` paragraphs for the question; then alternate (i)
*reason*: with all paragraphs collected so far and the CoT so far, generate and
keep only the first new sentence, and (ii) *retrieve*: ``K`` paragraphs for that
sentence, added to the collection (capped at 15 paragraphs in total). Stop when
the sentence contains "answer is" or after ``max_steps`` (8 in the paper). Section
3.2: a separate reader answers from the collected paragraphs with Direct or CoT
prompting (``--reader-prompt``); a CoT reader's answer is read from "answer is: X", and a
generation without it is taken whole as the answer (counted in ``parse_failures``).

Demonstrations show each demo question's gold paragraphs plus ``M`` distractors
(``--distractors``) from the same TRAIN record (see ``prompts/methods/ircot.yaml``).
When the prompt would not fit the model's context, demonstrations are dropped
first, then paragraphs are shortened (recorded in the trace).
"""
from __future__ import annotations

import random
import re
from functools import cache
from typing import Any

from effrag.prompts import load_prompt
from effrag.text import normalize_answer

from .answers import parse_answer
from .base import register_pipeline
from .llm_common import LLMMethod, add_llm_args, first_sentence
from .result import Result

ANSWER_IS = re.compile(r"answer is", re.I)
READERS = ("direct", "cot")


@cache
def _train_records(dataset: str) -> dict:
    from effrag.data import load_questions, sample_path

    return {q.id: q for q in load_questions(sample_path(dataset, "train"))}


def demo_paragraphs(dataset: str, qid: str, m: int, seed: int = 0) -> list:
    """Gold paragraphs of TRAIN record ``qid`` plus ``m`` of its distractors, shuffled (seeded)."""
    records = _train_records(dataset)
    if qid not in records:
        raise KeyError(f"IRCoT demonstration {qid!r} is not in the bundled {dataset} train sample")
    q = records[qid]
    gold = {p.id for p in q.gold}
    rng = random.Random(f"{seed}:{qid}")
    distractors = [p for p in q.contexts if p.id not in gold]
    paras = list(q.gold) + rng.sample(distractors, min(m, len(distractors)))
    rng.shuffle(paras)
    return paras


def _trim(text: str, max_words: int | None) -> str:
    words = text.split()
    return text if max_words is None or len(words) <= max_words else " ".join(words[:max_words]) + " ..."


@register_pipeline("ircot")
class IRCoT(LLMMethod):
    default_max_tokens = 48

    def __init__(self, retriever, k: int = 4, llm: Any = "default", dataset: str | None = None,
                 distractors: int = 2, demos: int = 2, max_steps: int = 8, max_paragraphs: int = 15,
                 reader_prompt: str = "direct", reader_max_tokens: int | None = None, max_paragraph_words: int = 80,
                 context_chars: int | None = None, **kw: Any):
        super().__init__(retriever, k=k, llm=llm, dataset=dataset, **kw)
        if reader_prompt not in READERS:
            raise ValueError(f"reader_prompt must be one of {READERS}, got {reader_prompt!r}")
        self.m, self.n_demos, self.max_steps, self.max_paragraphs = distractors, demos, max_steps, max_paragraphs
        self.reader_prompt, self.max_paragraph_words = reader_prompt, max_paragraph_words
        self.reader_max_tokens = reader_max_tokens or (32 if reader_prompt == "direct" else 160)
        self.prompts = load_prompt("methods/ircot")
        n_ctx = getattr(self.llm, "n_ctx", None)
        # ~3 characters per token is a safe bound for English with these tokenizers
        self.context_chars = context_chars or (3 * (n_ctx - 200) if n_ctx else None)

    @classmethod
    def add_args(cls, parser) -> None:
        add_llm_args(parser)
        parser.add_argument("--distractors", type=int, default=2, help="M: distractor paragraphs per demonstration")
        parser.add_argument("--demos", type=int, default=2, help="demonstrations in the prompt (as many as fit)")
        parser.add_argument("--max-steps", type=int, default=8, help="reason-step cap (paper: 8)")
        parser.add_argument("--max-paragraphs", type=int, default=15, help="cap on collected paragraphs (paper: 15)")
        parser.add_argument("--reader-prompt", choices=READERS, default="direct", help="QA reader prompting")
        parser.add_argument("--max-paragraph-words", type=int, default=80, help="paragraph length in prompts")

    # ----------------------------------------------------------------- prompts
    def _paragraphs(self, paras: list, max_words: int | None) -> str:
        return "\n\n".join(self.prompts.fill("paragraph", title=p.title, text=_trim(p.text, max_words)) for p in paras)

    def build_prompt(self, question: str, paras: list, mode: str, partial: str = "",
                     n_demos: int | None = None, max_words: int | None = None) -> str:
        p, ds = self.prompts, self.dataset
        words = max_words if max_words is not None else self.max_paragraph_words
        demos = []
        for ex in p.examples(ds)[: self.n_demos if n_demos is None else n_demos]:
            demo_paras = demo_paragraphs(p.dataset_key(ds), ex["id"], self.m, self.seed)
            demos.append(p.fill("example", mode, paragraphs=self._paragraphs(demo_paras, words),
                                question=ex["question"], cot=ex["cot"], answer=ex["answer"]))
        query = p.fill("query", paragraphs=self._paragraphs(paras, words), question=question, partial=partial)
        return "\n\n\n".join([p.text("instruction", mode), *demos, query])

    def fit_prompt(self, question: str, paras: list, mode: str, partial: str = "") -> tuple[str, dict]:
        """The prompt, with demonstrations dropped and then paragraphs shortened until it fits the context."""
        n, words = self.n_demos, self.max_paragraph_words
        prompt = self.build_prompt(question, paras, mode, partial, n, words)
        while self.context_chars and len(prompt) > self.context_chars and (n > 0 or words > 20):
            if n > 0:
                n -= 1
            else:
                words = max(20, words * 2 // 3)
            prompt = self.build_prompt(question, paras, mode, partial, n, words)
        return prompt, {"demos": n, "paragraph_words": words}

    # ----------------------------------------------------------------- loop
    def next_sentence(self, generation: str, cot: list[str]) -> str:
        """First sentence of the generation that is not a repeat of the CoT so far."""
        text = re.sub(r"^\s*A\s*:\s*", "", generation or "").split("\n\n")[0]
        done = {normalize_answer(c) for c in cot}
        while text.strip():
            sent = first_sentence(text)
            if normalize_answer(sent) not in done:
                return sent
            text = " ".join(text.split())[len(sent):].strip()
        return ""

    def add_paragraphs(self, collected: list, hits: list) -> int:
        have, added = {p.id for p in collected}, 0
        for h in hits:
            if len(collected) >= self.max_paragraphs:
                break
            if h.id not in have:
                collected.append(h)
                have.add(h.id)
                added += 1
        return added

    def run(self, question: str) -> Result:
        s = self.session(question)
        collected: list = []
        self.add_paragraphs(collected, self.search([question], session=s)[0])
        cot: list[str] = []
        steps, stop, fits = [], "max steps", []
        for _ in range(self.max_steps):
            partial = (" " + " ".join(cot)) if cot else ""
            prompt, fit = self.fit_prompt(question, collected, "cot", partial)
            fits.append(fit)
            gen = s.ask(prompt, stop=["\n\n", "Wikipedia Title:", "\nQ:"])
            sent = self.next_sentence(gen, cot)
            if not sent:
                stop = "no new sentence"
                break
            cot.append(sent)
            if ANSWER_IS.search(sent):
                steps.append({"sentence": sent, "added": 0})
                stop = "answer is"
                break
            added = self.add_paragraphs(collected, self.search([sent], session=s)[0])
            steps.append({"sentence": sent, "added": added})
        prompt, fit = self.fit_prompt(question, collected, self.reader_prompt)
        fits.append(fit)
        raw = s.ask(prompt, max_tokens=self.reader_max_tokens, stop=["\n\n", "Wikipedia Title:", "\nQ:"])
        # a CoT reader states "answer is: X"; a direct reader writes the answer alone after "A:"
        answer, ok = parse_answer(raw, "sentence" if self.reader_prompt == "cot" else "line")
        return s.result(collected, answer, iterations=len(cot), parse_failures=0 if ok else 1,
                        trace={"cot": cot, "steps": steps, "stop_reason": stop, "reader_output": raw,
                               "prompt_fit": fits})
