"""The service config (``serve.yaml``): typed sections, validated with errors naming the file and key."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from effrag.pipelines.base import DEFAULT_METHOD, DEFAULT_RETRIEVER


# ---------------------------------------------------------------------------- config
@dataclass
class RetrieverSection:
    kind: str = DEFAULT_RETRIEVER  # bm25 | dense | hybrid (the default), built over the corpus at startup
    sample: list[str] | None = None  # bundled sample datasets: train+dev contexts pooled
    corpus: str | None = None  # a corpus.jsonl
    index: str | None = None  # a saved index folder (`effrag index build`); overrides kind
    cache_dir: str | None = None  # dense/hybrid index cache (default: the CLI's)
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class MethodSection:
    name: str = DEFAULT_METHOD  # any registered pipeline (efficientrag, the default: the shipped system; direct-r, ...)
    k: int = 10  # passages per question for methods whose depth is not in their own config
    model: str | None = None  # a trained system: a folder or a shipped name (efficientrag-all), as eval --model
    labeler: str | None = None  # or its checkpoint folders
    filter: str | None = None
    options: dict[str, Any] = field(default_factory=dict)  # the method's options (EfficientRAGConfig fields, ...)

    def checkpoints(self) -> dict[str, Any]:
        """The checkpoint keywords the method is built with (those given)."""
        return {k: v for k, v in (("model", self.model), ("labeler", self.labeler), ("filter", self.filter))
                if v is not None}


@dataclass
class LLMSection:
    spec: str = "default"  # effrag.llm spec: default | gguf:PATH | openai:URL#MODEL
    options: dict[str, Any] = field(default_factory=dict)  # load_llm options (cache=, n_ctx=, ...)
    dataset: str | None = None  # picks the paper's QA prompt
    context: str = "chunks"  # or kept_words
    max_tokens: int = 64
    max_chunks: int | None = None


@dataclass
class ServerSection:
    host: str = "127.0.0.1"
    port: int = 8080
    max_batch: int = 32  # questions per request, and per model call
    max_top_k: int = 100
    max_question_chars: int = 2000
    batch_window_ms: float = 5.0
    max_queue: int = 1024  # pending requests before 503
    max_body_bytes: int = 1 << 20  # larger request bodies get 413, unread
    drain_s: float = 1.0  # after SIGTERM: keep answering (with Connection: close) for up to this long
    graceful_timeout_s: float = 30.0  # then wait this long for in-flight requests before cancelling them
    log_level: str = "info"


@dataclass
class ServeConfig:
    retriever: RetrieverSection = field(default_factory=RetrieverSection)
    method: MethodSection = field(default_factory=MethodSection)
    llm: LLMSection | None = None
    server: ServerSection = field(default_factory=ServerSection)
    path: str = "<dict>"


def _section(cls: type, data: Any, where: str):
    if data is None:
        return cls()
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(data).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(known)})")
    obj = cls(**data)
    for name in known:
        value, default = getattr(obj, name), getattr(cls(), name)
        if value is None or default is None:
            continue
        ok = isinstance(value, type(default)) or (type(default) is float and type(value) is int)
        if not ok or isinstance(value, bool) != isinstance(default, bool):
            raise ValueError(f"{where}.{name}: expected {type(default).__name__}, got {value!r}")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and name != "port" and \
                (value < 0 if name == "drain_s" else value <= 0):
            raise ValueError(f"{where}.{name}: must be {'>= 0' if name == 'drain_s' else 'positive'}, got {value!r}")
    return obj


def load_config(source: str | Path | dict[str, Any]) -> ServeConfig:
    """A :class:`ServeConfig` from a YAML file or a dict; errors name the file and the key."""
    import yaml

    where = "<dict>"
    if not isinstance(source, dict):
        where = str(source)
        if not Path(source).is_file():
            raise FileNotFoundError(f"serve config not found: {source}")
        try:
            source = yaml.safe_load(Path(source).read_text()) or {}
        except yaml.YAMLError as e:
            raise ValueError(f"{where}: invalid YAML: {e}") from None
        if not isinstance(source, dict):
            raise ValueError(f"{where}: expected a mapping at the top level")
    unknown = sorted(set(source) - {"retriever", "method", "llm", "server"})
    if unknown:
        raise ValueError(f"{where}: unknown section(s) {', '.join(unknown)} (known: retriever, method, llm, server)")
    llm = source.get("llm")
    cfg = ServeConfig(retriever=_section(RetrieverSection, source.get("retriever"), f"{where}: retriever"),
                      method=_section(MethodSection, source.get("method"), f"{where}: method"),
                      llm=None if llm is None else _section(LLMSection, {"spec": llm} if isinstance(llm, str) else llm,
                                                            f"{where}: llm"),
                      server=_section(ServerSection, source.get("server"), f"{where}: server"), path=where)
    r, m = cfg.retriever, cfg.method
    if isinstance(r.sample, str):
        r.sample = [r.sample]
    if r.sample is not None:
        _check_samples(r.sample, where)
    check_port(cfg.server.port, f"{where}: server.port")
    if cfg.server.log_level not in LOG_LEVELS:
        raise ValueError(f"{where}: server.log_level must be one of {', '.join(LOG_LEVELS)}, "
                         f"got {cfg.server.log_level!r}")
    if sum(x is not None for x in (r.sample, r.corpus, r.index)) != 1:
        raise ValueError(f"{where}: retriever needs exactly one of sample, corpus, index")
    from effrag.pretrained import NAMES

    model_path = m.model if m.model not in NAMES else None  # a shipped name is no path
    for key, path in (("retriever.corpus", r.corpus), ("retriever.index", r.index), ("method.model", model_path),
                      ("method.labeler", m.labeler), ("method.filter", m.filter)):
        if path is not None and not Path(path).exists():
            raise FileNotFoundError(f"{where}: {key}: {path} does not exist")
    if r.index is None and r.kind not in ("bm25", "dense", "hybrid"):
        raise ValueError(f"{where}: retriever.kind must be bm25, dense or hybrid, got {r.kind!r}")
    from effrag.pipelines import get_pipeline_class

    try:
        method = get_pipeline_class(m.name)
    except ValueError as e:
        raise ValueError(f"{where}: method.name: {e}") from None
    method.check_file_options(m.checkpoints(), m.options, where)  # the method's own rules, naming file and key
    return cfg


LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


def bundled_samples() -> list[str]:
    """Names of the bundled sample datasets (folders of effrag.data.SAMPLE_DIR with a dev.jsonl)."""
    from effrag.data import SAMPLE_DIR

    return sorted(p.name for p in SAMPLE_DIR.iterdir() if (p / "dev.jsonl").is_file())


def _check_samples(names: Any, where: str) -> None:
    """``retriever.sample`` names only bundled datasets: no paths, so nothing outside SAMPLE_DIR is read."""
    have = bundled_samples()
    if not isinstance(names, list) or not names:
        raise ValueError(f"{where}: retriever.sample: expected a list of bundled sample names ({', '.join(have)})")
    for name in names:
        if not isinstance(name, str) or name not in have:
            raise ValueError(f"{where}: retriever.sample: unknown sample dataset {name!r}; "
                             f"bundled: {', '.join(have)} (use retriever.corpus for your own file)")


def check_port(port: Any, where: str) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"{where}: port must be an integer from 0 to 65535, got {port!r}")


