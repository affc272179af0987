"""Extractive QA reader used by SearChain's IR verification and completion.

SearChain (Xu et al., 2023, section 3.3) checks each node ``(q_i, a_i)`` of a
Chain-of-Query against the top-1 retrieved document ``d_i`` with a reader that
returns an answer span ``g = d_i[s:e]`` (start/end heads over the last hidden
states of ``[CLS] q_i [SEP] d_i``) and a confidence ``f = H_[CLS] . w_f``. The
confidence is a logit: it is trained with binary cross-entropy on "does this
document answer this question", so the paper's threshold ``theta = 1.5`` means
P(answerable) > 0.82.

A third head on [CLS] classifies the answer type (span / yes / no), so the reader also answers
comparison questions whose answer is not in any text (HotpotQA's and 2Wiki's yes/no). It reads one
passage or several packed together (``"title: text"`` blocks): :meth:`ExtractiveReader.read`
reads a method's ranked chunks in windows and keeps the most confident window's answer, which makes
it an LLM-free answer generator for any retrieval method (``effrag eval --reader DIR``,
:class:`effrag.pipelines.generation.ReaderGenerator`).

The reader is an :class:`~effrag.models.heads.EncoderWithHeads` model like the
Labeler and the Filter (same checkpoint format, ``load_model`` opens it) and is
trained by the one training loop: task ``reader`` (:mod:`effrag.training.tasks.reader`,
which also builds its SQuAD-style examples from dataset files), ``configs/reader.yaml``.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from transformers.utils import ModelOutput

from ..text import PASSAGE_SEPARATOR, normalize_answer
from .heads import DEFAULT_OPTIONS, EncoderWithHeads
from .spans import span_band
from .tokenization import IGNORE  # a target the loss skips: spans of yes/no examples, types of no-answer ones

CONFIDENCE_THRESHOLD = 1.5  # SearChain's theta on f
MAX_ANSWER_TOKENS = 30
# Span decoding (ExtractiveReader options, so tuned values travel with the checkpoint; tuned on the dev
# files' oracle reading by scripts/tune_reader.py): spans of at most max_answer_tokens tokens, minus
# length_penalty per token after the first, minus question_echo_penalty when the span repeats the
# question's own words (echoes_question); yes_bias is added to the type head's "yes" logit (the train
# files hold far fewer yes than no answers: 54 against 141). Zeros reproduce plain argmax decoding.
DECODING_DEFAULTS = {"max_answer_tokens": MAX_ANSWER_TOKENS, "question_echo_penalty": 0.0, "length_penalty": 0.0,
                     "yes_bias": 0.0}
# How training marks a span answer (effrag.training.tasks.reader.featurize_reader): "first" marks only the
# occurrence the record names, so its other occurrences are trained as wrong spans; "all" marks every
# occurrence of the answer text and the span loss is their marginal likelihood. In HotpotQA's joint train
# records the answer occurs more than once in 45% of them (609 of 1,355), yet "all" read HotpotQA's dev
# oracle 1.3 F1 worse and 2Wiki / MuSiQue 2.1 / 1.2 better (reports/reader/README.md): "first" stays.
TRAINING_DEFAULTS = {"span_targets": "first"}
SPAN_TARGETS = ("all", "first")
_ALTERNATIVES = re.compile(r"\b(or|between)\b", re.IGNORECASE)
NEG = -1e4  # logit of padding positions
ANSWER_TYPES = ("span", "yes", "no")  # the type head's classes
YES_NO = ANSWER_TYPES[1:]  # the types answered without a span


@dataclass
class ReaderAnswer:
    """Best span of one (question, document) pair and the reader's confidence logit."""

    text: str
    confidence: float  # f, a logit of P(document answers the question)
    start: int  # character offsets into the document
    end: int
    span_score: float  # start logit + end logit of the chosen span
    answer_type: str = "span"  # the type head's choice: "span", "yes" or "no"

    @property
    def answer(self) -> str:
        """What the reader answers: "yes"/"no" when the type head says so, else the span."""
        return self.text if self.answer_type == "span" else self.answer_type

    def to_json(self) -> dict:
        return {**asdict(self), "answer": self.answer}


@dataclass
class ReaderOutput(ModelOutput):
    loss: torch.Tensor | None = None
    span_loss: torch.Tensor | None = None
    confidence_loss: torch.Tensor | None = None
    start_logits: torch.Tensor | None = None  # [B, T], padding at NEG
    end_logits: torch.Tensor | None = None
    confidence: torch.Tensor | None = None  # [B], the logit f
    type_loss: torch.Tensor | None = None
    type_logits: torch.Tensor | None = None  # [B, 3] over ANSWER_TYPES


