"""The pool ranker: one relevance score per (query, chunk), trained listwise against hard negatives.

Input ``[CLS] query [SEP] chunk [SEP]``, exactly the Labeler's (:func:`~.tokenization.encode_pairs` over
:func:`effrag.text.chunk_text` words); a linear head on the attention-masked mean of the sequence gives a
logit. Why a model of its own: the Labeler's <Continue> tag decides where the loop goes and is trained on
one or three dense negatives per query, which makes it a poor judge of *which* of the 20-50 chunks the
loop read belong in the final few (on HotpotQA dev it ranks hybrid's top 30 below hybrid's own order).
The ranker is trained for exactly that: a softmax over one group of candidates per (query, gold chunk),
the gold against the chunks a hybrid retriever ranks highest for the same query, and the question's own
distractor paragraphs (:mod:`data_synthesis.ranker_groups`).

A smaller ranker can be distilled from a trained one (``distill_weight`` > 0): each candidate of a training group
carries the teacher's logit (``effrag ranker-teacher``), and the loss mixes the listwise loss on the gold with the
KL divergence from the teacher's softmax over the same group (Hinton et al.'s temperature-scaled soft targets), so
the student learns the teacher's whole order, not only where the gold is.

Its scores are log-odds on the model's own scale, so a loop config that weighs them does not depend on
the retriever's score scale (``pool_order: rank``, :mod:`effrag.pipelines.efficientrag.config`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.utils import ModelOutput

from ..text import words_of_each
from .heads import DEFAULT_OPTIONS, ChunkHead, EncoderWithHeads, forward_batches
from .pair_encoding import pair_encoder
from .tokenization import IGNORE, encode_pairs


@dataclass
class RankerOutput(ModelOutput):
    loss: torch.Tensor | None = None
    scores: torch.Tensor | None = None  # [B] relevance logits


def listwise_loss(scores: torch.Tensor, group: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """Mean over groups of -log(softmax mass on the group's gold candidates).

    A group with no gold, or nothing but gold, teaches no ranking and is skipped; rows with ``label``
    IGNORE are not candidates.
    """
    losses = []
    valid = label != IGNORE
    for g in torch.unique(group[valid]):
        m = valid & (group == g)
        pos = label[m] == 1
        if not pos.any() or pos.all():
            continue
        losses.append(-torch.logsumexp(scores[m].log_softmax(0)[pos], 0))
    return torch.stack(losses).mean() if losses else scores.sum() * 0.0


def distill_loss(scores: torch.Tensor, teacher: torch.Tensor, group: torch.Tensor,
                 temperature: float = 1.0) -> torch.Tensor | None:
    """Mean over groups of KL(teacher softmax || student softmax) at ``temperature``, times T^2 (so the gradient's
    scale does not depend on T). Groups without finite teacher scores on every candidate (e.g. dev groups) are
    skipped; None when no group has them."""
    losses = []
    for g in torch.unique(group):
        m = group == g
        t = teacher[m]
        if len(t) < 2 or not torch.isfinite(t).all():
            continue
        p_t = (t / temperature).log_softmax(0)
        p_s = (scores[m] / temperature).log_softmax(0)
        losses.append((p_t.exp() * (p_t - p_s)).sum() * temperature ** 2)
    return torch.stack(losses).mean() if losses else None


def group_loss(model, scores: torch.Tensor, group: torch.Tensor, label: torch.Tensor,
               teacher: torch.Tensor | None) -> torch.Tensor:
    """A ranker's training loss: :func:`listwise_loss`, mixed with :func:`distill_loss` by the model's
    ``distill_weight`` when the batch carries the teacher's scores (one home for every pool ranker's loss)."""
    loss = listwise_loss(scores, group, label)
    weight = float(model.options["distill_weight"])
    if weight > 0 and teacher is not None:
        soft = distill_loss(scores, teacher.float(), group, float(model.options["distill_temperature"]))
        if soft is not None:
            return (1 - weight) * loss + weight * soft
        if model.training:
            raise ValueError("distill_weight > 0 but no training group carries teacher scores on every "
                             "candidate: score the training file with `effrag ranker-teacher` first")
    return loss


class RankerModel(EncoderWithHeads):
    model_type = "ranker"
    label_names = {"rel": ["irrelevant", "relevant"]}
    # the token options every model's training config passes are unused here; distill_weight: the share of the
    # teacher's soft targets in the loss (0: the gold labels only), distill_temperature: their softmax temperature
    default_options = {**DEFAULT_OPTIONS, "distill_weight": 0.0, "distill_temperature": 1.0}

    def build_heads(self, hidden: int, dropout: float) -> None:
        self.score_head = ChunkHead(hidden, dropout, n_labels=1)

    def forward(self, input_ids, attention_mask, token_type_ids=None, rank_group=None, rank_label=None,
                rank_teacher=None, labels=None) -> RankerOutput:
        hidden = self.encode_hidden(input_ids, attention_mask, token_type_ids)
        scores = self.score_head(hidden, attention_mask)[:, 0]
        out = RankerOutput(scores=scores)
        if rank_group is not None and rank_label is not None:
            out.loss = group_loss(self, scores.float(), rank_group, rank_label, rank_teacher)
        return out

    def encode(self, query_words, chunk_words, max_length: int | None = None):
        return encode_pairs(self.tokenizer, query_words, chunk_words, None, max_length or self.max_length)

    @torch.inference_mode()
    def predict(self, queries: list[str], chunks: list[list[str]], batch_size: int = 32,
                max_length: int | None = None, bf16: bool = False) -> list[float]:
        """The relevance logit of each (query, chunk word list) pair."""
        if len(queries) != len(chunks):
            raise ValueError(f"{len(queries)} queries for {len(chunks)} chunks")
        encoded = pair_encoder(self.tokenizer).encode(words_of_each(queries), chunks, max_length or self.max_length)
        feats = [{k: v for k, v in e.features().items() if k != "labels"} for e in encoded]
        scores: list[float] = [0.0] * len(encoded)
        for idx, out in forward_batches(self, feats, batch_size, bf16):
            values = out.scores.float().cpu().tolist()
            for row, i in enumerate(idx):
                scores[i] = values[row]
        return scores
