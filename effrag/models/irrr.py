"""IRRR (Qi et al., 2021): one encoder that generates queries, reads and reranks.

Over the encoding of a reasoning path (``effrag.irrr.encoding``) the model has

* a **query head**: per-token keep/drop, choosing search terms from the path;
* a **reader**: a 4-way [CLS] classifier SPAN / YES / NO / NOANSWER and span start/end
  classifiers (a path that cannot be answered points both at [CLS], Appendix C);
* a **reranker**: a scalar from [CLS], trained with a softmax over the candidate
  extensions of one path (noise-contrastive estimation over retrieved paragraphs).

The reader's type and span losses average answerable and unanswerable candidates separately
(``balanced``), since most candidates cannot answer. A batch mixes *query* sequences (path -> next query; ``labels`` set) and *candidate*
sequences (path + one retrieved paragraph; ``answer_type``, span positions and
``rank_group`` / ``rank_label`` set); every loss ignores the rows it does not apply to.

Answerability (Appendix C, eq. 2) is the log-likelihood ratio of the best positive
answer against NOANSWER, plus for spans half the start and end logit gains over the
[CLS] "span": a score comparable across paths of different lengths, so one global
threshold can stop the iteration.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers.utils import ModelOutput

from .heads import DEFAULT_OPTIONS, EncoderWithHeads, TokenHead
from .tokenization import IGNORE

ANSWER_TYPES = ["span", "yes", "no", "noanswer"]
SPAN, YES, NO, NOANSWER = range(4)
NEG = -1e4


@dataclass
class IRRROutput(ModelOutput):
    loss: torch.Tensor | None = None
    query_loss: torch.Tensor | None = None
    type_loss: torch.Tensor | None = None
    span_loss: torch.Tensor | None = None
    rerank_loss: torch.Tensor | None = None
    token_logits: torch.Tensor | None = None  # query head [B, T, 2]
    type_logits: torch.Tensor | None = None  # [B, 4]
    start_logits: torch.Tensor | None = None  # [B, T], padding at NEG
    end_logits: torch.Tensor | None = None
    rank_scores: torch.Tensor | None = None  # [B]


def answerability(type_logits: torch.Tensor, start: torch.Tensor, end: torch.Tensor,
                  best_start: torch.Tensor, best_end: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(answerability, best positive type) per row, Appendix C eq. 2; best_start/end index the best span."""
    pos = type_logits[:, :NOANSWER]
    best_type = pos.argmax(-1)
    ratio = pos.gather(1, best_type[:, None])[:, 0] - type_logits[:, NOANSWER]
    rows = torch.arange(len(start), device=start.device)
    span_gain = (start[rows, best_start] - start[:, 0]) / 2 + (end[rows, best_end] - end[:, 0]) / 2
    return torch.where(best_type == SPAN, ratio + span_gain, ratio), best_type


