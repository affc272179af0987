"""IRRR (Qi et al., 2021): one encoder that generates queries, reads and reranks.

Over the encoding of a reasoning path (:mod:`.irrr_encoding`) the model has

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

Inference is the model's own: :meth:`IRRRModel.encode` lays out a path,
:meth:`IRRRModel.predict` scores a batch of paths (:class:`PathScores`), and
:meth:`IRRRModel.search_query` / :meth:`IRRRModel.read` turn one path's scores into the next
search query or an answer with its answerability. The retrieve-read-rerank loop over them is
``effrag.pipelines.irrr``; :class:`IRRRReader` lends the reader to other retrieval methods.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers.utils import ModelOutput

from ..text import QUERY_STOPWORDS, join_words, normalize_word, words
from .heads import DEFAULT_OPTIONS, EncoderWithHeads, TokenHead, forward_batches
from .irrr_encoding import CONT_TOKEN, PathEncoding, encode_path
from .spans import best_spans
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


@dataclass
class PathScores:
    """The model's outputs for one reasoning path, cut to its tokens (float32, on the CPU)."""

    token_logits: torch.Tensor  # [T, 2] query head: drop / keep per token
    type_logits: torch.Tensor  # [4] SPAN / YES / NO / NOANSWER
    start_logits: torch.Tensor  # [T]
    end_logits: torch.Tensor  # [T]
    rank: float  # reranker score of the path's last paragraph


def answerability(type_logits: torch.Tensor, start: torch.Tensor, end: torch.Tensor,
                  best_start: torch.Tensor, best_end: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(answerability, best positive type) per row, Appendix C eq. 2; best_start/end index the best span."""
    pos = type_logits[:, :NOANSWER]
    best_type = pos.argmax(-1)
    ratio = pos.gather(1, best_type[:, None])[:, 0] - type_logits[:, NOANSWER]
    rows = torch.arange(len(start), device=start.device)
    span_gain = (start[rows, best_start] - start[:, 0]) / 2 + (end[rows, best_end] - end[:, 0]) / 2
    return torch.where(best_type == SPAN, ratio + span_gain, ratio), best_type


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

    # -- inference ------------------------------------------------------------------------------
    def encode(self, question: str | list[str], paragraphs: list[dict], max_length: int | None = None) -> PathEncoding:
        """The input of a reasoning path: the question (text or words) and ``{"title", "text"}`` paragraphs."""
        return encode_path(self.tokenizer, question, paragraphs, max_length or self.max_length,
                           int(self.options["max_question_tokens"]))

    @torch.inference_mode()
    def predict(self, encodings: list[PathEncoding], batch_size: int = 16, bf16: bool = False) -> list[PathScores]:
        """Query-head, reader and reranker scores of each encoded path, in length-sorted batches."""
        results: list[Any] = [None] * len(encodings)
        feats = [{"input_ids": e.input_ids, "attention_mask": e.attention_mask, "token_type_ids": e.token_type_ids}
                 for e in encodings]
        for idx, out in forward_batches(self, feats, batch_size, bf16):
            for row, i in enumerate(idx):
                n = len(encodings[i].input_ids)
                results[i] = PathScores(token_logits=out.token_logits[row, :n].float().cpu(),
                                        type_logits=out.type_logits[row].float().cpu(),
                                        start_logits=out.start_logits[row, :n].float().cpu(),
                                        end_logits=out.end_logits[row, :n].float().cpu(),
                                        rank=float(out.rank_scores[row]))
        return results

    @staticmethod
    def search_query(encoding: PathEncoding, scores: PathScores, threshold: float,
                     max_words: int) -> tuple[str, list[float]]:
        """The next search query and each path word's keep probability (0 for words cut by truncation).

        The query is the ``max_words`` most likely path words at ``>= threshold`` that are not
        punctuation or ``QUERY_STOPWORDS``, in path order, repeats dropped.
        """
        probs = scores.token_logits.softmax(-1)[:, 1]
        all_probs = [float(probs[pos]) if pos >= 0 else 0.0 for firsts in encoding.first for pos in firsts]
        path_words = [w for seg in encoding.segments for w in seg]
        picked = [i for i, (w, p) in enumerate(zip(path_words, all_probs))
                  if p >= threshold and normalize_word(w) and normalize_word(w) not in QUERY_STOPWORDS]
        picked = sorted(sorted(picked, key=lambda i: -all_probs[i])[:max_words])  # most likely, in path order
        seen, out = set(), []
        for w in (path_words[i] for i in picked):
            if normalize_word(w) not in seen:
                seen.add(normalize_word(w))
                out.append(w)
        return " ".join(out), all_probs

    @staticmethod
    def read(encoding: PathEncoding, scores: PathScores, max_answer_tokens: int = 30) -> dict[str, Any]:
        """``answer``, ``answer_type``, ``answerability`` and reranker score (``rank``) of one path.

        A span answer is the best span over path words ([CLS] and separators excluded), cut at the
        end of the segment it starts in; yes / no / noanswer answer with the type's name.
        """
        tw = encoding.token_word()
        allowed = torch.tensor([x is not None for x in tw])[None]
        start, end = scores.start_logits[None], scores.end_logits[None]
        bs, be, _ = best_spans(start, end, allowed, max_answer_tokens)
        score, typ = answerability(scores.type_logits[None], start, end, bs, be)
        typ = int(typ)
        if typ == SPAN:
            (si, wi), (sj, wj) = tw[int(bs)], tw[int(be)]
            if sj != si:
                wj = len(encoding.segments[si]) - 1
            answer = join_words(encoding.segments[si][wi : wj + 1])
        else:
            answer = ANSWER_TYPES[typ]
        return {"answer": answer, "answer_type": ANSWER_TYPES[typ], "answerability": float(score),
                "rank": scores.rank}


class IRRRReader:
    """IRRR's reader as an LLM-free answer generator for other retrieval methods.

    ``IRRRReader(model)(question, chunks)`` reads each chunk as a one-paragraph reasoning path
    and returns the answer with the highest answerability (Appendix C). Plugged into Direct-R or
    EfficientRAG as their ``generator``, it lets retrieval methods be compared on EM/F1 with the
    same extractive reader IRRR uses, without any LLM call.
    """

    def __init__(self, model: IRRRModel | str, batch_size: int = 16, bf16: bool = False, max_answer_tokens: int = 30):
        if not isinstance(model, torch.nn.Module):
            model = IRRRModel.from_pretrained(model)
        self.model = model.eval()
        self.batch_size, self.bf16, self.max_answer_tokens = batch_size, bf16, max_answer_tokens

    @torch.inference_mode()
    def __call__(self, question: str, chunks: list) -> dict[str, Any]:
        if not chunks:
            return {"answer": "", "llm_calls": 0}
        m = self.model
        qw = words(question)
        encs = [m.encode(qw, [{"title": c.title, "text": c.text}]) for c in chunks]
        reads = [m.read(e, s, self.max_answer_tokens) for e, s in zip(encs, m.predict(encs, self.batch_size, self.bf16))]
        i = max(range(len(reads)), key=lambda j: reads[j]["answerability"])
        return {"answer": reads[i]["answer"], "llm_calls": 0,
                "trace": {"reader": "irrr", "chunk": chunks[i].id, "answerability": round(reads[i]["answerability"], 4)}}
