"""EfficientRAG Labeler (+ Tagger): which chunk words to keep, and whether to continue.

Input ``[CLS] query [SEP] chunk [SEP]``. A token head labels chunk words useful /
useless; a chunk head on the attention-masked mean of all token embeddings tags
the chunk <Continue> (1, it helps answer the query) or <Terminate> (0). Paper §3.3.
"""
from __future__ import annotations

import torch
from torch import nn

from ..text import words_of_each
from .heads import ChunkHead, EncoderWithHeads, TaggerOutput, TokenHead, predict_batches
from .pair_encoding import pair_encoder
from .tokenization import encode_pairs


class LabelerModel(EncoderWithHeads):
    model_type = "labeler"
    label_names = {"token": ["useless", "useful"], "tag": ["<Terminate>", "<Continue>"]}

    def build_heads(self, hidden: int, dropout: float) -> None:
        self.token_head = TokenHead(hidden, dropout)
        self.chunk_head = ChunkHead(hidden, dropout)

    def forward(self, input_ids, attention_mask, token_type_ids=None, labels=None, tag=None) -> TaggerOutput:
        hidden = self.encode_hidden(input_ids, attention_mask, token_type_ids)
        token_logits = self.token_head(hidden)
        tag_logits = self.chunk_head(hidden, attention_mask)
        out = TaggerOutput(token_logits=token_logits, tag_logits=tag_logits)
        if labels is not None and tag is not None:
            out.token_loss = self.token_loss(token_logits, labels)
            out.tag_loss = nn.functional.cross_entropy(tag_logits.float(), tag.long())
            out.loss = self.options["token_weight"] * out.token_loss + self.options["tag_weight"] * out.tag_loss
        return out

    def encode(self, query_words, chunk_words, labels=None, max_length: int | None = None):
        return encode_pairs(self.tokenizer, query_words, chunk_words, labels, max_length or self.max_length)

    @torch.inference_mode()
    def predict(
        self,
        queries: list[str],
        chunks: list[list[str]],
        batch_size: int = 32,
        max_length: int | None = None,
        bf16: bool = False,
        return_truncated: bool = False,
    ):
        """``(p_continue, keep probability per chunk word)`` for each (query, chunk word list).

        Words cut by ``max_length`` (default: the trained length) get probability 0;
        their count per item is logged and, with ``return_truncated=True``, returned as
        a second value ``list[int]``.
        """
        if len(queries) != len(chunks):
            raise ValueError(f"{len(queries)} queries for {len(chunks)} chunks")
        encoded = pair_encoder(self.tokenizer).encode(words_of_each(queries), chunks, max_length or self.max_length)
        results: list = [None] * len(encoded)
        for i, row, out, probs in predict_batches(self, encoded, batch_size, bf16, "labeler"):
            results[i] = (float(out.tag_logits[row].float().softmax(-1)[1]), probs)
        truncated = [e.truncated for e in encoded]
        return (results, truncated) if return_truncated else results
