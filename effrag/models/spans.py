"""Answer-span search shared by the span-extracting models (the reader, IRRR's reader head).

A span is a pair of tokens ``start <= end < start + max_answer_tokens``; its score is the start
logit of its first token plus the end logit of its last. The search runs over a band of width
``max_answer_tokens`` (``[B, T, m]`` scores) instead of all ``T x T`` pairs, and is exact.
"""
from __future__ import annotations

import torch


def span_band(start: torch.Tensor, end: torch.Tensor, allowed: torch.Tensor,
              max_answer_tokens: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(scores, valid, m)``: ``scores[b, s, l]`` is the span from token ``s`` to token ``s + l``
    (``l < m``, ``m = min(max_answer_tokens, T)``), ``valid`` that both ends are ``allowed`` tokens.
    Inputs are ``[B, T]``; scores are float32 and ``-inf`` where not valid."""
    batch, n = start.shape
    m = max(1, min(int(max_answer_tokens), n))
    ninf = start.new_full((batch, m - 1), float("-inf"), dtype=torch.float32)
    ends = torch.cat([end.float(), ninf], 1).unfold(1, m, 1)
    valid = torch.cat([allowed, allowed.new_zeros((batch, m - 1))], 1).unfold(1, m, 1) & allowed[:, :, None]
    scores = (start.float()[:, :, None] + ends).masked_fill(~valid, float("-inf"))
    return scores, valid, m


def best_spans(start: torch.Tensor, end: torch.Tensor, allowed: torch.Tensor,
               max_answer_tokens: int = 30) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Best ``(start, end, start + end logit)`` per row over ``allowed`` tokens with
    ``start <= end < start + max_answer_tokens``; a row with no allowed token gives ``(0, 0, -inf)``."""
    scores, _, m = span_band(start, end, allowed, max_answer_tokens)
    flat = scores.flatten(1)
    best = flat.argmax(-1)
    first = best // m
    return first, first + best % m, flat.gather(1, best[:, None])[:, 0]
