"""Encoder + classification heads, and the checkpoint format they share.

Design (why a plain ``nn.Module`` and not a ``PreTrainedModel`` subclass): the
encoder stays an unmodified Hugging Face ``AutoModel``, so any encoder family
(DeBERTa-v2/v3, ELECTRA, BERT/MiniLM, RoBERTa) works without per-family code and
transformers 5's loading machinery is used only for what it is built for. A
checkpoint directory is self-describing and loads offline::

    config.json, model.safetensors   the fine-tuned encoder (AutoModel.from_pretrained(dir) works)
    heads.safetensors                the effrag heads (token_head.*, chunk_head.*)
    tokenizer.json, tokenizer_config.json, ...
    effrag_config.json               model type, label names, max_length, loss options, training config,
                                     and ``files``: size and sha256 of the weight files, config.json
                                     and the tokenizer files (:mod:`.model_files`)

Loading checks those files against ``files`` (cheaply by default, fully with
``verify="full"`` or ``EFFRAG_VERIFY=full``, see :mod:`effrag.integrity`), turns an
unreadable safetensors, tokenizer or config file into a one-line
:class:`~effrag.integrity.CorruptFileError` naming it, refuses a config.json the weights do
not fit and NaN/Inf weights (:class:`~effrag.integrity.NonFiniteWeightsError`).
Checkpoints saved before ``files`` was recorded load without the hash check.

The BERT pooler is kept (so saved encoders reload without "newly initialised"
warnings) but frozen: it is unused, and a trainable unused parameter would break
DDP's gradient bucketing.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn
from transformers.utils import ModelOutput

from ..integrity import CorruptFileError, record_files, short_error, verify_files
from .backbones import bidirectional_mask, is_decoder_backbone, layer_list, prepare_decoder
from .encoders import ENCODER_ALIASES, resolve_encoder  # noqa: F401 (re-exported)
from .model_files import (  # noqa: F401 (re-exported)
    CONFIG_NAME,
    HEADS_NAME,
    REDOWNLOAD,
    check_config_fits_weights,
    check_finite,
    check_tokenizer_files,
    load_encoder_config,
    read_effrag_config,
    recorded_names,
    unreadable_safetensors,
)
from .tokenization import IGNORE

FORMAT_VERSION = 1


# Config attribute names that hold the attention / hidden dropout, by encoder family.
_ATTN_DROPOUT = ("attention_probs_dropout_prob", "attention_dropout")
_HIDDEN_DROPOUT = ("hidden_dropout_prob", "dropout")


def load_tokenizer(path: str):
    from transformers import AutoConfig, AutoTokenizer

    kwargs = {"local_files_only": True}
    try:
        if AutoConfig.from_pretrained(path, local_files_only=True).model_type in {"roberta", "longformer", "bart", "gpt2"}:
            kwargs["add_prefix_space"] = True  # byte-level BPE needs it for pre-split words
    except (OSError, ValueError):
        pass
    return AutoTokenizer.from_pretrained(path, **kwargs)


def masked_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``hidden`` [B, T, H] over positions where ``mask`` [B, T] is 1 (padding excluded)."""
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)


class TokenHead(nn.Module):
    """Per-token 2-way classifier (useless=0 / useful=1)."""

    def __init__(self, hidden: int, dropout: float, n_labels: int = 2):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.proj = nn.Linear(hidden, n_labels)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(self.dropout(hidden))


class ChunkHead(nn.Module):
    """2-way classifier on the attention-masked mean of the sequence (<Terminate>=0 / <Continue>=1)."""

    def __init__(self, hidden: int, dropout: float, n_labels: int = 2):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.proj = nn.Linear(hidden, n_labels)

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.proj(self.dropout(masked_mean(hidden, mask)))


@dataclass
class TaggerOutput(ModelOutput):
    loss: torch.Tensor | None = None
    token_loss: torch.Tensor | None = None
    tag_loss: torch.Tensor | None = None
    token_logits: torch.Tensor | None = None
    tag_logits: torch.Tensor | None = None


DEFAULT_OPTIONS = {
    "max_length": 256,
    "head_dropout": 0.1,
    "token_weight": 1.0,
    "tag_weight": 1.0,
    "token_class_weights": [1.0, 1.0],
}


