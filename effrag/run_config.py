"""``effrag eval --config FILE``: a run config as input, so that a written run can be replayed (FlashRAG-style).

The file is YAML or JSON. Either a flat mapping of eval options, named as ``config.json`` records them (``method``,
``questions``, ``corpus_from``, ``retriever``, ``k``, ``limit``, ``seed``, ``method_options: {...}`` or the method's
options by name, ...; ``effrag/configs/eval.yaml`` is a documented example), or a finished run's own
``<output>/config.json``, whose ``run`` mapping (plus its ``seed``) is read the same way::

    effrag eval --config effrag/configs/eval.yaml --output runs/eval/sample
    effrag eval --config runs/eval/sample/config.json --output runs/eval/again     # the same predictions

Command-line flags override the file's values. What a run records but does not take (the corpus fingerprint and
size, checkpoint fingerprints, the method's resolved config, package versions) is read as a check: a replay over
another corpus warns. Paths are taken as recorded: absolute, relative to the working directory (else to the
repository), or under a named root (``<sample>`` the bundled sample, ``<data>``, ``<site-packages>``, ``<tmp>``,
``~``: :func:`effrag.provenance.portable_path`'s). An unknown key or a path that cannot be found is a one-line
error naming the file and the key.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

# what config.json records beside the options: compared (corpus) or only informative
RECORDED_ONLY = {"schema", "corpus_fingerprint", "corpus_size", "model_files", "method_config", "versions", "started", "ks"}
NOT_OPTIONS = {"func", "method_opts", "help", "config", "command", "verbose"}  # parser dests a file cannot set
MUST_EXIST = {"questions", "corpus_from", "corpus", "index", "answer_aliases"}  # paths read by the run
MAYBE_PATHS = {"encoder", "reader"}  # paths or names (a shipped reader, an HF encoder)
WRITTEN = {"cache_dir", "output"}  # folders a run writes: only a named root is resolved


def read(path: str | Path) -> dict[str, Any]:
    """The options of a run config file, flat (``config.json``'s ``run`` unwrapped), keys with ``_`` for ``-``."""
    import yaml

    where = Path(path)
    if not where.is_file():
        from effrag import configs

        if where.suffix or where.parent != Path(".") or str(path) not in configs.names():
            raise FileNotFoundError(f"--config {path}: no such file (nor a packaged config name: "
                                    f"{', '.join(configs.names())})")
        where = configs.path(str(path))  # a packaged config by name: `--config eval`
    try:
        data = yaml.safe_load(where.read_text(encoding="utf-8"))  # JSON is YAML
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        raise ValueError(f"{where}: not a YAML or JSON file ({' '.join(str(e).split())})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{where}: a run config is a mapping of eval options, got {type(data).__name__}")
    if isinstance(data.get("run"), dict):  # a finished run's config.json
        data = {**data["run"], **({"seed": data["seed"]} if data.get("seed") is not None else {}),
                "_recorded": True}
    return {"_file": str(where), **{str(k).replace("-", "_"): v for k, v in data.items()}}


def method_of(values: dict[str, Any]) -> str | None:
    """The file's method (its options are added to the eval parser before the file is applied)."""
    return None if values.get("method") is None else str(values["method"])


def apply(parser: argparse.ArgumentParser, values: dict[str, Any]) -> None:
    """Make the file's values ``parser``'s defaults (so command-line flags override them); a required option the
    file gives is no longer required. ``append`` options (``--k``) are filled after parsing (:func:`finish`)."""
    from effrag.pipelines.base import DEFAULT_METHOD

    file = values["_file"]
    actions = {a.dest: a for a in parser._actions if a.dest not in NOT_OPTIONS and a.dest != argparse.SUPPRESS}
    method_dests = set(parser.get_default("method_opts") or [])
    opts: dict[str, Any] = {}
    for key, value in values.items():
        if key.startswith("_") or key in RECORDED_ONLY:
            continue
        if key == "method_options":
            if not isinstance(value, dict):
                raise ValueError(f"{file}: method_options must be a mapping, got {value!r}")
            for name, v in value.items():
                name = str(name).replace("-", "_")
                if name not in method_dests:
                    raise ValueError(f"{file}: unknown key method_options.{name} (method "
                                     f"{values.get('method') or DEFAULT_METHOD} takes: "
                                     f"{', '.join(sorted(method_dests)) or 'none'})")
                opts[name] = v
        elif key == "reader" and isinstance(value, dict):  # config.json: {path, mode, context, model}
            opts.update({"reader": value.get("path"), "reader_mode": value.get("mode"),
                         "reader_context": value.get("context")})
        elif key in actions:
            opts[key] = value
        else:
            raise ValueError(f"{file}: unknown key {key!r} (eval options: {', '.join(sorted(actions))})")
    defaults, later = {}, {}
    for dest, value in opts.items():
        if value is None:  # recorded as not given: the default
            continue
        action = actions[dest]
        value = _convert(action, value, f"{file}: {dest}")
        if dest in MUST_EXIST | MAYBE_PATHS | WRITTEN or dest in method_dests:
            value = _resolve_paths(dest, value, file)
        if isinstance(action, argparse._AppendAction):
            later[dest] = value
        else:
            defaults[dest] = value
            action.required = False
    if values.get("_recorded") and "k" in later:
        later = _recorded_k(values, later)
    parser.set_defaults(**defaults, config_file=file, config_later=later,
                        config_recorded={k: values[k] for k in ("corpus_fingerprint", "corpus_size") if k in values})


def finish(args: argparse.Namespace) -> None:
    """Fill the ``append`` options the command line left out from the config file (see :func:`apply`)."""
    for dest, value in (getattr(args, "config_later", None) or {}).items():
        if getattr(args, dest, None) is None:
            setattr(args, dest, value)


def check_corpus(args: argparse.Namespace, identity: dict[str, Any]) -> None:
    """Warn when a replayed run's corpus is not the one its config.json recorded."""
    recorded = getattr(args, "config_recorded", None) or {}
    diff = [k for k, v in recorded.items() if v is not None and identity.get(k) != v]
    if diff:
        print(f"effrag: warning: {args.config_file}: the corpus differs from the recorded run's "
              f"({', '.join(f'{k} {recorded[k]} -> {identity.get(k)}' for k in diff)}); predictions may differ",
              file=sys.stderr)


# ---------------------------------------------------------------------------- values
def _convert(action: argparse.Action, value: Any, where: str) -> Any:
    many = isinstance(action, argparse._AppendAction) or action.nargs in ("+", "*")
    if action.nargs == 0:  # store_true / store_false
        if not isinstance(value, bool):
            raise ValueError(f"{where}: expected true or false, got {value!r}")
        return value
    items = (value if isinstance(value, list) else [value]) if many else [value]
    if not many and isinstance(value, (list, dict)):
        raise ValueError(f"{where}: expected one value, got {value!r}")
    out = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (str, int, float)) or \
                (action.type in (None, str) and not isinstance(item, str)):  # `limit: true`, `questions: 5`
            want = "a string" if action.type in (None, str) else f"a value for {action.metavar or action.dest}"
            raise ValueError(f"{where}: expected {want}, got {item!r}")
        if action.type is not None:
            try:
                item = action.type(str(item))
            except (argparse.ArgumentTypeError, TypeError, ValueError) as e:
                raise ValueError(f"{where}: {' '.join(str(e).split())}") from None
        if action.choices is not None and item not in action.choices:
            raise ValueError(f"{where}: {item!r} is not one of {', '.join(map(str, action.choices))}")
        out.append(item)
    return out if many else out[0]


