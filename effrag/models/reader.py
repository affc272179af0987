"""Extractive QA reader used by SearChain's IR verification and completion.

SearChain (Xu et al., 2023, section 3.3) checks each node ``(q_i, a_i)`` of a
Chain-of-Query against the top-1 retrieved document ``d_i`` with a reader that
returns an answer span ``g = d_i[s:e]`` (start/end heads over the last hidden
states of ``[CLS] q_i [SEP] d_i``) and a confidence ``f = H_[CLS] . w_f``. The
confidence is a logit: it is trained with binary cross-entropy on "does this
document answer this question", so the paper's threshold ``theta = 1.5`` means
P(answerable) > 0.82.

The reader is an :class:`~effrag.models.heads.EncoderWithHeads` model like the
Labeler and the Filter (same checkpoint format, ``load_model`` opens it) and is
trained by the one training loop: task ``reader`` (:mod:`effrag.training.tasks.reader`,
which also builds its SQuAD-style examples from dataset files), ``configs/reader.yaml``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import torch
from torch import nn
from transformers.utils import ModelOutput

from .heads import EncoderWithHeads

CONFIDENCE_THRESHOLD = 1.5  # SearChain's theta on f
MAX_ANSWER_TOKENS = 30
NEG = -1e4  # logit of padding positions


@dataclass
class ReaderAnswer:
    """Best span of one (question, document) pair and the reader's confidence logit."""

    text: str
    confidence: float  # f, a logit of P(document answers the question)
    start: int  # character offsets into the document
    end: int
    span_score: float  # start logit + end logit of the chosen span

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class ReaderOutput(ModelOutput):
    loss: torch.Tensor | None = None
    span_loss: torch.Tensor | None = None
    confidence_loss: torch.Tensor | None = None
    start_logits: torch.Tensor | None = None  # [B, T], padding at NEG
    end_logits: torch.Tensor | None = None
    confidence: torch.Tensor | None = None  # [B], the logit f


def best_spans(start: torch.Tensor, end: torch.Tensor, allowed: torch.Tensor,
               max_answer_tokens: int = MAX_ANSWER_TOKENS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Best ``(start, end, start + end logit)`` per row over ``allowed`` tokens with
    ``start <= end < start + max_answer_tokens``; a row with no allowed token scores ``-inf``."""
    scores = start.float()[:, :, None] + end.float()[:, None, :]
    n = scores.shape[-1]
    band = torch.ones(n, n, dtype=torch.bool, device=scores.device).triu().tril(max_answer_tokens - 1)
    valid = band & allowed[:, :, None] & allowed[:, None, :]
    flat = scores.masked_fill(~valid, float("-inf")).flatten(1)
    best = flat.argmax(-1)
    return best // n, best % n, flat.gather(1, best[:, None])[:, 0]


class ExtractiveReader(EncoderWithHeads):
    """A BERT-style encoder with start/end span heads and a [CLS] confidence head."""

    model_type = "reader"
    label_names = {"span": ["start", "end"], "confidence": ["does not answer", "answers"]}

    def build_heads(self, hidden: int, dropout: float) -> None:
        self.head_dropout = nn.Dropout(dropout)
        self.span_head = nn.Linear(hidden, 2)  # w_s, w_e
        self.conf_head = nn.Linear(hidden, 1)  # w_f

    def forward(self, input_ids, attention_mask, token_type_ids=None, start_positions=None, end_positions=None,
                answerable=None) -> ReaderOutput:
        """Span and confidence logits; with targets, the loss: mean start/end cross-entropy (a document
        that does not answer points both at [CLS]) plus the confidence's binary cross-entropy."""
        hidden = self.head_dropout(self.encode_hidden(input_ids, attention_mask, token_type_ids))
        start, end = self.span_head(hidden).float().masked_fill((attention_mask == 0)[..., None], NEG).unbind(-1)
        confidence = self.conf_head(hidden[:, 0]).float()[:, 0]
        out = ReaderOutput(start_logits=start, end_logits=end, confidence=confidence)
        if start_positions is not None and end_positions is not None and answerable is not None:
            ce = nn.functional.cross_entropy
            out.span_loss = (ce(start, start_positions) + ce(end, end_positions)) / 2
            out.confidence_loss = nn.functional.binary_cross_entropy_with_logits(confidence, answerable.float())
            out.loss = out.span_loss + out.confidence_loss
        return out

    def encode(self, questions: Sequence[str], documents: Sequence[str], max_length: int | None = None,
               tensors: bool = False):
        """``[CLS] question [SEP] document [SEP]`` with character offsets; only documents are truncated.
        ``tensors=True`` pads the batch into PyTorch tensors."""
        return self.tokenizer(list(questions), list(documents), truncation="only_second",
                              max_length=max_length or self.max_length, padding=tensors,
                              return_offsets_mapping=True, return_tensors="pt" if tensors else None)

    @torch.inference_mode()
    def predict(self, questions: Sequence[str], documents: Sequence[str], batch_size: int = 16,
                max_answer_tokens: int = MAX_ANSWER_TOKENS) -> list[ReaderAnswer]:
        """Best span in each document (never empty) and the confidence logit ``f``."""
        if len(questions) != len(documents):
            raise ValueError(f"{len(questions)} questions but {len(documents)} documents")
        was_training = self.training
        self.eval()
        out: list[ReaderAnswer] = []
        try:
            for i in range(0, len(questions), batch_size):
                qs, ds = questions[i:i + batch_size], documents[i:i + batch_size]
                enc = self.encode(qs, ds, tensors=True)
                offsets = enc.pop("offset_mapping")
                res = self(**{k: v.to(self.device) for k, v in enc.items()})
                in_doc = torch.tensor([[s == 1 for s in enc.sequence_ids(b)] for b in range(len(qs))],
                                      device=res.start_logits.device)
                starts, ends, scores = best_spans(res.start_logits, res.end_logits, in_doc, max_answer_tokens)
                for b in range(len(qs)):
                    conf = float(res.confidence[b])
                    if not bool(in_doc[b].any()):
                        out.append(ReaderAnswer("", conf, 0, 0, float("-inf")))
                        continue
                    c0, c1 = int(offsets[b, int(starts[b]), 0]), int(offsets[b, int(ends[b]), 1])
                    out.append(ReaderAnswer(ds[b][c0:c1], conf, c0, c1, float(scores[b])))
        finally:
            self.train(was_training)
        return out