class EncoderWithHeads(nn.Module):
    """Base of the word taggers: an AutoModel encoder, heads built by subclasses, save/load."""

    model_type: ClassVar[str] = ""
    label_names: ClassVar[dict[str, list[str]]] = {}
    default_options: ClassVar[dict] = DEFAULT_OPTIONS  # subclasses with more options extend this

    def __init__(self, encoder, tokenizer, options: dict | None = None):
        super().__init__()
        unknown = set(options or {}) - set(self.default_options)
        if unknown:
            raise ValueError(f"unknown {self.model_type} option(s): {sorted(unknown)}; known: {sorted(self.default_options)}")
        self.options = {**self.default_options, **(options or {})}
        self.encoder = encoder
        self.tokenizer = tokenizer
        self.training_config: dict | None = None
        self.base_encoder: str | None = None  # the packaged encoder alias it descends from (set by the builders)
        self._forward_keys = _accepted_inputs(encoder)
        self.bidirectional = is_decoder_backbone(encoder.config)  # a decoder LM: drop the causal mask
        if self.bidirectional:
            prepare_decoder(encoder)
        pooler = getattr(encoder, "pooler", None)
        if pooler is not None:
            pooler.requires_grad_(False)
        weights = torch.tensor(self.options["token_class_weights"], dtype=torch.float)
        self.register_buffer("token_class_weights", weights, persistent=False)
        self.build_heads(encoder.config.hidden_size, float(self.options["head_dropout"]))

    # -- subclass hooks -------------------------------------------------------------------------
    def build_heads(self, hidden: int, dropout: float) -> None:
        raise NotImplementedError

    @property
    def max_length(self) -> int:
        return int(self.options["max_length"])

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    # -- shared pieces of forward ---------------------------------------------------------------
    def encode_hidden(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        mask = bidirectional_mask(attention_mask) if self.bidirectional else attention_mask
        kwargs = {"input_ids": input_ids, "attention_mask": mask}
        if token_type_ids is not None and "token_type_ids" in self._forward_keys:
            kwargs["token_type_ids"] = token_type_ids
        return self.encoder(**kwargs).last_hidden_state

    def token_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        loss = nn.functional.cross_entropy(
            logits.float().view(-1, logits.size(-1)), labels.view(-1),
            weight=self.token_class_weights.to(logits.device), ignore_index=IGNORE, reduction="sum",
        )
        # weighted mean over labelled positions; a batch with none contributes 0, not NaN
        w = self.token_class_weights.to(logits.device)[labels.clamp(min=0)] * (labels != IGNORE)
        return loss / w.sum().clamp(min=1e-8)

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_encoder(
        cls,
        name_or_path: str,
        options: dict | None = None,
        attention_dropout: float | None = None,
        hidden_dropout: float | None = None,
        gradient_checkpointing: bool = False,
    ):
        """New heads on a pretrained encoder (alias, local dir, or locally cached hub id)."""
        from transformers import AutoConfig

        path = resolve_encoder(name_or_path)
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        _set_dropout(config, attention_dropout, hidden_dropout)
        encoder = _load_encoder(path, config)
        check_finite(encoder, path)
        if gradient_checkpointing:
            encoder.gradient_checkpointing_enable()
        model = cls(encoder, load_tokenizer(path), options)
        model.base_encoder = name_or_path.lower() if name_or_path.lower() in ENCODER_ALIASES else None
        return model

    @classmethod
    def from_pretrained(cls, path: str | Path, attention_dropout: float | None = None,
                        hidden_dropout: float | None = None, verify: str | None = None):
        """Load a directory written by :meth:`save_pretrained` (offline).

        ``verify``: how much of the recorded files (weights, config.json, tokenizer) to check against
        the hashes recorded at save time, ``"cheap"`` (default, or ``$EFFRAG_VERIFY``), ``"full"`` or ``"off"``. A mismatch
        is an :class:`~effrag.integrity.IntegrityError`; NaN/Inf weights are always refused.
        """
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        path = Path(path)
        meta = read_effrag_config(path)
        if meta["model_type"] != cls.model_type:
            raise ValueError(f"{path}/{CONFIG_NAME}: model_type is {meta['model_type']!r}, expected {cls.model_type!r}")
        verify_files(path, meta.get("files"), verify, what="checkpoint", fix=REDOWNLOAD,
                     record_hint="load it and save_pretrained it again to record them")
        check_tokenizer_files(path)  # also for checkpoints saved before their hashes were recorded
        config = load_encoder_config(path)
        check_config_fits_weights(path, config)
        _set_dropout(config, attention_dropout, hidden_dropout)
        try:
            encoder = _load_encoder(str(path), config, use_safetensors=True)
        except (SafetensorError, OSError, RuntimeError) as e:
            if isinstance(e, FileNotFoundError) or "does not appear to have a file" in str(e):
                raise
            bad = unreadable_safetensors(path)
            what = f"file {bad}" if bad else f"encoder weights in {path}"
            raise CorruptFileError(f"corrupted {what} ({short_error(e)}); {REDOWNLOAD}") from None
        try:
            tokenizer = load_tokenizer(str(path))
        except Exception as e:  # noqa: BLE001 - tokenizers' own errors (e.g. an unknown model variant)
            raise CorruptFileError(f"{path / 'tokenizer.json'}: the tokenizer cannot be loaded ({short_error(e)}); "
                                   f"{REDOWNLOAD}") from None
        model = cls(encoder, tokenizer, meta.get("options"))
        model.training_config = meta.get("training")
        model.base_encoder = meta.get("base_encoder")
        try:
            heads = load_file(str(path / HEADS_NAME))
        except SafetensorError as e:
            raise CorruptFileError(f"corrupted file {path / HEADS_NAME} ({short_error(e)}); {REDOWNLOAD}") from None
        expected = {k for k in model.state_dict() if not k.startswith("encoder.")}
        if set(heads) != expected:
            raise ValueError(f"{path / HEADS_NAME}: head tensors {sorted(heads)} do not match {sorted(expected)}")
        model.load_state_dict(heads, strict=False)
        check_finite(model, path)
        return model

    def base_encoder_alias(self) -> str | None:
        """The packaged encoder (an :data:`ENCODER_ALIASES` name) this model was trained from, if it was: a compact
        copy stores the tensors training left unchanged (frozen ones) by reference to it."""
        if self.base_encoder:  # recorded at save since 2026-11-27; a student started from a checkpoint inherits it
            return self.base_encoder
        name = str(((self.training_config or {}).get("config") or {}).get("model", {}).get("name_or_path", ""))
        return name.lower() if name.lower() in ENCODER_ALIASES else None

    def keep_first_layers(self, n: int) -> None:
        """Cut the encoder to its first ``n`` transformer layers (a smaller, faster student: a 2-layer MiniLM reads a
        pair in a third of the 6-layer time). The embeddings and heads are kept; training then adapts them."""
        layers = layer_list(self.encoder)
        if not 1 <= n <= len(layers):
            raise ValueError(f"num_layers must be between 1 and {len(layers)} (the encoder's layers), got {n}")
        del layers[n:]
        self.encoder.config.num_hidden_layers = n

    def save_pretrained(self, path: str | Path, state_dict: dict | None = None, training: dict | None = None,
                        compact: bool = False) -> None:
        """Write encoder, heads, tokenizer and ``effrag_config.json`` into ``path``.

        ``state_dict`` lets a distributed trainer pass the gathered weights (ZeRO-3). ``compact=True``
        stores the encoder as int8 rows (:mod:`.compact`, for checkpoints shipped in the package).
        """
        from safetensors.torch import save_file

        from .compact import save_compact_encoder

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        sd = state_dict if state_dict is not None else self.state_dict()
        enc = {k[len("encoder."):]: v for k, v in sd.items() if k.startswith("encoder.")}
        heads = {k: v.detach().contiguous().cpu() for k, v in sd.items() if not k.startswith("encoder.")}
        if compact:
            (path / "model.safetensors").unlink(missing_ok=True)
            save_compact_encoder(self.encoder, path, enc, base=self.base_encoder_alias())
        else:
            self.encoder.save_pretrained(path, state_dict=enc)
        save_file(heads, str(path / HEADS_NAME))
        tokenizer_files = self.tokenizer.save_pretrained(path)
        if training is not None:
            self.training_config = training
        from ..provenance import portable

        # a record that ships or is committed: paths relative to the repo or a named root, never this machine's
        self.training_config = portable(self.training_config) if self.training_config is not None else None
        meta = {
            "format_version": FORMAT_VERSION,
            "model_type": self.model_type,
            "encoder_model_type": self.encoder.config.model_type,
            "label_names": self.label_names,
            "max_length": self.max_length,
            "options": self.options,
            "base_encoder": self.base_encoder_alias(),
            "training": self.training_config,
            "files": record_files(path, recorded_names(path, tokenizer_files)),
        }
        from ..state_files import write_text_atomic

        write_text_atomic(path / CONFIG_NAME, json.dumps(meta, indent=2, default=str) + "\n")


def forward_batches(model: EncoderWithHeads, features: list[dict], batch_size: int, bf16: bool,
                    run=None):
    """Run ``model`` over feature dicts (``input_ids`` ...) in length-sorted, padded batches, in eval mode.

    Yields ``(indices, output)`` per batch (``indices`` into ``features``); the model's training mode
    is restored afterwards. Callers run it under ``torch.inference_mode``. The one home of eval
    mode, batching, device placement and bf16 autocast for every model's ``predict``. ``run(batch)`` makes a
    batch's output (default ``model(**batch)``), for a model whose inference is not its training ``forward``.
    """
    from ..hardware import resolve_bf16
    from .tokenization import length_batches, pad_batch

    was_training = model.training
    model.eval()
    device = model.device
    bf16 = resolve_bf16(bf16, device.type)
    try:
        for idx in length_batches([len(f["input_ids"]) for f in features], batch_size):
            batch = pad_batch([features[i] for i in idx], model.tokenizer.pad_token_id)
            batch.pop("labels", None)
            batch = {k: v.to(device) for k, v in batch.items()}
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                yield idx, model(**batch) if run is None else run(batch)
    finally:
        model.train(was_training)


def predict_batches(model: EncoderWithHeads, encoded: list, batch_size: int, bf16: bool, what: str):
    """:func:`forward_batches` over word-labelled inputs, with each input word's keep probability.

    Yields ``(item_index, row, output, word_probs)`` for each item, where ``word_probs``
    is the keep probability of each input word (0 for words cut by ``max_length``),
    then notes how many items were truncated (:func:`note_truncation`). Shared by every word-labelling
    model's ``predict``.
    """
    for idx, out in forward_batches(model, [e.features() for e in encoded], batch_size, bf16):
        p_tok = out.token_logits.float().softmax(-1)[..., 1].cpu().tolist()  # one conversion per batch
        for row, i in enumerate(idx):
            p_row = p_tok[row]
            probs = [p_row[p] if p >= 0 else 0.0 for p in encoded[i].word_positions]
            yield i, row, out, probs
    note_truncation(model, what, [e.truncated for e in encoded])


@dataclass
class TruncationTally:
    """Inputs a model has read in this process, how many were cut at ``max_length``, and the words cut."""

    inputs: int = 0
    truncated: int = 0
    words: int = 0


def note_truncation(model: nn.Module, what: str, truncated: list[int]) -> None:
    """Count the truncated inputs of one ``predict`` call in ``model.truncation`` (a :class:`TruncationTally`).

    EfficientRAG calls ``predict`` once per hop and batch, hundreds of times a run: the first call that
    truncates logs one warning for the model, every later one a debug line with the running totals.
    """
    tally = model.__dict__.setdefault("truncation", TruncationTally())
    cut = sum(t > 0 for t in truncated)
    first = cut and not tally.truncated
    tally.inputs, tally.truncated, tally.words = tally.inputs + len(truncated), tally.truncated + cut, \
        tally.words + sum(truncated)
    if not cut:
        return
    log = logging.getLogger(type(model).__module__)
    if not first:
        log.debug("%s: %d of %d inputs truncated at max_length, %d words got probability 0 (so far %d of %d inputs)",
                  what, cut, len(truncated), sum(truncated), tally.truncated, tally.inputs)
    else:
        log.warning("%s: inputs longer than max_length %s are truncated, the words cut get probability 0 (%d of the "
                    "first %d; later counts are logged at debug level)", what, getattr(model, "max_length", "?"),
                    cut, tally.inputs)


def _load_encoder(path: str, config, use_safetensors: bool | None = None):
    """The encoder in fp32; decoder LMs with SDPA attention, the one that honours a bidirectional 4-D mask.

    ``use_safetensors=True`` for effrag checkpoints (always saved as safetensors): a ``pytorch_model.bin``
    put beside them is never read."""
    from transformers import AutoModel

    from .compact import has_compact_encoder, load_compact_encoder

    kwargs = {"attn_implementation": "sdpa"} if is_decoder_backbone(config) else {}
    if has_compact_encoder(path):  # a shipped checkpoint: int8 weights, dequantized to fp32
        return load_compact_encoder(path, config, **kwargs)
    from .model_files import require_safetensors

    require_safetensors(path, "encoder")  # model.name_or_path: a folder with only pytorch_model.bin is refused
    return AutoModel.from_pretrained(path, config=config, local_files_only=True, dtype=torch.float32,
                                     use_safetensors=use_safetensors, **kwargs)


def _set_dropout(config, attention: float | None, hidden: float | None) -> None:
    for names, value in ((_ATTN_DROPOUT, attention), (_HIDDEN_DROPOUT, hidden)):
        if value is None:
            continue
        hit = [n for n in names if hasattr(config, n)]
        if not hit:
            raise ValueError(f"{config.model_type} config has none of {names} to set dropout on")
        for n in hit:
            setattr(config, n, float(value))


def _accepted_inputs(encoder) -> set[str]:
    import inspect

    return set(inspect.signature(encoder.forward).parameters)
