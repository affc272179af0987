"""The files of a training checkpoint: safetensors and JSON, written and read without pickle.

Why not accelerate's ``save_state``/``load_state``: it keeps the optimizer, the schedule, the RNG
states and registered objects as pickles and reads them back with ``torch.load(weights_only=False)``,
so whoever can put a file into a checkpoint folder (a shared disk, a copied run) runs code in the
next resume. A checkpoint written here holds only formats whose readers cannot run code::

    model.safetensors             the model's weights (encoder + heads, unwrapped)
    optimizer.safetensors         the optimizer's tensors; its param groups and layout in the header
    scheduler.json                the LR schedule
    scaler.json                   the fp16 loss scaler (mixed_precision fp16 only)
    rng_state_<rank>.safetensors  python, numpy and torch (CUDA) RNG of each process
    config.yaml                   the run's settings (read with yaml.safe_load)
    trainer_state.json            written last and atomically: the loop's position, the loss being
                                  averaged, the sampler, accelerate's step counter, and ``files``:
                                  size and sha256 of every file above

:func:`check_checkpoint` is what a resume trusts: it refuses, with one line naming the file, a
trainer state that does not parse, a checkpoint of the old pickle format, a file in the folder that
the checkpoint was not saved with (a planted ``custom_checkpoint_0.pkl``), and a file whose size or
sha256 changed (``effrag.integrity``). Nothing in a checkpoint folder is ever unpickled: the loader
opens only the names above, with safetensors and JSON.

Nested state (optimizer and scheduler state dicts, RNG tuples) is stored as a JSON tree whose
tensors and numpy arrays live in the safetensors file beside it (:func:`save_state_file`), so every
value, dict key type and tuple comes back exactly: a resumed run stays bit-identical.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..integrity import ENV, IntegrityError, record_files, short_error, verify_files
from ..state_files import write_text_atomic

FORMAT = 2  # 1: accelerate's save_state (pickles), never loaded
STATE_NAME = "trainer_state.json"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
SCHEDULER_FILE = "scheduler.json"
SCALER_FILE = "scaler.json"
REQUIRED = (MODEL_FILE, OPTIMIZER_FILE, SCHEDULER_FILE)
PICKLE_SUFFIXES = (".pkl", ".bin", ".pt", ".pth", ".pickle")
_TREE_KEY = "effrag_state"
REFUSED = "not resuming from it (--overwrite trains from step 0)"


class CheckpointError(IntegrityError):
    """A training checkpoint that is not resumed from: unreadable, of the pickle format, planted files, changed bytes."""


def rng_file(rank: int) -> str:
    return f"rng_state_{rank}.safetensors"


# ---------------------------------------------------------------------------- nested state <-> JSON + tensors
def _encode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        key = str(len(tensors))
        tensors[key] = obj.detach().cpu().contiguous()
        return {"__tensor__": key}
    if isinstance(obj, np.ndarray):
        key = str(len(tensors))
        tensors[key] = torch.from_numpy(np.ascontiguousarray(obj).copy())
        return {"__ndarray__": key}
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [_encode(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj) and not any(k.startswith("__") for k in obj):
            return {k: _encode(v, tensors) for k, v in obj.items()}
        return {"__items__": [[_encode(k, tensors), _encode(v, tensors)] for k, v in obj.items()]}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (np.integer, np.floating, np.bool_)):
        return obj.item()
    raise TypeError(f"cannot store a {type(obj).__name__} in a checkpoint without pickle")


def _decode(tree: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(tree, list):
        return [_decode(v, tensors) for v in tree]
    if not isinstance(tree, dict):
        return tree
    if len(tree) == 1:
        (tag, value), = tree.items()
        if tag == "__tensor__":
            return tensors[value]
        if tag == "__ndarray__":
            return tensors[value].numpy()
        if tag == "__tuple__":
            return tuple(_decode(v, tensors) for v in value)
        if tag == "__items__":
            return {_decode(k, tensors): _decode(v, tensors) for k, v in value}
    return {k: _decode(v, tensors) for k, v in tree.items()}


def save_state_file(path: Path, obj: Any) -> None:
    """``obj`` (nested dicts, lists, tuples, numbers, strings, tensors, numpy arrays) as ``.json`` or ``.safetensors``."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    tree = _encode(obj, tensors)
    if path.suffix == ".json":
        if tensors:
            raise TypeError(f"{path.name}: state with tensors goes into a .safetensors file")
        write_text_atomic(path, json.dumps(tree))
    else:
        save_file(tensors, str(path), metadata={_TREE_KEY: json.dumps(tree)})


def load_state_file(path: Path) -> Any:
    """What :func:`save_state_file` wrote; an unreadable file is a :class:`CheckpointError` naming it."""
    from safetensors import SafetensorError, safe_open

    try:
        if path.suffix == ".json":
            return _decode(json.loads(path.read_text()), {})
        with safe_open(str(path), framework="pt") as f:
            tree = json.loads((f.metadata() or {})[_TREE_KEY])
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        return _decode(tree, tensors)
    except (OSError, UnicodeDecodeError, ValueError, KeyError, SafetensorError) as e:
        raise CheckpointError(f"{path}: cannot be read ({short_error(e)}); {REFUSED}") from None