def _mean_ce(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy averaged over the rows whose target is not IGNORE (0 when there are none)."""
    keep = target != IGNORE
    if not bool(keep.any()):
        return logits.sum() * 0.0
    return nn.functional.cross_entropy(logits[keep], target[keep])


def _marginal_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per row: minus the log of the total probability of the ``targets`` positions ([B, T] 0/1);
    rows without a target give 0 (see :func:`span_loss`)."""
    marked = targets.bool()
    has = marked.any(-1)
    marked = marked | (~has[:, None] & (torch.arange(marked.shape[-1], device=marked.device) == 0))  # no -inf rows
    gold = logits.float().masked_fill(~marked, float("-inf")).logsumexp(-1)
    nll = logits.float().logsumexp(-1) - gold
    return torch.where(has, nll, torch.zeros_like(nll))


def _one_hot(positions: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """[B, T] 0/1 targets marking each row's position; an IGNORE row marks none."""
    cols = torch.arange(logits.shape[-1], device=logits.device)
    return (cols[None, :] == positions[:, None]) & (positions != IGNORE)[:, None]


def span_loss(start: torch.Tensor, end: torch.Tensor, start_targets: torch.Tensor, end_targets: torch.Tensor,
              reduction: str = "mean") -> torch.Tensor:
    """Mean of the start and end heads' marginal negative log-likelihood of their target positions
    (every occurrence of the answer, or [CLS] for a context that does not answer); rows without a
    target (yes/no examples) are skipped by the mean and give 0 with ``reduction="none"``."""
    per_row = (_marginal_nll(start, start_targets) + _marginal_nll(end, end_targets)) / 2
    if reduction == "none":
        return per_row
    keep = start_targets.bool().any(-1)
    return per_row[keep].mean() if bool(keep.any()) else per_row.sum() * 0.0


class ExtractiveReader(EncoderWithHeads):
    """A BERT-style encoder with start/end span heads, a [CLS] confidence head and a [CLS] answer-type head."""

    model_type = "reader"
    default_options = {**DEFAULT_OPTIONS, **DECODING_DEFAULTS, **TRAINING_DEFAULTS}
    label_names = {"span": ["start", "end"], "confidence": ["does not answer", "answers"],
                   "answer_type": list(ANSWER_TYPES)}

    def __init__(self, encoder, tokenizer, options: dict | None = None):
        super().__init__(encoder, tokenizer, options)
        if self.options["span_targets"] not in SPAN_TARGETS:
            raise ValueError(f"reader option span_targets must be one of {list(SPAN_TARGETS)}, "
                             f"got {self.options['span_targets']!r}")

    def build_heads(self, hidden: int, dropout: float) -> None:
        self.head_dropout = nn.Dropout(dropout)
        self.span_head = nn.Linear(hidden, 2)  # w_s, w_e
        self.conf_head = nn.Linear(hidden, 1)  # w_f
        self.type_head = nn.Linear(hidden, len(ANSWER_TYPES))

    def forward(self, input_ids, attention_mask, token_type_ids=None, start_positions=None, end_positions=None,
                answerable=None, answer_type=None, start_targets=None, end_targets=None) -> ReaderOutput:
        """Span, confidence and answer-type logits; with targets, the loss: mean start/end cross-entropy
        (a document that does not answer points both at [CLS]; yes/no examples are skipped), the
        confidence's binary cross-entropy and the answer type's cross-entropy (answering examples only).
        Per-token 0/1 ``start_targets``/``end_targets`` (every occurrence of the answer) replace the
        positions in the span loss by their marginal likelihood (:func:`span_loss`)."""
        hidden = self.head_dropout(self.encode_hidden(input_ids, attention_mask, token_type_ids))
        start, end = self.span_head(hidden).float().masked_fill((attention_mask == 0)[..., None], NEG).unbind(-1)
        confidence = self.conf_head(hidden[:, 0]).float()[:, 0]
        types = self.type_head(hidden[:, 0]).float()
        out = ReaderOutput(start_logits=start, end_logits=end, confidence=confidence, type_logits=types)
        if start_positions is not None and end_positions is not None and answerable is not None:
            if start_targets is None or end_targets is None:  # one target per row: the positions
                start_targets, end_targets = _one_hot(start_positions, start), _one_hot(end_positions, end)
            out.span_loss = span_loss(start, end, start_targets, end_targets)
            out.confidence_loss = nn.functional.binary_cross_entropy_with_logits(confidence, answerable.float())
            out.loss = out.span_loss + out.confidence_loss
            if answer_type is not None:
                out.type_loss = _mean_ce(types, answer_type)
                out.loss = out.loss + out.type_loss
        return out

    def encode(self, questions: Sequence[str], documents: Sequence[str], max_length: int | None = None,
               tensors: bool = False):
        """``[CLS] question [SEP] document [SEP]`` with character offsets; only documents are truncated.
        ``tensors=True`` pads the batch into PyTorch tensors."""
        return self.tokenizer(list(questions), list(documents), truncation="only_second",
                              max_length=max_length or self.max_length, padding=tensors,
                              return_offsets_mapping=True, return_tensors="pt" if tensors else None)

    @torch.inference_mode()
    def logits(self, questions: Sequence[str], documents: Sequence[str], batch_size: int = 16) -> list[WindowLogits]:
        """One forward pass per (question, document): the heads' outputs that :meth:`decode` turns into
        an answer. Kept apart so that decoding settings can be tuned without re-running the encoder."""
        if len(questions) != len(documents):
            raise ValueError(f"{len(questions)} questions but {len(documents)} documents")
        was_training = self.training
        self.eval()
        out: list[WindowLogits] = []
        try:
            for i in range(0, len(questions), batch_size):
                qs, ds = questions[i:i + batch_size], documents[i:i + batch_size]
                enc = self.encode(qs, ds, tensors=True)
                offsets = enc.pop("offset_mapping")
                res = self(**{k: v.to(self.device) for k, v in enc.items()})
                for b in range(len(qs)):
                    n = int(enc["attention_mask"][b].sum())
                    in_doc = torch.tensor([s == 1 for s in enc.sequence_ids(b)[:n]])
                    out.append(WindowLogits(ds[b], res.start_logits[b, :n].float().cpu(),
                                            res.end_logits[b, :n].float().cpu(), in_doc, offsets[b, :n],
                                            float(res.confidence[b]), res.type_logits[b].float().cpu()))
        finally:
            self.train(was_training)
        return out

    def decoding(self, **overrides) -> dict:
        """The span-decoding settings: the checkpoint's options (:data:`DECODING_DEFAULTS` keys), with
        ``overrides`` that are not None on top."""
        unknown = set(overrides) - set(DECODING_DEFAULTS)
        if unknown:
            raise ValueError(f"unknown decoding setting(s) {sorted(unknown)}; known: {sorted(DECODING_DEFAULTS)}")
        return {k: overrides[k] if overrides.get(k) is not None else self.options[k] for k in DECODING_DEFAULTS}

    def decode(self, question: str, window: WindowLogits, **overrides) -> ReaderAnswer:
        """Best span of one window under the decoding settings (see :data:`DECODING_DEFAULTS`)."""
        return decode_span(question, window, **self.decoding(**overrides))

    def predict(self, questions: Sequence[str], documents: Sequence[str], batch_size: int = 16,
                max_answer_tokens: int | None = None, **decoding) -> list[ReaderAnswer]:
        """Best span in each document (never empty), the confidence logit ``f`` and the answer type."""
        windows = self.logits(questions, documents, batch_size)
        return [self.decode(q, w, max_answer_tokens=max_answer_tokens, **decoding) for q, w in zip(questions, windows)]

    def pack(self, question: str, passages: Sequence[str], together: bool = True) -> list[list[int]]:
        """Indices of ``passages`` read per window, in their order: consecutive passages while
        question + passages fit ``max_length`` tokens (``together``), else one passage per window.
        A passage too long for a window of its own is read alone (truncated)."""
        if not together:
            return [[i] for i in range(len(passages))]
        budget = self.max_length - len(self.tokenizer(question, add_special_tokens=False)["input_ids"]) - 3
        sizes = [len(ids) + 1 for ids in self.tokenizer(list(passages), add_special_tokens=False)["input_ids"]]
        windows: list[list[int]] = []
        used = budget + 1
        for i, n in enumerate(sizes):
            if used + n > budget:
                windows.append([])
                used = 0
            windows[-1].append(i)
            used += n
        return windows

    def window_logits(self, question: str, passages: Sequence[str], together: bool = True,
                      batch_size: int = 16) -> tuple[list[list[int]], list[WindowLogits]]:
        """The windows of :meth:`pack` (passage indices) and their :meth:`logits`."""
        windows = self.pack(question, passages, together)
        docs = [PASSAGE_SEPARATOR.join(passages[i] for i in w) for w in windows]
        return windows, self.logits([question] * len(docs), docs, batch_size)

    def answer_windows(self, question: str, windows: list[list[int]], logits: list[WindowLogits],
                       **decoding) -> tuple[ReaderAnswer, list[int]]:
        """The most confident window's answer and that window's passage indices."""
        if not windows:
            return ReaderAnswer("", float("-inf"), 0, 0, float("-inf")), []
        best = max(range(len(windows)), key=lambda j: logits[j].confidence)
        return self.decode(question, logits[best], **decoding), windows[best]

    def read(self, question: str, passages: Sequence[str], together: bool = True,
             batch_size: int = 16, **decoding) -> tuple[ReaderAnswer, list[int]]:
        """The answer to ``question`` from ranked ``passages`` (plain strings, e.g. ``"title: text"``):
        each window of :meth:`pack` is read as one document and the window with the highest
        confidence answers. Returns that answer and the indices of the passages in its window."""
        windows, logits = self.window_logits(question, passages, together, batch_size) if passages else ([], [])
        return self.answer_windows(question, windows, logits, **decoding)


@dataclass
class WindowLogits:
    """The reader's outputs for one (question, document) pair, cut to its real tokens."""

    document: str
    start: torch.Tensor  # [T] start logits
    end: torch.Tensor  # [T]
    in_doc: torch.Tensor  # [T] bool: the token belongs to the document (a span may use it)
    offsets: torch.Tensor  # [T, 2] character offsets into the document
    confidence: float  # f
    type_logits: torch.Tensor  # [3] over ANSWER_TYPES


def echoes_question(span: str, question: str) -> bool:
    """True when the span's words (normalised as the EM/F1 rule does) occur together in the question,
    and the question does not offer alternatives ("A or B?", "between A and B"), whose answer is one
    of its own phrases. A wh-question is rarely answered by its own words: such a span is most often
    the bridge entity, not the answer."""
    return _echo_test(question)(span)


def _echo_test(question: str):
    """:func:`echoes_question` for one question, its normalisation done once."""
    if _ALTERNATIVES.search(question):
        return lambda span: False
    padded = f" {normalize_answer(question)} "

    def echoes(span: str) -> bool:
        words = normalize_answer(span)
        return bool(words) and f" {words} " in padded
    return echoes


def decode_span(question: str, window: WindowLogits, max_answer_tokens: int = MAX_ANSWER_TOKENS,
                question_echo_penalty: float = 0.0, length_penalty: float = 0.0, yes_bias: float = 0.0,
                candidates: int = 20) -> ReaderAnswer:
    """The answer of ``window``. Its type: the type head's argmax after adding ``yes_bias`` to the
    "yes" logit. Its span: highest ``start + end`` logit among spans of at most ``max_answer_tokens``
    document tokens, minus ``length_penalty`` per token after the first and ``question_echo_penalty``
    when the span :func:`echoes_question` (the ``candidates`` best spans are re-scored for it).
    ``span_score`` is that penalised score."""
    w = window
    types = w.type_logits.clone()
    types[ANSWER_TYPES.index("yes")] += yes_bias
    answer_type = ANSWER_TYPES[int(types.argmax())]
    if not bool(w.in_doc.any()):
        return ReaderAnswer("", w.confidence, 0, 0, float("-inf"), answer_type)
    scores, ok, m = span_band(w.start[None], w.end[None], w.in_doc[None], max_answer_tokens)
    scores, ok = scores[0], ok[0]  # scores[s, l]: the span from token s to token s + l
    if length_penalty:
        scores = scores - length_penalty * torch.arange(m, dtype=scores.dtype)
    flat = scores.flatten()
    k = min(candidates, int(ok.sum())) if question_echo_penalty else 1
    top = flat.topk(k)
    echoes = _echo_test(question) if question_echo_penalty else None
    best = None
    for score, idx in zip(top.values.tolist(), top.indices.tolist()):
        s, e = idx // m, idx // m + idx % m
        c0, c1 = int(w.offsets[s, 0]), int(w.offsets[e, 1])
        if echoes is not None and echoes(w.document[c0:c1]):
            score -= question_echo_penalty
        if best is None or score > best[0]:
            best = (score, c0, c1)
    score, c0, c1 = best
    return ReaderAnswer(w.document[c0:c1], w.confidence, c0, c1, score, answer_type)


def load_reader_checkpoint(path: str | Path) -> ExtractiveReader:
    """An :class:`ExtractiveReader` from a checkpoint folder, with a clear error for anything else
    (:func:`effrag.models.load_reader` opens a reader-vote folder too)."""
    from .heads import HEADS_NAME

    path = Path(path)
    if not (path / HEADS_NAME).is_file():
        raise FileNotFoundError(f"reader checkpoint {path}: no {HEADS_NAME} there (train one with "
                                "`python scripts/train_models.py --models reader --name all`)")
    return ExtractiveReader.from_pretrained(path)
