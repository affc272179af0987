"""In-process LLM through transformers (``hf:`` specs), with requests from many threads batched together.

Why a second in-process backend: llama.cpp's portable CPU build processes SmolLM2-135M prompts at
~100-160 tokens/s on 2 cores, while PyTorch's GEMMs on the same weights, dequantized, reach ~400 (fp32)
and ~550 (int8 dynamic quantization) tokens/s, and batched decoding multiplies generation throughput
(``scripts/bench_llm.py``, ``reports/llm/``). The weights are the same GGUF file, read by
transformers' GGUF loader (``gguf`` package), or any Hugging Face causal-LM folder.

Batching: every :meth:`_generate` call (one per :meth:`LLM.chat`) becomes a row of a queue; one worker
thread waits up to ``window_s`` for up to ``max_batch`` rows with the same generation settings and
decodes them together (left padding). ``max_concurrency`` is ``max_batch``, so ``chat_many`` and the
LLM methods' ``run_batch`` (questions in threads) fill the batches. Greedy outputs do not depend on the
batch (up to floating-point ties); sampled outputs depend on the batch's composition.

Precision: ``fp32``, ``bf16`` (fast only on GPUs and CPUs with AMX / AVX512-BF16), ``int8`` (CPU:
torch dynamic quantization of the Linear layers, per-channel weights; the tied embedding/LM head stays
fp32) or ``auto``: bf16 on a GPU or a native-bf16 CPU, else fp32. int8 is opt-in: its activations are
quantized per tensor, over the whole batch, so an int8 answer can change with its batch mates.
transformers has no grammar: a request with ``json_schema`` is answered by llama.cpp on the same GGUF
file (grammar-constrained, one at a time); for a model folder it raises :class:`LLMRequestError`.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from effrag.paths import llm_models_dir

from .base import LLM, LLMRequestError, LLMUnavailableError
from .cache import ResponseCache

log = logging.getLogger(__name__)
PRECISIONS = ("auto", "fp32", "bf16", "int8")


def resolve_precision(precision: str, device: str) -> str:
    """The precision ``auto`` stands for on ``device`` (others are returned as given, after checking)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "int8":
        import torch

        if device != "cpu" or "fbgemm" not in torch.backends.quantized.supported_engines:
            raise ValueError(f"precision int8 needs a CPU with PyTorch's fbgemm engine (device {device})")
    if precision != "auto":
        return precision
    from effrag.hardware import cpu_has_native_bf16

    return "bf16" if device != "cpu" or cpu_has_native_bf16() else "fp32"


