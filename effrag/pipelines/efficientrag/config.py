"""EfficientRAG's loop options: :class:`EfficientRAGConfig` (plain data, validated) and :func:`build_config`.

Its own module because the tuner (:mod:`effrag.tuning`), the service and the loop config files
(``loop-<dataset>.json``) need the options without the loop; the package (:mod:`effrag.pipelines.efficientrag`) re-exports them.
Each option is declared once, as a field with its default, its :class:`Rule` (type, range, allowed values) and
its help (:func:`option`); :data:`RULES`, the CLI flags (:func:`cli_flags`) and the docs table
(:func:`options_table`) are read off the fields: a new option is one field.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from numbers import Integral, Real
from typing import Any

QUERY_MODES = ("merged", "per_chunk")
DEDUP_MODES = ("refill", "drop")
CHUNK_FORMATS = ("title_text", "text")
POOL_ORDERS = ("hop", "fused", "fused_logit", "rank")
POOL_SOURCES = ("continue", "seen")
RANK_QUERIES = ("query", "info")
CONTINUE, TERMINATE = "<Continue>", "<Terminate>"
# The three kinds of option. ``loop``: what the loop reads and writes (retrieval depth, thresholds, queries, input
# lengths). ``pool``: what acts after the loop, on its finished pools, so configs differing only in these share one
# loop run (the tuner ranks one run under many). ``runtime``: how the models run (batch size, bf16, int8), which
# changes no result beyond float rounding and which a service fixes at start-up.
GROUPS = ("loop", "pool", "runtime")


@dataclass(frozen=True)
class Rule:
    """What one loop option accepts: ``type`` (int, float, bool or str), inclusive ``min``/``max``, ``choices``,
    and whether ``None`` (JSON null: "not set") is allowed."""

    type: type
    min: float | None = None
    max: float | None = None
    choices: tuple | None = None
    optional: bool = False

    def describe(self) -> str:
        what = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}[self.type]
        if self.choices:
            what = "one of " + ", ".join(map(str, self.choices))
        elif self.min is not None and self.max is not None:
            what += f" from {self.min} to {self.max}"
        elif self.min is not None:
            what += f" >= {self.min}"
        elif self.max is not None:
            what += f" <= {self.max}"
        return what + (" (or null)" if self.optional else "")

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.optional
        if self.type is bool:
            return isinstance(value, bool)
        if self.type is int:
            ok = isinstance(value, Integral) and not isinstance(value, bool)
        elif self.type is float:
            ok = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
        else:
            ok = isinstance(value, self.type)
        return ok and (self.choices is None or value in self.choices) and \
            (self.min is None or value >= self.min) and (self.max is None or value <= self.max)




def check_options(options: Any, where: str, prefix: str = "") -> None:
    """Raise one ValueError ``"<where>: <prefix><key> must be <rule>, got <value>"`` for the first option of
    ``options`` (a dict of loop options: a loop config file's, a serve.yaml's) that is unknown or breaks its rule."""
    if not isinstance(options, dict):
        raise ValueError(f"{where}: {prefix.rstrip('.') or 'the loop options'} must be a JSON object of loop options, "
                         f"got {type(options).__name__}")
    unknown = sorted(set(options) - set(RULES))
    if unknown:
        raise ValueError(f"{where}: unknown EfficientRAGConfig option(s) {[prefix + k for k in unknown]}; "
                         f"known: {sorted(RULES)}")
    for key, value in options.items():
        if not RULES[key].accepts(value):
            raise ValueError(f"{where}: {prefix}{key} must be {RULES[key].describe()}, got {value!r}")


def option(default: Any, rule: Rule, help: str, *, group: str, since: str | None = None, flag: str | None = None,
           dest: str | None = None):
    """One loop option, declared once: its default, its :class:`Rule`, its help and its ``group`` (:data:`GROUPS`).
    :data:`RULES`, :data:`POOL_OPTIONS`, the CLI flags (:func:`cli_flags`), the service's request schema
    (:func:`request_options`: every group but ``runtime``) and the docs table (:func:`options_table`) are derived
    from these fields. ``since``: the date an option joined the config after the first loop configs were written;
    :meth:`EfficientRAGConfig.to_json` leaves such an option out at its default, so a config written before it
    existed is the same JSON as today's at that default (a tuning folder's rows resume, a run folder matches).
    ``flag``/``dest``: the command-line name where ``--<name>`` is taken by a shared option."""
    if group not in GROUPS:
        raise ValueError(f"option group must be one of {GROUPS}, got {group!r}")
    return field(default=default, metadata={"rule": rule, "help": help, "group": group, "since": since,
                                            "flag": flag, "dest": dest})


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
    ``query_chunks`` (default None: all) caps how many <Continue> chunks, most confident first, give their kept
    words to a ``merged`` next query. That brings the Filter's input nearer what it was trained on (the
    oracle kept words of one or two gold chunks): at inference a hop can continue on a dozen chunks, and
    the bridge entity drowns in their words. ``query_chunks=1`` with a lower ``filter_threshold`` (0.1-0.2:
    a richer query suits dense retrieval) gave MuSiQue dev +2 to +3 points at 10 chunks.
    ``int8`` (a cost option, off by default; ``scripts/bench_loop_cost.py`` measures it) runs the Labeler and
    Filter with int8 dynamic quantization of their Linear layers (CPU only; ignored, with a warning, on other
    devices). Three levers that no shipped config used and that measured no gain left the config on 2026-11-29:
    ``relabel_weight`` (reports/archive/efficientrag/next-query), ``prune_last_hop`` (reports/efficientrag/loop-cost,
    ``report.md``) and ``stop_at_pool`` (never chosen by a tuning run); a file naming one is refused as unknown.
    ``pool_order: rank`` orders by relevance and ranks, never by a retriever's raw score, so one config
    carries across retrievers and corpus sizes: the pool ranker's logit (:class:`~effrag.models.RankerModel`,
    the Labeler's log-odds of <Continue> when the loop has no ranker) minus ``retrieval_weight`` x
    log(1 + the chunk's rank in its query's hits) minus ``requery_weight`` x log(1 + its best rank under the
    later hops' queries). ``labeler_top`` (default None: all; needs a ranker) lets the Labeler read only the
    ``labeler_top`` new chunks of each hop that the ranker scores highest: the Labeler's tags and kept words
    only steer the next query, which comes from the most confident chunks, so the rest of the hop costs one
    ranker forward each instead of two forwards. ``rescore_top`` (default 0: off; needs a ranker) lets the ranker
    read again, under each hop >= 1 query, the chunks of earlier hops among that query's top ``rescore_top`` hits,
    and ``pool_order: rank`` takes each chunk's best logit: a second-hop paragraph is often among the question's
    own hits, where the question alone cannot tell it is relevant; the next query names the bridge entity.
    ``rank_query`` is what the ranker reads a hop >= 1 chunk under: ``query`` (default), the hop's query (the
    Filter's output), or ``info``, the Filter's input ``"<query> Info: <kept words>"``: the words the Labeler kept
    from the chunk that led here, before the Filter dropped any (it drops the bridge entity about half of the
    time on MuSiQue dev); the retriever still searches with the Filter's output.
    ``label_last_hop`` (default true): false skips the Labeler at the last hop. There its tags and kept words feed no
    further query, and with a ranker, ``pool_order: rank`` and ``pool_source: seen`` they do not order the pool
    either, so the results keep exactly their chunks and order (only the last hop's chunks carry no tag or kept
    words: a ``kept_words`` reader context gives them whole). Any other pool options would read those tags: the
    config refuses them.
    ``link_weight`` and ``backlink_weight`` (default 0: off; ``pool_order: rank`` only) add a bonus to a chunk
    whose title the text of one of the ``link_top`` (default 5) best chunks names, or whose text names one of
    their titles: the bridge paragraph is the entity the first paragraph names (:mod:`.pool`).
    ``ranker_max_length`` (default None: ``labeler_max_length``, else the ranker's trained length) cuts the ranker's
    (query, chunk) input at that many sub-tokens: the title and the first sentences, where a Wikipedia paragraph
    says what it is about. A read costs about its length, so 128 tokens cost about 0.6 of a trained-length read.
    ``pool_source``: ``continue`` (the paper) builds the pool from <Continue> chunks (then the
    ``min_candidates`` top-up); ``seen`` ranks every chunk the Labeler read, <Continue> or not,
    in ``pool_order`` as one list, so ``max_candidates`` keeps the best-scored chunks whatever
    their tag. The tag then only steers the loop (which chunks give kept words for the next
    query); the pool is the Labeler used as a reranker of everything the loop retrieved.
    """

    # ---- loop: what the loop reads and writes
    hop_k: int = option(10, Rule(int, min=1), "chunks retrieved per query per hop (default 10)", group="loop")
    first_hop_k: int | None = option(None, Rule(int, min=1, optional=True),
                                     "chunks retrieved for the question at hop 0 (default: hop_k)", group="loop")
    max_hops: int = option(4, Rule(int, min=1),  # as the paper's released code (MAX_ITER = 4)
                           "retrieval rounds, hop 0 included (default 4)", group="loop")
    tag_threshold: float = option(0.5, Rule(float, min=0, max=1),
                                  "p(<Continue>) needed to keep a chunk and go on (default 0.5)", group="loop")
    token_threshold: float = option(0.5, Rule(float, min=0, max=1), "keep probability of a chunk word (default 0.5)",
                                    group="loop")
    filter_threshold: float = option(0.5, Rule(float, min=0, max=1),
                                     "keep probability of a next-query word (default 0.5)", group="loop")
    query_mode: str = option("merged", Rule(str, choices=QUERY_MODES),
                             "merged: one next query per hop; per_chunk: one per <Continue> chunk", group="loop")
    dedup: str = option("refill", Rule(str, choices=DEDUP_MODES), "refill: up to hop_k unseen chunks per query; "
                        "drop: seen chunks just leave the top hop_k", group="loop")
    max_branches: int = option(4, Rule(int, min=1), "per_chunk mode: next queries per question per hop (default 4)",
                               group="loop")
    query_chunks: int | None = option(None, Rule(int, min=1, optional=True), "merged queries: <Continue> chunks "
                                      "(most confident first) whose kept words feed the next query (default: all)",
                                      group="loop", since="2026-11-25")
    chunk_format: str = option("title_text", Rule(str, choices=CHUNK_FORMATS),
                               "what a model reads of a chunk: title_text (default) or text", group="loop")
    labeler_max_length: int | None = option(None, Rule(int, min=1, optional=True),
                                            "Labeler input length in sub-tokens (default: the trained length)",
                                            group="loop")
    ranker_max_length: int | None = option(None, Rule(int, min=8, optional=True), "the ranker's input length in "
                                           "sub-tokens (default: labeler_max_length, else the trained length)",
                                           group="loop", since="2026-11-27")
    filter_max_length: int | None = option(None, Rule(int, min=1, optional=True),
                                           "Filter input length in sub-tokens (default: the trained length)",
                                           group="loop")
    labeler_top: int | None = option(None, Rule(int, min=1, optional=True), "with a ranker: the Labeler reads only "
                                     "each hop's N best-ranked new chunks (default: all)", group="loop",
                                     since="2026-11-26")
    rescore_top: int = option(0, Rule(int, min=0), "with a ranker: it reads again, under a later hop's query, the "
                              "earlier chunks among that query's top N hits (default 0: off)", group="loop",
                              since="2026-11-26")
    rank_query: str = option("query", Rule(str, choices=RANK_QUERIES), "with a ranker: what it reads a later hop's "
                             "chunks under, the hop's query (query) or the Filter's input, query + Info: kept words "
                             "(info)", group="loop", since="2026-11-26")
    label_last_hop: bool = option(True, Rule(bool), "false: no Labeler reads at the last hop, where with a ranker, "
                                  "pool_order rank and pool_source seen they change no result (default true)",
                                  group="loop", since="2026-11-28")
    # ---- pool: what acts on the finished pools (configs differing only here share one loop run)
    max_candidates: int | None = option(None, Rule(int, min=1, optional=True),
                                        "cap on the candidate pool (default: none)", group="pool")
    min_candidates: int = option(0, Rule(int, min=0),
                                 "top up the pool with the likeliest <Terminate> chunks (default 0)", group="pool")
    pool_order: str = option("hop", Rule(str, choices=POOL_ORDERS), "hop: earlier hop, then p(<Continue>); fused: "
                             "p(<Continue>) + weight x retrieval score; fused_logit: logit p(<Continue>) + weight x "
                             "retrieval score; rank: the ranker's logit - weight x log(1 + retrieval rank)",
                             group="pool")
    pool_source: str = option("continue", Rule(str, choices=POOL_SOURCES),
                              "continue: pool of <Continue> chunks (paper); seen: rank every chunk the Labeler read",
                              group="pool")
    retrieval_weight: float = option(1.0, Rule(float), "fused and rank orders: weight of the retriever's score or "
                                     "rank (default 1.0)", group="pool")
    requery_weight: float = option(0.0, Rule(float), "fused and rank orders: weight of a chunk's best score or rank "
                                   "under the later hops' queries (default 0: off)", group="pool", since="2026-11-25")
    link_weight: float = option(0.0, Rule(float, min=0), "rank order: bonus of a chunk whose title one of the "
                                "link_top best chunks names (default 0: off)", group="pool", since="2026-11-26")
    backlink_weight: float = option(0.0, Rule(float, min=0), "rank order: bonus of a chunk whose text names the title "
                                    "of one of the link_top best chunks (default 0: off)", group="pool",
                                    since="2026-11-26")
    link_top: int = option(5, Rule(int, min=1), "the best chunks whose links the link bonuses follow (default 5)",
                           group="pool", since="2026-11-26")
    set_ranker_top: int = option(0, Rule(int, min=0), "rank order: a set-wise model (the system's set-ranker/) "
                                 "reorders the order's first N candidates, scoring them together (default 0: off)",
                                 group="pool", since="2026-11-29")
    # ---- runtime: how the models run (fixed by a service at start-up, not per request)
    batch_size: int = option(32, Rule(int, min=1), "Labeler/Filter/ranker forward batch size (default 32)",
                             group="runtime", flag="--er-batch-size", dest="er_batch_size")
    bf16: bool = option(False, Rule(bool), "bf16 autocast for the loop's models (fp32 on CPUs without native bf16)",
                        group="runtime", flag="--er-bf16", dest="er_bf16")
    int8: bool = option(False, Rule(bool), "int8 dynamic quantization of the Labeler/Filter Linear layers (CPU)",
                        group="runtime", since="2026-11-23", flag="--er-int8")

    def __post_init__(self) -> None:
        for f in fields(self):  # type, range, allowed values: RULES
            rule = RULES.get(f.name)
            if rule is not None and not rule.accepts(getattr(self, f.name)):
                raise ValueError(f"EfficientRAGConfig.{f.name} must be {rule.describe()}, got {getattr(self, f.name)!r}")
        if self.requery_weight and self.pool_order == "hop":
            raise ValueError("EfficientRAGConfig.requery_weight needs pool_order fused, fused_logit or rank, got 'hop'")
        for name in ("link_weight", "backlink_weight"):
            if getattr(self, name) and self.pool_order != "rank":
                raise ValueError(f"EfficientRAGConfig.{name} needs pool_order rank, got {self.pool_order!r}")
        if self.set_ranker_top and self.pool_order != "rank":
            raise ValueError(f"EfficientRAGConfig.set_ranker_top needs pool_order rank, got {self.pool_order!r}")
        if not self.label_last_hop and (self.pool_order, self.pool_source) != ("rank", "seen"):
            raise ValueError("EfficientRAGConfig.label_last_hop false needs pool_order rank and pool_source seen "
                             f"(the last hop's tags order any other pool), got {self.pool_order!r} and "
                             f"{self.pool_source!r}: set label_last_hop true (--label-last-hop) with them")

    def needs_ranker(self) -> str | None:
        """The option that needs a pool ranker (``labeler_top``, or ``label_last_hop`` false), or None: the one check
        behind the loop's and the front ends' refusals."""
        if self.labeler_top is not None:
            return "labeler_top"
        return None if self.label_last_hop else "label_last_hop false"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EfficientRAGConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown EfficientRAGConfig option(s) {unknown}; known: {sorted(known)}")
        return cls(**d)

    def replace(self, **changes: Any) -> EfficientRAGConfig:
        return self.from_dict({**asdict(self), **changes})

    def to_json(self) -> dict[str, Any]:
        """The options as a dict, an option with a ``since`` date (:func:`option`) left out at its default: the
        configs written before it existed (tuning logs, run folders, loop-<dataset>.json) are the same JSON."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.metadata["since"] is None or getattr(self, f.name) != f.default}


# each option's rule, read off its field: the one check behind the CLI flags, loop config files,
# from_pretrained, the service's config and the HTTP API
RULES: dict[str, Rule] = {f.name: f.metadata["rule"] for f in fields(EfficientRAGConfig)}
# each group's options, in field order
OPTION_GROUPS: dict[str, tuple[str, ...]] = {g: tuple(f.name for f in fields(EfficientRAGConfig)
                                                      if f.metadata["group"] == g) for g in GROUPS}
# options that act after the loop, on its finished pools: configs differing only in these share one loop run
POOL_OPTIONS = frozenset(OPTION_GROUPS["pool"])


@dataclass(frozen=True)
class Flag:
    """The command-line flag of one loop option (:func:`cli_flags`)."""

    name: str  # the field
    flag: str
    dest: str
    rule: Rule
    help: str


def cli_flags() -> list[Flag]:
    """Every loop option's flag, in field order: ``--<name with dashes>`` unless the field names another."""
    return [Flag(f.name, f.metadata["flag"] or "--" + f.name.replace("_", "-"), f.metadata["dest"] or f.name,
                 f.metadata["rule"], f.metadata["help"]) for f in fields(EfficientRAGConfig)]


