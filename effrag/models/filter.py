"""EfficientRAG Filter: which words of "<query> Info: <kept words>" form the next-hop query.

A single word sequence with one token head (keep=1 / drop=0); the kept words, in
order, are the next query. Paper §3.3.
"""
from __future__ import annotations

import torch

from .heads import EncoderWithHeads, TaggerOutput, TokenHead, predict_batches
from .tokenization import encode_singles


class FilterModel(EncoderWithHeads):
    model_type = "filter"
    label_names = {"token": ["drop", "keep"]}

    def build_heads(self, hidden: int, dropout: float) -> None:
        self.token_head = TokenHead(hidden, dropout)

    def forward(self, input_ids, attention_mask, token_type_ids=None, labels=None) -> TaggerOutput:
        hidden = self.encode_hidden(input_ids, attention_mask, token_type_ids)
        token_logits = self.token_head(hidden)
        out = TaggerOutput(token_logits=token_logits)
        if labels is not None:
            out.token_loss = self.token_loss(token_logits, labels)
            out.loss = self.options["token_weight"] * out.token_loss
        return out

    def encode(self, words, labels=None, max_length: int | None = None):
        return encode_singles(self.tokenizer, words, labels, max_length or self.max_length)

    @torch.inference_mode()
    def predict(
        self,
        words: list[list[str]],
        batch_size: int = 32,
        max_length: int | None = None,
        bf16: bool = False,
        return_truncated: bool = False,
    ):
        """Keep probability per word for each word list (words cut by ``max_length`` get 0)."""
        encoded = self.encode([list(w) for w in words], max_length=max_length)
        results: list = [None] * len(encoded)
        for i, _row, _out, probs in predict_batches(self, encoded, batch_size, bf16, "filter"):
            results[i] = probs
        truncated = [e.truncated for e in encoded]
        return (results, truncated) if return_truncated else results
