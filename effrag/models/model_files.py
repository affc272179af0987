"""The files of a saved model folder (``save_pretrained``) and the checks made before trusting them.

What is recorded in ``effrag_config.json`` under ``files`` (size and sha256, :mod:`effrag.integrity`):
the weight files, ``config.json`` and the tokenizer's files. Why the last two: a folder without its
``tokenizer.json`` loads in transformers with a fallback vocabulary of a handful of tokens (every word
becomes ``[UNK]``), and a ``config.json`` with another ``hidden_size`` builds an encoder the weights do
not fit; neither fails loudly on its own. Folders saved before these records existed (the records
hold only the weights) still load: their tokenizer files must be there and parse, and config.json
must fit the weights' shapes, each failure one line naming the file.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from ..integrity import CorruptFileError, IntegrityError, short_error
from ..state_files import write_text_atomic

CONFIG_NAME = "effrag_config.json"
HEADS_NAME = "heads.safetensors"
WEIGHTS_NAME = "model.safetensors"  # the encoder's weights (one file; sharded encoders: WEIGHT_PATTERNS)
ENCODER_CONFIG = "config.json"
REDOWNLOAD = "re-download or re-train the checkpoint"
# Weight files whose size and sha256 go into effrag_config.json (sharded encoders: shards + their index).
WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json")
# What every effrag model folder's tokenizer has (effrag needs fast tokenizers, saved as tokenizer.json).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def recorded_names(path: Path, tokenizer_files=()) -> list[str]:
    """The files of a folder just saved whose records go into ``files``: weights, config.json, tokenizer."""
    names = {p.name for pat in WEIGHT_PATTERNS for p in path.glob(pat)}
    names |= {Path(f).name for f in tokenizer_files if (path / Path(f).name).is_file()}
    names |= {n for n in (ENCODER_CONFIG, *TOKENIZER_FILES) if (path / n).is_file()}
    return sorted(names)


def is_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a saved effrag model folder (it holds :data:`CONFIG_NAME`), as opposed to an encoder to
    start from or an empty folder."""
    return (Path(path) / CONFIG_NAME).is_file()


