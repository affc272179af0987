"""EfficientRAG's loop options: :class:`EfficientRAGConfig` (plain data, validated) and :func:`build_config`.

Its own module because the tuner (:mod:`effrag.tuning`), the service and the loop config files
(``loop-<dataset>.json``) need the options without the loop; :mod:`.efficientrag` re-exports them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

QUERY_MODES = ("merged", "per_chunk")
DEDUP_MODES = ("refill", "drop")
CHUNK_FORMATS = ("title_text", "text")
POOL_ORDERS = ("hop", "fused", "fused_logit", "rank")
POOL_SOURCES = ("continue", "seen")
CONTINUE, TERMINATE = "<Continue>", "<Terminate>"
# options that act after the loop, on its finished pools: configs differing only in these share one loop run
POOL_OPTIONS = frozenset({"pool_order", "pool_source", "retrieval_weight", "requery_weight", "max_candidates",
                          "min_candidates"})
# options added after configs were first written (left out of to_json at their defaults, so old configs still match)
_ADDED_DEFAULTS = {"int8": False, "stop_at_pool": None, "prune_last_hop": False, "requery_weight": 0.0,
                   "relabel_weight": 0.0, "query_chunks": None, "labeler_top": None}


@dataclass
class EfficientRAGConfig:
    """Loop options (tune on dev: ``scripts/tune_efficientrag.py``).

    ``max_hops`` counts retrieval rounds, hop 0 included. ``first_hop_k`` (default: ``hop_k``)
    is hop 0's depth: the question is the best query the loop has, so reading deeper there and
    letting the Labeler rank what it read costs one hop of pairs and no extra retrieval round. ``query_mode``:
    ``merged`` = all kept words of a hop form one next query (as synthesised and as in
    the paper's code); ``per_chunk`` = each <Continue> chunk spawns its own query from
    the query that found it plus its own kept words (at most ``max_branches`` per hop,
    most confident first). ``dedup``: a chunk seen in an earlier hop is never labeled
    again; ``refill`` retrieves deeper so each query still gets up to ``hop_k`` new
    chunks, ``drop`` just removes seen chunks from the top ``hop_k``.
    ``min_candidates`` (default 0, the paper) tops up a small pool with the most
    likely <Terminate> chunks; ``max_candidates`` caps the pool.
    ``pool_order`` decides which chunks survive the cap: ``hop`` (earlier hop first, then
    p(<Continue>)) or ``fused`` (p(<Continue>) + ``retrieval_weight`` x the retriever's score,
    so a chunk the retriever is sure of is not pushed out by a later hop's weak one; the
    weight depends on the retriever's score scale: tune it on dev per retriever) or ``fused_logit``
    (log-odds of p(<Continue>) + ``retrieval_weight`` x the retriever's score: a logistic model of the
    two signals, which keeps the Labeler's ranking among chunks it is very sure of).
    <Continue> chunks always rank before top-up chunks.
    ``requery_weight`` (default 0, off) adds to the fused orders ``requery_weight`` x the chunk's best retriever
    score under the later hops' queries (hop >= 1). Those queries carry what the Labeler kept (the bridge
    entity), so a chunk read at hop 0, which the question alone could not rank (the second hop's paragraph
    is often among the question's own top 20), gets the later query's evidence too. The loop already
    retrieves past the chunks it has seen (``dedup`` refill), so this costs nothing: a seen chunk the later
    query returned gets that score, one it did not return gets the lowest score that query returned (an
    upper bound), and a question whose loop stopped at hop 0 keeps its order.
    ``relabel_weight`` (default 0, off) is the same idea with the Labeler instead of the retriever: at every
    hop >= 1 the Labeler also reads each chunk of the earlier hops under that hop's queries, and the fused
    orders add ``relabel_weight`` x its best p(<Continue>) under a later query (log-odds for ``fused_logit``;
    a chunk found at a later hop counts its own p). The dense requery score only says the chunk is near the
    bridge query; the Labeler reads them together, and it was trained to tag exactly this pair (a later
    hop's gold under its query) <Continue>. It costs Labeler pairs (about one more hop-0 batch per later
    hop) and changes only the pool's order, never the loop: tags, kept words and queries stay as they were.
    Measured on MuSiQue dev with the session-14 queries: no gain (reports/efficientrag/next-query).
    ``query_chunks`` (default None: all) caps how many <Continue> chunks, most confident first, give their kept
    words to a ``merged`` next query. That brings the Filter's input nearer what it was trained on (the
    oracle kept words of one or two gold chunks): at inference a hop can continue on a dozen chunks, and
    the bridge entity drowns in their words. ``query_chunks=1`` with a lower ``filter_threshold`` (0.1-0.2:
    a richer query suits dense retrieval) gave MuSiQue dev +2 to +3 points at 10 chunks.
    Cost options (all off by default; ``scripts/bench_loop_cost.py`` measures them):
    ``int8`` runs the Labeler and Filter with int8 dynamic quantization of their Linear layers (CPU only;
    ignored, with a warning, on other devices). ``stop_at_pool`` ends a question's loop once its pool
    holds that many <Continue> chunks. ``prune_last_hop`` skips, at the last hop (when kept words feed no
    further query), chunks that cannot enter the capped pool (``pool_order`` fused/fused_logit with
    ``max_candidates``, ``pool_source`` continue): exact, the results do not change.
    ``pool_order: rank`` orders by relevance and ranks, never by a retriever's raw score, so one config
    carries across retrievers and corpus sizes: the pool ranker's logit (:class:`~effrag.models.RankerModel`,
    the Labeler's log-odds of <Continue> when the loop has no ranker) minus ``retrieval_weight`` x
    log(1 + the chunk's rank in its query's hits) minus ``requery_weight`` x log(1 + its best rank under the
    later hops' queries). ``labeler_top`` (default None: all; needs a ranker) lets the Labeler read only the
    ``labeler_top`` new chunks of each hop that the ranker scores highest: the Labeler's tags and kept words
    only steer the next query, which comes from the most confident chunks, so the rest of the hop costs one
    ranker forward each instead of two forwards.
    ``pool_source``: ``continue`` (the paper) builds the pool from <Continue> chunks (then the
    ``min_candidates`` top-up); ``seen`` ranks every chunk the Labeler read, <Continue> or not,
    in ``pool_order`` as one list, so ``max_candidates`` keeps the best-scored chunks whatever
    their tag. The tag then only steers the loop (which chunks give kept words for the next
    query); the pool is the Labeler used as a reranker of everything the loop retrieved.
    """

    hop_k: int = 10
    first_hop_k: int | None = None
    max_hops: int = 4  # as the paper's released code (MAX_ITER = 4)
    tag_threshold: float = 0.5
    token_threshold: float = 0.5
    filter_threshold: float = 0.5
    query_mode: str = "merged"
    dedup: str = "refill"
    max_branches: int = 4
    max_candidates: int | None = None
    min_candidates: int = 0
    pool_order: str = "hop"
    pool_source: str = "continue"
    retrieval_weight: float = 1.0
    requery_weight: float = 0.0
    relabel_weight: float = 0.0
    query_chunks: int | None = None
    chunk_format: str = "title_text"
    batch_size: int = 32
    labeler_max_length: int | None = None
    filter_max_length: int | None = None
    bf16: bool = False
    int8: bool = False
    stop_at_pool: int | None = None
    prune_last_hop: bool = False
    labeler_top: int | None = None

    def __post_init__(self) -> None:
        for name, allowed in (("query_mode", QUERY_MODES), ("dedup", DEDUP_MODES), ("chunk_format", CHUNK_FORMATS),
                              ("pool_order", POOL_ORDERS), ("pool_source", POOL_SOURCES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"EfficientRAGConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        for name in ("hop_k", "max_hops", "max_branches", "batch_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"EfficientRAGConfig.{name} must be >= 1, got {getattr(self, name)!r}")
        if self.first_hop_k is not None and self.first_hop_k < 1:
            raise ValueError(f"EfficientRAGConfig.first_hop_k must be >= 1 or None, got {self.first_hop_k}")
        if self.max_candidates is not None and self.max_candidates < 1:
            raise ValueError(f"EfficientRAGConfig.max_candidates must be >= 1 or None, got {self.max_candidates}")
        if self.query_chunks is not None and self.query_chunks < 1:
            raise ValueError(f"EfficientRAGConfig.query_chunks must be >= 1 or None, got {self.query_chunks}")
        if self.labeler_top is not None and self.labeler_top < 1:
            raise ValueError(f"EfficientRAGConfig.labeler_top must be >= 1 or None, got {self.labeler_top}")
        if self.stop_at_pool is not None and self.stop_at_pool < 1:
            raise ValueError(f"EfficientRAGConfig.stop_at_pool must be >= 1 or None, got {self.stop_at_pool}")
        for name in ("requery_weight", "relabel_weight"):
            if getattr(self, name) and self.pool_order == "hop":
                raise ValueError(f"EfficientRAGConfig.{name} needs pool_order fused or fused_logit, got 'hop'")
        if self.min_candidates < 0:
            raise ValueError(f"EfficientRAGConfig.min_candidates must be >= 0, got {self.min_candidates}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EfficientRAGConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown EfficientRAGConfig option(s) {unknown}; known: {sorted(known)}")
        return cls(**d)

    def replace(self, **changes: Any) -> "EfficientRAGConfig":
        return self.from_dict({**asdict(self), **changes})

    def to_json(self) -> dict[str, Any]:
        """The options as a dict; options added later (``_ADDED_DEFAULTS``) are left out at their defaults, so
        the configs written before they existed (tuning logs, run folders, loop-<dataset>.json) still match and
        resume."""
        d = asdict(self)
        return {k: v for k, v in d.items() if k not in _ADDED_DEFAULTS or v != _ADDED_DEFAULTS[k]}


def build_config(config: EfficientRAGConfig | dict | str | None = None, **overrides: Any) -> EfficientRAGConfig:
    """A config from an object, a dict or a JSON file (the tuner's ``best.json``), then non-None overrides."""
    import json
    from pathlib import Path

    if isinstance(config, (str, Path)):
        try:
            data = json.loads(Path(config).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read EfficientRAG config {config}: {e}") from None
        base = data.get("config", data)  # the tuner writes {"config": {...}, "metrics": {...}}
    else:
        base = config.to_json() if isinstance(config, EfficientRAGConfig) else dict(config or {})
    base.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return EfficientRAGConfig.from_dict(base)
    except (TypeError, ValueError) as e:
        raise ValueError(f"EfficientRAG config{f' {config}' if isinstance(config, str) else ''}: {e}") from None
