"""EfficientRAG Labeler (+ Tagger): which chunk words to keep, and whether to continue.

Input ``[CLS] query [SEP] chunk [SEP]``. A token head labels chunk words useful /
useless; a chunk head on the attention-masked mean of all token embeddings tags
the chunk <Continue> (1, it helps answer the query) or <Terminate> (0). Paper §3.3.
"""
from __future__ import annotations

import logging

import torch
from torch import nn

from ..text import words_batch
from .heads import ChunkHead, EncoderWithHeads, TaggerOutput, TokenHead
from .tokenization import encode_pairs, length_batches, pad_batch

log = logging.getLogger(__name__)


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
        encoded = self.encode(words_batch(list(queries)), [list(c) for c in chunks], max_length=max_length)
        results: list = [None] * len(encoded)
        was_training = self.training
        self.eval()
        device = self.device
        try:
            for idx in length_batches([len(e.input_ids) for e in encoded], batch_size):
                batch = pad_batch([encoded[i].features() for i in idx], self.tokenizer.pad_token_id)
                batch.pop("labels")
                batch = {k: v.to(device) for k, v in batch.items()}
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                    out = self(**batch)
                p_tok = out.token_logits.float().softmax(-1)[..., 1].cpu()
                p_tag = out.tag_logits.float().softmax(-1)[:, 1].cpu()
                for row, i in enumerate(idx):
                    probs = [float(p_tok[row, p]) if p >= 0 else 0.0 for p in encoded[i].word_positions]
                    results[i] = (float(p_tag[row]), probs)
        finally:
            self.train(was_training)
        truncated = [e.truncated for e in encoded]
        if any(truncated):
            log.warning("labeler: %d of %d chunks truncated at max_length, %d words got probability 0",
                        sum(t > 0 for t in truncated), len(truncated), sum(truncated))
        return (results, truncated) if return_truncated else results
