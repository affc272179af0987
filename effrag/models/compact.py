"""Compact encoder storage: weight-only int8, for shipping trained checkpoints small.

A checkpoint directory normally holds the fine-tuned encoder as ``model.safetensors`` (fp32). For
models that ship inside the package (:mod:`effrag.pretrained`) it may instead hold
``model.int8.safetensors``: every 2-D float tensor (embeddings and linear weights, 98% of a MiniLM's
parameters) as int8 with one fp16 absmax scale per row, every other tensor (biases, LayerNorms) as
fp32. That is a quarter of the size; loading dequantizes back to fp32, so inference code and speed
are unchanged. Per-row int8 keeps each weight within 0.4% of its row's largest value; the
retrieval figures of the shipped model are measured with the dequantized weights (see its model card).
"""
from __future__ import annotations

from pathlib import Path

import torch

COMPACT_NAME = "model.int8.safetensors"
_Q, _SCALE = ".__int8", ".__scale"


def quantize_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with each 2-D float tensor split into ``<name>.__int8`` and ``<name>.__scale``."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        t = t.detach().cpu()
        if t.is_floating_point() and t.dim() == 2:
            w = t.float()
            scale = (w.abs().amax(dim=1, keepdim=True) / 127.0).clamp_min(1e-12)
            out[name + _Q] = torch.round(w / scale).clamp(-127, 127).to(torch.int8).contiguous()
            out[name + _SCALE] = scale.to(torch.float16).contiguous()
        else:
            out[name] = (t.float() if t.is_floating_point() else t).contiguous()
    return out


def dequantize_state_dict(stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`quantize_state_dict` (fp32 tensors)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in stored.items():
        if name.endswith(_SCALE):
            continue
        if name.endswith(_Q):
            base = name[: -len(_Q)]
            if base + _SCALE not in stored:
                raise ValueError(f"{COMPACT_NAME}: tensor {base!r} has int8 values but no scale")
            out[base] = t.float() * stored[base + _SCALE].float()
        else:
            out[name] = t
    return out


def save_compact_encoder(encoder, path: str | Path, state: dict[str, torch.Tensor] | None = None) -> Path:
    """Write ``encoder``'s weights (or ``state``, e.g. gathered ZeRO-3 weights) as
    ``<path>/model.int8.safetensors``, its config.json beside it."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    encoder.config.save_pretrained(path)
    target = path / COMPACT_NAME
    # one metadata key: a byte-identical file on every export (several keys are written in hash order)
    save_file(quantize_state_dict(state if state is not None else encoder.state_dict()), str(target), metadata={"format": "pt"})
    return target


def load_compact_encoder(path: str | Path, config, **kwargs):
    """The encoder of a directory holding ``model.int8.safetensors``, dequantized to fp32."""
    from safetensors.torch import load_file
    from transformers import AutoModel

    path = Path(path)
    encoder = AutoModel.from_config(config, dtype=torch.float32, **kwargs)
    state = dequantize_state_dict(load_file(str(path / COMPACT_NAME)))
    missing, unexpected = encoder.load_state_dict(state, strict=False)
    buffers = {n for n, _ in encoder.named_buffers()}
    missing = [m for m in missing if m not in buffers]
    if missing or unexpected:
        raise ValueError(f"{path / COMPACT_NAME} does not match the {config.model_type} encoder of {path}/config.json: "
                         f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    return encoder.eval()


def has_compact_encoder(path: str | Path) -> bool:
    path = Path(path)
    return (path / COMPACT_NAME).is_file() and not (path / "model.safetensors").is_file()