def best_spans(start: torch.Tensor, end: torch.Tensor, allowed: torch.Tensor, max_answer_tokens: int = 30,
               top: int = 20) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Best (start, end) per row with start <= end < start + max_answer_tokens over ``allowed`` tokens."""
    s = start.masked_fill(~allowed, NEG)
    e = end.masked_fill(~allowed, NEG)
    k = min(top, s.size(1))
    ss, si = s.topk(k, -1)
    es, ei = e.topk(k, -1)
    score = ss[:, :, None] + es[:, None, :]
    ok = (ei[:, None, :] >= si[:, :, None]) & (ei[:, None, :] < si[:, :, None] + max_answer_tokens)
    score = score.masked_fill(~ok, 2 * NEG)
    flat = score.flatten(1).argmax(-1)
    b_s = si.gather(1, (flat // k)[:, None])[:, 0]
    b_e = ei.gather(1, (flat % k)[:, None])[:, 0]
    return b_s, b_e, score.flatten(1).max(-1).values


class IRRRModel(EncoderWithHeads):
    model_type = "irrr"
    label_names = {"token": ["drop", "keep"], "answer_type": ANSWER_TYPES}
    default_options = {
        **DEFAULT_OPTIONS,
        "max_length": 384,
        "max_question_tokens": 64,
        "query_weight": 1.0,
        "reader_weight": 1.0,
        "span_weight": 1.0,
        "rerank_weight": 1.0,
    }

    def build_heads(self, hidden: int, dropout: float) -> None:
        self.query_head = TokenHead(hidden, dropout)
        self.head_dropout = nn.Dropout(dropout)
        self.type_head = nn.Linear(hidden, len(ANSWER_TYPES))
        self.span_head = nn.Linear(hidden, 2)
        self.rerank_head = nn.Linear(hidden, 1)

    @classmethod
    def from_encoder(cls, name_or_path: str, options: dict | None = None, **kwargs):
        """New heads on a pretrained encoder; adds the [CONT] token to tokenizer and embeddings."""
        from ..irrr.encoding import CONT_TOKEN

        model = super().from_encoder(name_or_path, options, **kwargs)
        if CONT_TOKEN not in model.tokenizer.get_vocab():
            model.tokenizer.add_special_tokens({"additional_special_tokens": [CONT_TOKEN]})
            model.encoder.resize_token_embeddings(len(model.tokenizer))
        return model

    def forward(self, input_ids, attention_mask, token_type_ids=None, labels=None, answer_type=None,
                start_positions=None, end_positions=None, rank_group=None, rank_label=None) -> IRRROutput:
        hidden = self.encode_hidden(input_ids, attention_mask, token_type_ids)
        token_logits = self.query_head(hidden)
        cls = self.head_dropout(hidden[:, 0])
        type_logits = self.type_head(cls)
        rank_scores = self.rerank_head(cls)[:, 0]
        se = self.span_head(self.head_dropout(hidden)).float()
        pad = attention_mask == 0
        start_logits = se[..., 0].masked_fill(pad, NEG)
        end_logits = se[..., 1].masked_fill(pad, NEG)
        out = IRRROutput(token_logits=token_logits, type_logits=type_logits, start_logits=start_logits,
                         end_logits=end_logits, rank_scores=rank_scores)
        if labels is None and answer_type is None and rank_group is None:
            return out
        zero = hidden.new_zeros((), dtype=torch.float32)
        o = self.options
        q = self.token_loss(token_logits, labels) if labels is not None and (labels != IGNORE).any() else zero
        t = s = r = zero
        if answer_type is not None and (answer_type != IGNORE).any():
            ce = nn.functional.cross_entropy(type_logits.float(), answer_type, ignore_index=IGNORE, reduction="none")
            t = self.balanced(ce, answer_type != IGNORE, answer_type == NOANSWER)
        if start_positions is not None and (start_positions != IGNORE).any():
            ce = (nn.functional.cross_entropy(start_logits, start_positions, ignore_index=IGNORE, reduction="none")
                  + nn.functional.cross_entropy(end_logits, end_positions, ignore_index=IGNORE, reduction="none")) / 2
            na = answer_type == NOANSWER if answer_type is not None else start_positions == 0
            s = self.balanced(ce, start_positions != IGNORE, na)
        if rank_group is not None:
            r = self.rerank_loss(rank_scores.float(), rank_group, rank_label)
        out.query_loss, out.type_loss, out.span_loss, out.rerank_loss = q, t, s, r
        out.loss = (o["query_weight"] * q + o["reader_weight"] * t + o["span_weight"] * s
                    + o["rerank_weight"] * r)
        return out

    @staticmethod
    def balanced(loss: torch.Tensor, valid: torch.Tensor, noanswer: torch.Tensor) -> torch.Tensor:
        """Mean over answerable rows plus mean over unanswerable rows, halved when both occur.

        Most candidates of a step cannot answer the question (~9 in 10 in our data); a plain mean
        would teach the reader NOANSWER and the span heads [CLS] and little else.
        """
        parts = [loss[m].mean() for m in (valid & ~noanswer, valid & noanswer) if m.any()]
        return torch.stack(parts).mean()

    @staticmethod
    def rerank_loss(scores: torch.Tensor, group: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        """Mean over groups with a positive of -log(sum of softmax mass on the gold candidates).

        Rows with ``label`` IGNORE (a step's query sequence) are not candidates.
        """
        losses = []
        valid = (group >= 0) & (label != IGNORE)
        for g in torch.unique(group[valid]):
            m = valid & (group == g)
            pos = label[m] == 1
            if not pos.any() or pos.all():
                continue
            logp = scores[m].log_softmax(0)
            losses.append(-torch.logsumexp(logp[pos], 0))
        return torch.stack(losses).mean() if losses else scores.new_zeros(())