def request_options() -> dict[str, Rule]:
    """The options one request of a service may set (``effrag serve``'s request schema), with their rules."""
    return {f.name: f.metadata["rule"] for f in fields(EfficientRAGConfig) if f.metadata["group"] != "runtime"}


def options_table() -> str:
    """The loop options as Markdown, one table per group (name, default, accepted values, what it does): the docs'
    tables."""
    default = EfficientRAGConfig()
    titles = {"loop": "Loop options: what the loop reads and writes",
              "pool": "Pool options: what acts on the finished pools",
              "runtime": "Runtime options: how the models run (a service fixes them at start-up)"}
    out = []
    for group in GROUPS:
        rows = [f"## {titles[group]}", "", "| option | default | accepts | what it does |", "|---|---|---|---|"]
        for f in fields(EfficientRAGConfig):
            if f.metadata["group"] == group:
                rows.append(f"| `{f.name}` | `{getattr(default, f.name)!r}` | {f.metadata['rule'].describe()} | "
                            f"{f.metadata['help']} |")
        out.append("\n".join(rows) + "\n")
    return "\n".join(out)


def build_config(config: EfficientRAGConfig | dict | str | None = None, **overrides: Any) -> EfficientRAGConfig:
    """A config from an object, a dict or a JSON file (the tuner's ``best.json``), then non-None overrides."""
    import json
    from pathlib import Path

    if isinstance(config, (str, Path)):
        try:
            data = json.loads(Path(config).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read EfficientRAG config {config}: {' '.join(str(e).split())}") from None
        # the tuner writes {"config": {...}, "metrics": {...}}
        base = data.get("config", data) if isinstance(data, dict) else data
        check_options(base, str(config), "config." if base is not data else "")
        base = dict(base)
    else:
        base = config.to_json() if isinstance(config, EfficientRAGConfig) else dict(config or {})
    overrides = {k: v for k, v in overrides.items() if v is not None}
    check_options(overrides, "EfficientRAG option")
    base.update(overrides)
    try:
        return EfficientRAGConfig.from_dict(base)
    except (TypeError, ValueError) as e:
        raise ValueError(f"EfficientRAG config{f' {config}' if isinstance(config, (str, Path)) else ''}: {e}") from None
