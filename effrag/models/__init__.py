"""effrag models on any HF encoder: EfficientRAG's Labeler (token + chunk heads) and Filter (token head), IRRR,
SearChain's extractive reader.

``load_model(dir)`` opens any effrag checkpoint directory by its ``effrag_config.json``. What a checkpoint folder
holds is this package's knowledge alone: ``is_checkpoint(dir)``, ``fingerprint(dir)`` (its weights' recorded hashes),
``update_effrag_config(dir, ...)`` and the file names (``CONFIG_NAME``, ``HEADS_NAME``, ``WEIGHTS_NAME``).
"""
from __future__ import annotations

from pathlib import Path

from .filter import FilterModel
from .heads import CONFIG_NAME, ENCODER_ALIASES, EncoderWithHeads, read_effrag_config, resolve_encoder
from .irrr import IRRRModel
from .labeler import LabelerModel
from .late_ranker import LateRankerModel
from .model_files import HEADS_NAME, WEIGHTS_NAME, fingerprint, is_checkpoint, update_effrag_config
from .ranker import RankerModel
from .reader import ExtractiveReader, load_reader_checkpoint
from .reader_vote import ReaderVote, load_reader
from .tokenization import IGNORE, encode_pairs, encode_singles, pad_batch

MODEL_TYPES: dict[str, type[EncoderWithHeads]] = {"labeler": LabelerModel, "filter": FilterModel, "irrr": IRRRModel,
                                                   "reader": ExtractiveReader, "reader_vote": ReaderVote,
                                                   "ranker": RankerModel,
                                                   "late_ranker": LateRankerModel}


def register_model(cls: type[EncoderWithHeads]) -> type[EncoderWithHeads]:
    """Make a model class loadable by :func:`load_model` (other methods, e.g. IRRR, register theirs)."""
    MODEL_TYPES[cls.model_type] = cls
    return cls


def load_model(path: str | Path, **kwargs) -> EncoderWithHeads:
    """Load a saved effrag model of any registered type."""
    meta = read_effrag_config(path)
    cls = MODEL_TYPES.get(meta["model_type"])
    if cls is None:
        raise ValueError(f"{Path(path) / CONFIG_NAME}: unknown model_type {meta['model_type']!r}; known: {sorted(MODEL_TYPES)}")
    return cls.from_pretrained(path, **kwargs)


__all__ = [
    "LabelerModel", "FilterModel", "RankerModel", "LateRankerModel", "IRRRModel", "ExtractiveReader", "ReaderVote", "load_reader", "load_reader_checkpoint", "EncoderWithHeads", "load_model", "register_model",
    "MODEL_TYPES", "CONFIG_NAME", "HEADS_NAME", "WEIGHTS_NAME", "is_checkpoint", "fingerprint", "update_effrag_config",
    "read_effrag_config",
    "resolve_encoder", "ENCODER_ALIASES", "encode_pairs", "encode_singles", "pad_batch", "IGNORE",
]