def fingerprint(path: str | Path, with_options: bool = False) -> str | None:
    """Short hash of a checkpoint's recorded weight-file hashes (:data:`CONFIG_NAME` ``files``; with
    ``with_options``, its options too, e.g. a reader's tuned decoding): part of a tuning folder's setup or
    an eval run's config, so that a model retrained (or retuned) at the same path never resumes the old
    model's rows. Only the weight files count: a retrained model has new weights, and the records of
    config.json and the tokenizer, added later, leave the fingerprints of earlier checkpoints as they were.
    None for a folder that is no checkpoint or records no files."""
    import fnmatch
    import hashlib

    try:
        meta = json.loads((Path(path) / CONFIG_NAME).read_text())
        files = meta.get("files")
        if isinstance(files, dict):  # file records other than weights left out (a vote folder's members are kept)
            files = {k: v for k, v in files.items()
                     if not (isinstance(v, dict) and "sha256" in v) or any(fnmatch.fnmatch(k, p) for p in WEIGHT_PATTERNS)}
    except (OSError, ValueError, AttributeError):
        return None
    if not files:
        return None
    what = {"files": files, "options": meta.get("options")} if with_options else files
    return hashlib.sha1(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def update_effrag_config(path: str | Path, *, options: dict | None = None, **fields) -> dict:
    """Rewrite a checkpoint's :data:`CONFIG_NAME` with ``options`` merged into its options and ``fields`` set
    (e.g. a reader's tuned decoding and how it was tuned); the weights are untouched. Written beside and renamed:
    a kill leaves the old file or the new one."""
    path = Path(path)
    meta = read_effrag_config(path)
    meta["options"] = {**meta.get("options", {}), **(options or {})}
    meta.update(fields)
    write_text_atomic(path / CONFIG_NAME, json.dumps(meta, indent=2, default=str) + "\n")
    return meta


def read_effrag_config(path: str | Path) -> dict:
    f = Path(path) / CONFIG_NAME
    if not f.is_file():
        raise FileNotFoundError(f"{f} not found: {path} is not an effrag model directory")
    try:
        meta = json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{f}: invalid JSON ({short_error(e)})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{f}: expected a JSON object")
    for key in ("model_type", "options"):
        if key not in meta:
            raise ValueError(f"{f}: missing field {key!r}")
    return meta


def check_tokenizer_files(path: Path) -> None:
    """Refuse a folder whose tokenizer files are missing or not JSON (checked whatever ``verify`` says)."""
    for name in TOKENIZER_FILES:
        f = path / name
        if not f.is_file():
            raise IntegrityError(f"{f}: file of the checkpoint is missing (without it the tokenizer is not the "
                                 f"trained one: transformers falls back to a near-empty vocabulary); {REDOWNLOAD}")
        try:
            json.loads(f.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise CorruptFileError(f"{f}: corrupted tokenizer file ({short_error(e)}); {REDOWNLOAD}") from None


def load_encoder_config(path: Path):
    """``config.json`` of a model folder; an unreadable one is one error naming it."""
    from transformers import AutoConfig

    f = path / ENCODER_CONFIG
    if not f.is_file():
        raise IntegrityError(f"{f}: file of the checkpoint is missing; {REDOWNLOAD}")
    try:
        return AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CorruptFileError(f"{f}: unusable encoder config ({short_error(e)}); {REDOWNLOAD}") from None


def check_config_fits_weights(path: Path, config, skip=(HEADS_NAME,)) -> None:
    """Compare the tensor shapes the encoder built from ``config.json`` would have with those stored in the
    weight files' headers (nothing is loaded): a changed ``hidden_size`` is one error naming config.json,
    before transformers prints its mismatch report."""
    from safetensors import SafetensorError, safe_open
    from transformers import AutoModel

    with torch.device("meta"):
        try:
            expected = {k: tuple(v.shape) for k, v in AutoModel.from_config(config).state_dict().items()}
        except Exception as e:  # noqa: BLE001 - a config transformers cannot build a model from
            raise CorruptFileError(f"{path / ENCODER_CONFIG}: cannot build its encoder ({short_error(e)}); "
                                   f"{REDOWNLOAD}") from None
    for f in sorted(path.glob("*.safetensors")):
        if f.name in skip:
            continue
        try:
            with safe_open(str(f), framework="pt") as st:
                stored = {k: tuple(st.get_slice(k).get_shape()) for k in st.keys()}
        except (SafetensorError, OSError):
            continue  # unreadable weights are reported, naming the file, where they are loaded
        for key, shape in stored.items():
            name = key[: -len(".__int8")] if key.endswith(".__int8") else key  # compact int8 rows keep the shape
            if name in expected and expected[name] != shape:
                raise IntegrityError(f"{path / ENCODER_CONFIG}: does not fit the weights in {f.name} (tensor {name} "
                                     f"is {list(shape)} there, {list(expected[name])} by config.json); {REDOWNLOAD}")


PICKLE_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt")


def require_safetensors(path: str | Path, what: str = "model") -> None:
    """Refuse, before anything opens it, a model folder whose weights are only pickle-based files
    (``pytorch_model.bin``, ``.pt``): effrag reads safetensors only (issue #46). One IntegrityError naming the file."""
    from ..integrity import IntegrityError

    path = Path(path)
    if not path.is_dir() or any(path.glob("*.safetensors")) or any(path.glob("*.safetensors.index.json")):
        return
    pickles = sorted(f for f in path.iterdir() if f.suffix in PICKLE_WEIGHTS)
    if pickles:
        raise IntegrityError(f"{pickles[0]}: effrag loads {what} weights from safetensors files only (this folder has "
                             f"no *.safetensors); convert it with save_pretrained(..., safe_serialization=True)")


def unreadable_safetensors(path: Path) -> Path | None:
    """The first ``*.safetensors`` file in ``path`` whose header does not read back, if any."""
    from safetensors import SafetensorError, safe_open

    for f in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(f), framework="pt"):
                pass
        except (SafetensorError, OSError):
            return f
    return None


def check_finite(module: nn.Module, where) -> None:
    """Refuse NaN/Inf in any floating-point parameter of ``module`` (loaded from ``where``)."""
    from ..integrity import NonFiniteWeightsError

    for name, p in module.named_parameters():
        if p.is_floating_point() and not bool(torch.isfinite(p).all()):
            n_bad = int((~torch.isfinite(p)).sum())
            raise NonFiniteWeightsError(
                f"{where}: tensor {name} holds {n_bad} NaN/Inf value(s) of {p.numel()}; the checkpoint is "
                f"corrupted or was saved from a diverged run; {REDOWNLOAD}")
