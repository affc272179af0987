"""The loaded service: retriever, method and LLM named by the config, built once at start-up."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from .config import RetrieverSection, ServeConfig


# ---------------------------------------------------------------------------- the loaded service
@dataclass
class Service:
    """What the app serves: a chunk source, an optional answer generator, and facts for /health."""

    source: Any  # effrag.integrations.ChunkSource
    generator: Any = None  # effrag.pipelines.generation.Generator
    info: dict[str, Any] = field(default_factory=dict)


def open_setup(r: RetrieverSection):
    """The corpus and retriever of the ``retriever:`` section, through the run-setup layer like every command: a
    saved index, a corpus file or folder, or the bundled samples' train + dev contexts."""
    from effrag.data import sample_path
    from effrag.setup import RunSetup

    if r.index:
        return RunSetup.build(index=r.index, retriever=None, retriever_options=r.options)
    files = []
    for ds in r.sample or ():
        for split in ("train", "dev"):
            try:
                files.append(sample_path(ds, split))
            except FileNotFoundError:
                if split == "dev":
                    raise
    # BM25 over a corpus is built in memory at start-up (faster than loading it); dense indexes are cached
    return RunSetup.build(corpus=r.corpus, corpus_from=files, retriever=r.kind, cache_dir=r.cache_dir,
                          cache=r.kind != "bm25",
                          retriever_options={**({"show_progress": False} if r.kind == "bm25" else {}), **r.options})


@contextlib.contextmanager
def _load_errors(where: str, what: str):
    """Loading errors that are not already ValueError/OSError (a torch or safetensors error on a damaged
    checkpoint, a TypeError for a bad option) become a ValueError naming the config key."""
    try:
        yield
    except (ValueError, OSError, ImportError):
        raise
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"{where}: cannot load {what}: {type(e).__name__}: {e}") from e


def _warm_up(source, path, method: str) -> None:
    """Answer one question before the service says it is ready: what loads lazily (a dense index's encoder, a
    system's ranker) and what only a request exercises (a loop config needing a model the folder lacks) fails here,
    as one start-up error, instead of failing every request after /ready (issue #46, 3)."""
    try:
        source.retrieve_batch(["warm-up question"])
    except (ValueError, OSError) as e:
        raise ValueError(f"{path}: the service cannot answer a question with method {method}: "
                         f"{' '.join(str(e).split())}") from None


def build_service(cfg: ServeConfig) -> Service:
    """Load the retriever, the method and the LLM named by ``cfg`` (slow: done once at startup)."""
    from effrag.integrations import ChunkSource
    from effrag.pipelines import get_pipeline_class

    t0 = time.perf_counter()
    r, m = cfg.retriever, cfg.method
    cls = get_pipeline_class(m.name)
    what = f"retriever.index {r.index}" if r.index else f"retriever.corpus {r.corpus}" if r.corpus else "retriever"
    with _load_errors(cfg.path, f"method {m.name}"):  # resolved once: its depth, the encoder it was tuned over
        plan = cls.plan({**m.checkpoints(), **m.options}, default_k=m.k)
    if plan.encoder and not r.index and "encoder" not in r.options:
        r = dataclasses.replace(r, options={**r.options, "encoder": plan.encoder})
    with _load_errors(cfg.path, what):
        setup = open_setup(r)
    retriever, corpus = setup.retriever, setup.corpus
    if cls.slice_k and not m.options and not m.checkpoints():  # one search (Direct-R): per-request top_k reaches the
        source = ChunkSource(retriever, k=m.k)                  # retriever, every k a prefix of the deepest
    else:  # any registered method; its depth stays in its own config when it keeps one there
        what = " / ".join(f"method.{key} {v}" for key, v in m.checkpoints().items()) or f"method {m.name}"
        with _load_errors(cfg.path, what):
            source = ChunkSource(plan.build(retriever))
    generator = None
    if cfg.llm is not None:
        from effrag.llm import load_llm
        from effrag.pipelines.generation import Generator

        generator = Generator(load_llm(cfg.llm.spec, **cfg.llm.options), dataset=cfg.llm.dataset,
                              context=cfg.llm.context, max_tokens=cfg.llm.max_tokens, max_chunks=cfg.llm.max_chunks)
    with _load_errors(cfg.path, f"method {m.name} over {what}"):
        _warm_up(source, cfg.path, m.name)
    for warning in plan.warnings(None, retriever):  # said once the service can start: an error stays one line
        logging.getLogger(__name__).warning("%s: %s", cfg.path, warning)
    from effrag.models.encoders import encoder_alias
    from effrag.setup import encoder_path

    used = encoder_path(retriever)
    info = {"method": m.name, "source": source.describe(), "retriever": getattr(retriever, "kind", cfg.retriever.kind),
            "encoder": (encoder_alias(used) or used) if used else None,
            "corpus_size": len(corpus) if corpus is not None else None,
            "corpus_fingerprint": corpus.fingerprint() if corpus is not None else None,
            "model": m.checkpoints() or None,
            "llm": cfg.llm.spec if cfg.llm else None, "load_s": round(time.perf_counter() - t0, 3)}
    return Service(source=source, generator=generator, info=info)


