"""Retrieval and answer metrics.

``recall`` is the EfficientRAG paper's retrieval Recall: the fraction of a
question's gold passages found among the retrieved ones. The answer metrics use
the HotpotQA/SQuAD answer normalisation (lower-case, drop punctuation and the
articles a/an/the, collapse whitespace) and take the best score over all gold
answer aliases.

F1 follows each dataset's official script (``answer_rule``): HotpotQA's ``hotpot_evaluate_v1.py``
(also 2WikiMultihopQA's): a yes/no/noanswer answer gets no partial credit; MuSiQue's
``metrics/answer.py`` (SQuAD 2.0's rule): no such special case, and two answers that both
normalise to nothing score 1.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from effrag.text import normalize_answer  # re-exported: effrag.evaluation.normalize_answer

_SPECIAL = {"yes", "no", "noanswer"}
ANSWER_RULES = ("hotpotqa", "musique")
DATASET_ANSWER_RULE = {"musique": "musique"}  # every other dataset: the HotpotQA rule


def answer_rule(dataset: str | None) -> str:
    """The official F1 rule of ``dataset``'s own evaluation script."""
    return DATASET_ANSWER_RULE.get(str(dataset or "").lower(), "hotpotqa")


def recall(retrieved_ids: Iterable[str], gold_ids: Iterable[str]) -> float:
    """Fraction of distinct gold ids that appear in ``retrieved_ids`` (1.0 for no gold: nothing to miss)."""
    gold = set(gold_ids)
    if not gold:
        return 1.0
    return len(gold & set(retrieved_ids)) / len(gold)


def _aliases(answers: str | Iterable[str]) -> list[str]:
    return [answers] if isinstance(answers, str) else list(answers)


def exact_match(prediction: str, answers: str | Iterable[str]) -> float:
    """1.0 if the normalised prediction equals some normalised gold answer."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(a) for a in _aliases(answers)))


def _f1_one(prediction: str, gold: str, rule: str = "hotpotqa") -> float:
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    if rule == "hotpotqa":
        # HotpotQA's rule: a yes/no/noanswer answer must match exactly, no partial credit.
        if (pred in _SPECIAL or ref in _SPECIAL) and pred != ref:
            return 0.0
    elif rule == "musique":
        if not pred.split() or not ref.split():  # SQuAD 2.0: no-answer agrees only with no-answer
            return float(pred.split() == ref.split())
    else:
        raise ValueError(f"unknown answer rule {rule!r}; expected one of {', '.join(ANSWER_RULES)}")
    common = Counter(pred.split()) & Counter(ref.split())
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, rec = same / len(pred.split()), same / len(ref.split())
    return 2 * precision * rec / (precision + rec)


def f1(prediction: str, answers: str | Iterable[str], rule: str = "hotpotqa") -> float:
    """Token-level F1 against the best-matching alias, by the official ``rule`` (:func:`answer_rule`)."""
    return max((_f1_one(prediction, a, rule) for a in _aliases(answers)), default=0.0)


def cover_em(prediction: str, answers: str | Iterable[str]) -> float:
    """1.0 if some normalised gold answer occurs in the normalised prediction (as whole words)."""
    pred = f" {normalize_answer(prediction)} "
    return float(any(normalize_answer(a) and f" {normalize_answer(a)} " in pred for a in _aliases(answers)))
