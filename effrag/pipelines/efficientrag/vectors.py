"""A system's late-interaction chunk vectors built with an index, so questions read stored vectors at any size.

Why: a corpus past :data:`~.loop.PREPARED_CHUNKS` passages is not prepared at opening (splitting a million
passages would take minutes and gigabytes), so without stored vectors each chunk a question reads would be a
transformer forward inside that question's time. ``effrag index build --system NAME`` (or ``effrag index vectors``
over an index already built) encodes every passage once, as each of the system's loop configs reads it (its ranker,
chunk length, precision and chunk format), into ``<index>/late-vectors/``: a :class:`~effrag.models.late_vectors.
VectorStore` root beside the index. Opening the system over that index (``--index DIR``) reads from it on demand
(:func:`effrag.models.late_vectors.index_vector_store`), never prunes it, and loads nothing whole.

The build goes in parts of :data:`~effrag.models.late_vectors.SHARD_CHUNKS` passages, each written as one shard
before the next: a killed build keeps its finished parts and the next run encodes only the rest. Under
``torchrun`` / ``accelerate launch`` each process takes every ``world``-th part (parts are content-addressed, so
processes never write into one another's shards).
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def system_config_files(system: str | Path) -> list[Path]:
    """The loop config files of a system (``loop.json`` and every ``loop-<dataset>.json``)."""
    from .system import system_root

    root = system_root(system)
    return sorted(p for p in root.glob("loop*.json") if p.is_file())


def build_system_vectors(system: str | Path, retriever: Any, passages: Sequence[Any], root: str | Path,
                         rank: int = 0, world: int = 1, progress: bool = True) -> dict[str, Any]:
    """Encode every passage's late vectors into ``root`` for each distinct way the system's loop configs read
    them. Returns the variants built, the chunks ``encoded`` and ``found`` (stored before) and the seconds."""
    from effrag.models.late_vectors import KEEP_MARKER, shard_chunks
    from effrag.state_files import write_text_atomic

    from .pipeline import EfficientRAGPipeline

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    write_text_atomic(root / KEEP_MARKER, "shards of an index (effrag index build --system): never pruned\n")
    t0 = time.perf_counter()
    seen: set[tuple] = set()
    out = {"variants": [], "encoded": 0, "found": 0, "passages": len(passages)}
    for config in system_config_files(system) or [None]:
        pipe = EfficientRAGPipeline(retriever, model=system, er_config=str(config) if config else None,
                                    prepare=False, vector_store=False)
        loop = pipe.loop
        model = loop._model(loop.ranker) if loop.ranker is not None else None
        if not hasattr(model, "index"):
            continue  # this config ranks with a cross-encoder (or not at all): nothing to store
        cfg, length = loop.config, loop._ranker_length()
        store = model.vector_store(root, cfg.bf16, length)
        key = (store.folder, cfg.chunk_format)
        if key in seen:
            continue
        seen.add(key)
        step = shard_chunks()
        parts = [i for n, i in enumerate(range(0, len(passages), step)) if n % world == rank]
        from tqdm.auto import tqdm

        with tqdm(total=len(parts) * step, desc=f"late vectors ({store.folder.name})", unit="chunk",
                  disable=not progress, mininterval=5) as bar:
            for i in parts:
                words = loop._chunk_words(list(passages[i: i + step]))
                made = model.index(words, batch_size=cfg.batch_size, bf16=cfg.bf16, max_length=length, store=store,
                                   load=False)
                loop._words.clear()  # nothing of a million passages is held: each part is written, then dropped
                out["encoded"] += made["encoded"]
                out["found"] += made["loaded"]
                bar.update(step)
        out["variants"].append({"folder": store.folder.name, "config": config.name if config else None,
                                **store.variant})
    return {**out, "seconds": time.perf_counter() - t0}
