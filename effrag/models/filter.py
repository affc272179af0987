"""EfficientRAG Filter: which words of "<query> Info: <kept words>" form the next-hop query.

A single word sequence with one token head (keep=1 / drop=0); the kept words, in
order, are the next query. Paper §3.3.
"""
from __future__ import annotations

import logging

import torch

from .heads import EncoderWithHeads, TaggerOutput, TokenHead
from .tokenization import encode_singles, length_batches, pad_batch

log = logging.getLogger(__name__)


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
                for row, i in enumerate(idx):
                    results[i] = [float(p_tok[row, p]) if p >= 0 else 0.0 for p in encoded[i].word_positions]
        finally:
            self.train(was_training)
        truncated = [e.truncated for e in encoded]
        if any(truncated):
            log.warning("filter: %d of %d inputs truncated at max_length, %d words got probability 0",
                        sum(t > 0 for t in truncated), len(truncated), sum(truncated))
        return (results, truncated) if return_truncated else results
