"""IRRR's reader as an LLM-free answer generator for other retrieval methods.

``IRRRReader(model)(question, chunks)`` reads each chunk as a one-paragraph reasoning
path and returns the answer with the highest answerability (Appendix C). Plugged into
Direct-R or EfficientRAG as their ``generator``, it lets retrieval methods be compared
on EM/F1 with the same extractive reader IRRR uses, without any LLM call.
"""
from __future__ import annotations

from typing import Any

import torch


class IRRRReader:
    def __init__(self, model, batch_size: int = 16, bf16: bool = False, max_answer_tokens: int = 30):
        from ..models import IRRRModel

        if not isinstance(model, torch.nn.Module):
            model = IRRRModel.from_pretrained(model)
        self.model = model.eval()
        self.batch_size, self.bf16, self.max_answer_tokens = batch_size, bf16, max_answer_tokens

    @torch.inference_mode()
    def __call__(self, question: str, chunks: list) -> dict[str, Any]:
        from ..pipelines.irrr import _forward, read
        from ..text import words
        from .encoding import encode_path

        if not chunks:
            return {"answer": "", "llm_calls": 0}
        qw = words(question)
        m = self.model
        encs = [encode_path(m.tokenizer, qw, [{"title": c.title, "text": c.text}], m.max_length,
                            int(m.options["max_question_tokens"])) for c in chunks]
        outs = _forward(m, encs, self.batch_size, self.bf16)
        reads = [read(e, o, self.max_answer_tokens) for e, o in zip(encs, outs)]
        i = max(range(len(reads)), key=lambda j: reads[j]["answerability"])
        return {"answer": reads[i]["answer"], "llm_calls": 0,
                "trace": {"reader": "irrr", "chunk": chunks[i].id, "answerability": round(reads[i]["answerability"], 4)}}