def quantize_int8(model):
    """``model`` with its Linear layers (not the LM head) as int8 dynamic-quantized layers, in place."""
    import warnings

    import torch
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    spec = {name: per_channel_dynamic_qconfig for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and name != "lm_head"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notices
        return quantize_dynamic(model, spec, dtype=torch.qint8, inplace=True)


def converted_dir(gguf_file: Path) -> Path:
    """Where a GGUF file's dequantized copy is kept: ``$EFFRAG_CACHE_DIR`` or ``~/.cache/effrag``, ``llm-models/``."""
    return llm_models_dir() / f"{gguf_file.stem}-{gguf_file.stat().st_size}"


def dequantized_folder(gguf_file: Path) -> Path:
    """A Hugging Face folder with ``gguf_file`` dequantized to fp32, converted on first use (~25 s, ~540 MB for
    SmolLM2-135M) so later loads take about a second instead of re-reading the GGUF every time."""
    from effrag.models.backbones import CONVERTED_MARKER, load_dequantized_gguf, save_converted

    from .gguf import check_gguf_file

    check_gguf_file(gguf_file)
    out = converted_dir(gguf_file)
    if (out / CONVERTED_MARKER).is_file():
        return out
    import torch
    from transformers.utils import logging as hf_logging

    log.info("dequantizing %s into %s (once)", gguf_file, out)
    hf_logging.disable_progress_bar()
    try:
        model, tok = load_dequantized_gguf(gguf_file, torch.float32)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise LLMUnavailableError(f"hf:{gguf_file}: transformers could not read it "
                                  f"({' '.join(str(e).split())[:300]})") from e
    finally:
        hf_logging.enable_progress_bar()
    out.parent.mkdir(parents=True, exist_ok=True)
    return save_converted(model, tok, gguf_file, out, {"dtype": "torch.float32", "purpose": "llm"})


def load_causal_lm(path: str | os.PathLike, precision: str = "auto", device: str | None = None):
    """(model, tokenizer, resolved precision, device) for a ``.gguf`` file or a Hugging Face model folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    prec = resolve_precision(precision, device)
    if path.is_file():
        folder = dequantized_folder(path)
    elif (path / "config.json").is_file():
        from ..models.model_files import require_safetensors

        require_safetensors(path, "LLM")
        folder = path
    else:
        raise FileNotFoundError(f"hf LLM: {path} is neither a .gguf file nor a model folder with config.json")
    from ..integrity import check_first_use
    from ..models.model_files import check_finite

    # a model folder carries no hash of its own: damage after effrag's first read of it is refused in one line
    check_first_use(sorted(folder.glob("*.safetensors")), "LLM", "re-download the model (or delete the dequantized "
                    "folder, which effrag makes again from the GGUF)")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            str(folder), local_files_only=True, dtype=torch.bfloat16 if prec == "bf16" else torch.float32)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise LLMUnavailableError(f"hf:{path}: transformers could not load {folder} "
                                  f"({' '.join(str(e).split())[:300]})") from e
    finally:
        hf_logging.enable_progress_bar()
    check_finite(model, folder)  # damage that the first use already saw: NaN/Inf weights, refused before any answer
    model = model.to(device).eval()
    if prec == "int8":
        model = quantize_int8(model)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model, tok, prec, device


class _Row:
    __slots__ = ("messages", "params", "seed", "future")

    def __init__(self, messages, params, seed):
        self.messages, self.params, self.seed, self.future = messages, params, seed, Future()


class TransformersBackend(LLM):
    kind = "transformers"

    def __init__(
        self,
        model_path: str | os.PathLike | None = None,
        *,
        precision: str = "auto",
        device: str | None = None,
        max_batch: int = 8,
        window_s: float = 0.02,
        n_ctx: int = 4096,
        seed: int = 0,
        repeat_penalty: float = 1.1,
        cache: ResponseCache | str | bool | None = True,
    ):
        super().__init__(cache=cache)
        if max_batch < 1 or window_s < 0 or n_ctx < 16:
            raise ValueError(f"need max_batch >= 1, window_s >= 0, n_ctx >= 16 (got {max_batch}, {window_s}, {n_ctx})")
        if model_path is None:
            from .gguf import default_gguf_path

            model_path = default_gguf_path()
        self.model_path = Path(model_path)
        t0 = time.perf_counter()
        self.model, self.tokenizer, self.precision, self.device = load_causal_lm(self.model_path, precision, device)
        self.load_s = time.perf_counter() - t0
        self.max_batch = self.max_concurrency = int(max_batch)
        self.window_s, self.n_ctx, self.seed, self.repeat_penalty = float(window_s), int(n_ctx), seed, repeat_penalty
        size = self.model_path.stat().st_size if self.model_path.is_file() else 0
        self._model_id = f"{self.model_path.name}:{size}:{self.precision}"
        self.stats = {"batches": 0, "rows": 0, "largest_batch": 0}
        self._grammar = None  # GGUFBackend for json_schema requests, made on the first one
        self._queue: queue.Queue = queue.Queue()
        self._worker = threading.Thread(target=self._serve, name="effrag-hf-llm", daemon=True)
        self._worker.start()

    @property
    def model_id(self) -> str:
        return self._model_id

    def _extra_params(self) -> dict[str, Any]:
        return {"repeat_penalty": self.repeat_penalty}

    def _grammar_backend(self):
        """llama.cpp on the same GGUF file, for json_schema requests (transformers has no grammar)."""
        if self._grammar is None:
            if self.model_path.suffix != ".gguf":
                raise LLMRequestError(f"hf:{self.model_path}: json_schema requests need a grammar, which only the "
                                      "gguf: and openai: backends have (this model is no GGUF file)")
            from .gguf import GGUFBackend

            try:
                self._grammar = GGUFBackend(self.model_path, n_ctx=self.n_ctx, seed=self.seed,
                                            repeat_penalty=self.repeat_penalty, cache=False)
            except ImportError as e:
                raise LLMRequestError(f"json_schema requests go to llama.cpp, which is not installed ({e})") from e
        return self._grammar

    # ------------------------------------------------------------------ requests
    def _generate(self, messages: list[dict[str, str]], params: dict[str, Any]) -> list[dict[str, Any]]:
        if params["json_schema"] is not None:
            return self._grammar_backend()._generate(messages, params)
        base_seed = params["seed"] if params["seed"] is not None else self.seed
        rows = [_Row(messages, params, base_seed + i) for i in range(params["n"])]
        for r in rows:
            self._queue.put(r)
        out = [r.future.result() for r in rows]
        if len(out) > 1:  # the prompt was processed n times: LLM.chat counts it on the first completion
            out[0]["prompt_tokens"] = sum(o["prompt_tokens"] for o in out)
        return out

    def _serve(self) -> None:
        """The worker: gather rows for up to ``window_s`` (at most ``max_batch``), decode each settings group."""
        while True:
            rows = [self._queue.get()]
            deadline = time.monotonic() + self.window_s
            while len(rows) < self.max_batch:
                try:
                    rows.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            groups: dict[tuple, list[_Row]] = {}
            for r in rows:
                p = r.params
                key = (p["temperature"], p["max_tokens"], tuple(p["stop"] or ()))
                groups.setdefault(key, []).append(r)
            for group in groups.values():
                try:
                    results = self._decode(group)
                except Exception as e:  # noqa: BLE001 - the calling threads get the error
                    if len(group) > 1:  # one bad row must not fail its batch mates: retry one by one
                        for r in group:
                            try:
                                r.future.set_result(self._decode([r])[0])
                            except Exception as e1:  # noqa: BLE001
                                r.future.set_exception(e1)
                    else:
                        group[0].future.set_exception(e)
                    continue
                for r, res in zip(group, results):
                    r.future.set_result(res)

    # ------------------------------------------------------------------ decoding
    def _prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        tok = self.tokenizer
        if tok.chat_template:
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
            return list(ids)
        text = "\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\nassistant:"
        return tok(text, add_special_tokens=True)["input_ids"]

    def _decode(self, rows: list[_Row]) -> list[dict[str, Any]]:
        import torch

        p = rows[0].params
        prompts = [self._prompt_ids(r.messages) for r in rows]
        for ids in prompts:
            if len(ids) + p["max_tokens"] > self.n_ctx:
                raise LLMRequestError(f"{self.model_path.name} (n_ctx={self.n_ctx}): the prompt has {len(ids)} "
                                      f"tokens; with max_tokens={p['max_tokens']} it exceeds the context")
        pad = self.tokenizer.pad_token_id
        width = max(len(ids) for ids in prompts)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompts], device=self.device)
        sample = p["temperature"] > 0
        kwargs: dict[str, Any] = {"max_new_tokens": p["max_tokens"], "do_sample": sample, "pad_token_id": pad,
                                  "repetition_penalty": self.repeat_penalty, "top_k": None, "top_p": None}
        if sample:
            kwargs["temperature"] = p["temperature"]
            torch.manual_seed(rows[0].seed)
        if p["stop"]:
            kwargs.update(stop_strings=p["stop"], tokenizer=self.tokenizer)
        with torch.inference_mode():
            out = self.model.generate(input_ids=input_ids, attention_mask=mask, **kwargs)
        self.stats["batches"] += 1
        self.stats["rows"] += len(rows)
        self.stats["largest_batch"] = max(self.stats["largest_batch"], len(rows))
        eos = set(self._eos_ids())
        results = []
        for ids, gen in zip(prompts, out[:, width:].tolist()):
            finish = "length"
            for j, t in enumerate(gen):
                if t in eos:
                    gen, finish = gen[:j], "stop"
                    break
            text = self.tokenizer.decode(gen, skip_special_tokens=True)
            for s in p["stop"] or ():
                at = text.find(s)
                if at >= 0:
                    text, finish = text[:at], "stop"
            results.append({"text": text, "prompt_tokens": len(ids), "completion_tokens": len(gen),
                            "finish_reason": finish})
        return results

    def _eos_ids(self) -> list[int]:
        cfg = getattr(self.model, "generation_config", None)
        eos = getattr(cfg, "eos_token_id", None)
        if eos is None:
            eos = self.tokenizer.eos_token_id
        ids = eos if isinstance(eos, (list, tuple)) else [eos]
        return [i for i in ids if i is not None]