def _weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU copies safetensors accepts: tied tensors (one storage under two names) are stored twice."""
    out, seen = {}, set()
    for k, v in state.items():
        t = v.detach().cpu().contiguous()
        ptr = (t.untyped_storage().data_ptr(), t.storage_offset()) if t.numel() else None
        out[k] = t.clone() if ptr in seen else t
        seen.add(ptr)
    return out


# ---------------------------------------------------------------------------- RNG
def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------------- write and read
def write_checkpoint(ckpt: Path, accelerator, model, optimizer, scheduler) -> None:
    """Every process calls this: the main process writes weights, optimizer, schedule (and scaler), each
    process its RNG state. :func:`seal_checkpoint` then makes it a checkpoint."""
    from safetensors.torch import save_file

    if accelerator.is_main_process:
        shutil.rmtree(ckpt, ignore_errors=True)  # a partial save of the same step: no stray files
        ckpt.mkdir(parents=True)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        save_file(_weights(accelerator.unwrap_model(model).state_dict()), str(ckpt / MODEL_FILE), metadata={"format": "pt"})
        save_state_file(ckpt / OPTIMIZER_FILE, optimizer.state_dict())
        save_state_file(ckpt / SCHEDULER_FILE, scheduler.state_dict())
        if accelerator.scaler is not None:
            save_state_file(ckpt / SCALER_FILE, accelerator.scaler.state_dict())
    save_state_file(ckpt / rng_file(accelerator.process_index), rng_state())
    accelerator.wait_for_everyone()


def seal_checkpoint(ckpt: Path, state: dict) -> None:
    """Main process, last: ``trainer_state.json`` with the size and sha256 of every file, written atomically
    (a folder without it is an incomplete checkpoint, skipped)."""
    names = [p.name for p in ckpt.iterdir() if p.is_file() and p.name not in (STATE_NAME, STATE_NAME + ".tmp")]
    full = {**state, "format": FORMAT, "files": record_files(ckpt, names)}
    write_text_atomic(ckpt / STATE_NAME, json.dumps(full, indent=2))


def check_checkpoint(ckpt: Path) -> dict:
    """The trainer state of ``ckpt`` once every file is as saved; else a one-line :class:`CheckpointError`.

    Hashes are checked in full (a checkpoint is read whole anyway) unless ``EFFRAG_VERIFY`` says otherwise.
    """
    ckpt = Path(ckpt)
    state_file = ckpt / STATE_NAME
    try:
        state = json.loads(state_file.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{state_file}: unreadable ({short_error(e)}); {REFUSED}") from None
    if not isinstance(state, dict) or not all(isinstance(state.get(k), int)
                                              for k in ("global_step", "epoch", "batch_in_epoch")):
        raise CheckpointError(f"{state_file}: not a trainer state (global_step, epoch, batch_in_epoch); {REFUSED}")
    files = state.get("files")
    present = sorted(p.name for p in ckpt.iterdir() if p.name != STATE_NAME)
    if files is None:
        pickles = [n for n in present if n.endswith(PICKLE_SUFFIXES)]
        raise CheckpointError(f"{ckpt / (pickles[0] if pickles else STATE_NAME)}: a checkpoint of the old format "
                              "(accelerate's pickles, which can run code when loaded); never unpickled: " + REFUSED)
    if not isinstance(files, dict) or not all(isinstance(r, dict) and isinstance(r.get("size"), int)
                                              and isinstance(r.get("sha256"), str) for r in files.values()):
        raise CheckpointError(f"{state_file}: field 'files' is not a list of size and sha256 records; {REFUSED}")
    stray = [n for n in present if n not in files]
    if stray:
        raise CheckpointError(f"{ckpt / stray[0]}: not a file this checkpoint was saved with (planted or stray; "
                              f"checkpoint files are never unpickled); {REFUSED}")
    missing = [n for n in REQUIRED if n not in files]
    if missing:
        raise CheckpointError(f"{ckpt / missing[0]}: not recorded in {STATE_NAME}; {REFUSED}")
    try:
        verify_files(ckpt, files, None if os.environ.get(ENV) else "full", what="training checkpoint", fix=REFUSED)
    except IntegrityError as e:
        raise CheckpointError(str(e)) from None
    return state


def read_checkpoint(ckpt: Path, accelerator, model, optimizer, scheduler) -> None:
    """Restore what :func:`write_checkpoint` saved (after :func:`check_checkpoint`): weights, optimizer,
    schedule, scaler and this process's RNG (a process without its own RNG file keeps its RNG, with a warning)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        weights = load_file(str(ckpt / MODEL_FILE))
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{ckpt / MODEL_FILE}: cannot be read ({short_error(e)}); {REFUSED}") from None
    bad = next((name for name, t in weights.items() if t.is_floating_point() and not bool(t.isfinite().all())), None)
    if bad is not None:  # what from_pretrained refuses, resume refuses too (records can be rewritten with the file)
        raise CheckpointError(f"{ckpt / MODEL_FILE}: tensor {bad} holds NaN/Inf values (a diverged run or a damaged "
                              f"file); {REFUSED}")
    try:
        accelerator.unwrap_model(model).load_state_dict(weights)
        optimizer.load_state_dict(load_state_file(ckpt / OPTIMIZER_FILE))
        scheduler.load_state_dict(load_state_file(ckpt / SCHEDULER_FILE))
    except (RuntimeError, KeyError, ValueError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{ckpt}: does not fit this run's model or optimizer ({short_error(e)}); {REFUSED}") \
            from None
    if accelerator.scaler is not None and (ckpt / SCALER_FILE).is_file():
        accelerator.scaler.load_state_dict(load_state_file(ckpt / SCALER_FILE))
    rng = ckpt / rng_file(accelerator.process_index)
    if rng.is_file():
        set_rng_state(load_state_file(rng))
    else:
        print(f"warning: {rng} not found: process {accelerator.process_index} keeps its own RNG", flush=True)