def _recorded_k(values: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    """config.json records ``k`` (default 10) even where the command line left it out; a method whose depth lives
    in its own config (``k_in_config``) used it only when its resolved config shows that depth (or its own depth
    option was given): otherwise the replay leaves ``--k`` out too, as the run did."""
    from effrag.pipelines import DEFAULT_METHOD, get_pipeline_class

    cls = get_pipeline_class(values.get("method") or DEFAULT_METHOD)
    if not getattr(cls, "k_in_config", False):
        return later
    option = getattr(cls, "depth_option", "k")
    depth = (values.get("method_config") or {}).get(option)
    given = any((values.get("method_options") or {}).get(o) is not None for o in (option, f"{cls.name}_{option}"))
    if depth is None or given or depth == max(later["k"]):
        return later
    return {d: v for d, v in later.items() if d != "k"}


def resolve_path(text: str, where: str, *, must_exist: bool = True, repo: bool = True) -> str:
    """A recorded path as this machine finds it: ``<root>/rest`` under a named root, a relative path from the working
    directory or else (``repo``) the repository; kept as given where it is neither (``must_exist=False``: a name)."""
    from effrag.data import SAMPLE_DIR
    from effrag.provenance import path_roots, repo_root

    if text.startswith("<"):
        head, _, rest = text.partition("/")
        roots = {name: root for root, name in path_roots().items() if name.startswith("<")}
        roots["<sample>"] = str(SAMPLE_DIR)
        if head not in roots:
            raise ValueError(f"{where}: cannot resolve {text!r} ({head} names no folder here; known: "
                             f"{', '.join(sorted(roots))})")
        found = Path(roots[head]) / rest
    elif text == "~" or text.startswith("~/"):
        found = Path(text).expanduser()
    else:
        found = Path(text)
        if repo and not found.is_absolute() and not found.exists() and (repo_root() / found).exists():
            found = repo_root() / found
    if must_exist and not found.exists():
        raise FileNotFoundError(f"{where}: cannot resolve {text!r}: no such file or folder"
                                + ("" if Path(text).is_absolute() else
                                   " (relative to the working directory or the repository)"))
    return str(found) if found.exists() or text.startswith(("<", "~")) else text


def _resolve_paths(dest: str, value: Any, file: str) -> Any:
    def one(v: Any) -> Any:
        if not isinstance(v, (str, Path)):
            return v
        out = resolve_path(str(v), f"{file}: {dest}", must_exist=dest in MUST_EXIST, repo=dest not in WRITTEN)
        return Path(out) if isinstance(v, Path) else out
    return [one(v) for v in value] if isinstance(value, list) else one(value)
