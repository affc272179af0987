"""Package layout rules (issue #17): no import cycles inside ``effrag``, and one direction between packages.

Read from the source with ``ast`` (every ``import`` statement, deferred ones inside functions included),
so a cycle hidden behind a lazy import is still a cycle.
"""
from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules() -> dict[str, Path]:
    out = {}
    for f in (ROOT / "effrag").rglob("*.py"):
        parts = f.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _imports(name: str, path: Path) -> set[str]:
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found |= {target} | {f"{target}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_effrag_has_no_import_cycles():
    mods = _modules()
    graph = {m: {t for t in _imports(m, f) if t in mods and t != m} for m, f in mods.items()}
    assert _cycles(graph) == []


# The packages' order, as docs/architecture.md states it: a module imports from its own layer or those below, never
# from one above (the package root, ``effrag``, is the public namespace: it may name anything).
LAYERS = (
    ("text", "jsonl", "paths", "provenance", "integrity", "hardware", "data", "state_files", "batching", "configs"),
    ("retrieval", "models", "llm", "prompts", "setup", "pretrained"),
    ("training", "pipelines"),
    ("evaluation", "tuning"),
    ("cli_args", "cli", "codec_cli", "retrieve_cli", "run_config", "serve", "integrations", "api", "quickstart",
     "headline"),
)


def _layer(module: str) -> int | None:
    top = module.split(".")[1] if "." in module else None
    return next((i for i, names in enumerate(LAYERS) if top in names), None)


def test_every_effrag_module_has_a_layer_and_imports_no_layer_above_its_own():
    mods = _modules()
    assert [m for m in mods if m != "effrag" and _layer(m) is None] == []  # a new package is placed in LAYERS
    upward = sorted((m, t) for m, f in mods.items() if m != "effrag"
                    for t in _imports(m, f) if t in mods and t != "effrag" and _layer(t) > _layer(m))
    assert upward == []
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert all(f"`{name}`" in doc for names in LAYERS for name in names)  # the doc states the same order


def test_cycle_finder_finds_a_planted_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_effrag_imports_neither_scripts_nor_data_synthesis():
    offenders = {}
    for m, f in _modules().items():
        bad = {t for t in _imports(m, f) if t.split(".")[0] in ("scripts", "data_synthesis")}
        if bad:
            offenders[m] = bad
    assert not offenders, offenders  # the quickstart runs `effrag synthesize` through the CLI's subcommand list


# ---------------------------------------------------------------------- imports by name: strings and registries
OUTSIDE = ("scripts", "data_synthesis")


def _string_imports(path: Path) -> set[str]:
    """Module names a file loads by name: ``importlib.import_module("x.y")`` / ``__import__`` arguments, and every
    ``"x.y:func"`` / ``"x.y"`` string naming a module of the project's top-level packages (a registry entry)."""
    found = set()
    tops = ("effrag", *OUTSIDE)
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) and \
                isinstance(node.args[0].value, str):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if name in ("import_module", "__import__", "find_spec"):
                found.add(node.args[0].value)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value.split(":", 1)[0]
            if text.split(".")[0] in tops and "." in text and " " not in text and "/" not in text:
                found.add(text)
    return found


def test_string_imports_test_finds_a_planted_one(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('import importlib\nSUB = ["data_synthesis.cli:add_x_parser"]\n'
                 'importlib.import_module("scripts.bench")\nNOTE = "see data_synthesis for details"\n')
    assert _string_imports(f) == {"data_synthesis.cli", "scripts.bench"}


def test_effrag_loads_nothing_outside_itself_by_name_either():
    offenders = {m: bad for m, f in _modules().items()
                 if (bad := {t for t in _string_imports(f) if t.split(".")[0] in OUTSIDE})}
    assert not offenders, offenders  # other packages' commands come in through the effrag.commands entry points


# ---------------------------------------------------------------------- no path to the checkout around the package
# The library takes its paths as arguments: it never finds the repository from its own file to reach train.py,
# configs/ or scripts/ (issue #49), which an installed package does not have. A recipe that runs checkout files is a
# script under scripts/.
CHECKOUT_FILE = re.compile(r"^(?:\./)?(?:scripts/[\w./-]+\.(?:py|sh)|train\.py)$")  # a file to run, not a sentence
# provenance.repo_root names the checkout only to write paths relative to it (portable_path); installed, the cwd
ALLOWED_ROOTS = {("effrag.provenance", 'here = Path(__file__).resolve().parents[1]')}


def _checkout_paths(path: Path, package_depth: int) -> list[str]:
    """Where a module reaches the checkout around the package: ``Path(__file__)`` walked up (``.parents[N]``,
    ``.parent`` chains) past the package's top folder, ``package_depth`` folders above the file; and a string that
    is the path of a checkout file to run (``scripts/tune_reader.py``, ``train.py``)."""
    text = path.read_text(encoding="utf-8")
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and CHECKOUT_FILE.match(node.value):
            found.append(f"{node.lineno}: {node.value!r}")
        up, inner = None, node
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "parents" \
                and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int):
            up, inner = node.slice.value + 1, node.value.value
        elif isinstance(node, ast.Attribute) and node.attr == "parent":
            up = 0
            while isinstance(inner, ast.Attribute) and inner.attr == "parent":
                up, inner = up + 1, inner.value
        if up and up > package_depth and any(isinstance(n, ast.Name) and n.id == "__file__" for n in ast.walk(inner)):
            found.append(f"{node.lineno}: {ast.get_source_segment(text, node)}")
    return found


def test_checkout_path_finder_finds_the_old_recipe(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('import subprocess, sys\nfrom pathlib import Path\n'
                 'REPO = Path(__file__).resolve().parents[2]\nUP = Path(__file__).parent.parent.parent\n'
                 'DATA = Path(__file__).resolve().parent / "sample"\nHERE = Path(__file__).parents[1]\n'
                 'STEP = ("scripts/tune_reader.py", "--write")\nCMD = ["accelerate", "launch", "train.py"]\n'
                 'HINT = "train it first (bash scripts/train_efficientrag.sh all)"\n'
                 'subprocess.run([sys.executable, *STEP], cwd=REPO)\n')
    # as effrag/training/install.py was (two folders below the repository): its root, its scripts, its train.py
    assert _checkout_paths(f, 2) == ["3: Path(__file__).resolve().parents[2]", "4: Path(__file__).parent.parent.parent",
                                     "7: 'scripts/tune_reader.py'", "8: 'train.py'"]
    assert _checkout_paths(f, 1)[:3] == ["3: Path(__file__).resolve().parents[2]",
                                         "4: Path(__file__).parent.parent.parent", "6: Path(__file__).parents[1]"]


def test_effrag_holds_no_path_to_the_checkout():
    offenders, allowed_seen = {}, set()
    for m, f in _modules().items():
        lines = f.read_text(encoding="utf-8").splitlines()
        found = []
        for hit in _checkout_paths(f, len(f.relative_to(ROOT).parts) - 1):
            line = lines[int(hit.split(":")[0]) - 1]
            ok = {(mod, t) for mod, t in ALLOWED_ROOTS if mod == m and t in line}
            allowed_seen |= ok
            if not ok:
                found.append(hit)
        if found:
            offenders[m] = found
    assert not offenders, offenders  # take the path as an argument; a recipe running checkout files is a script
    assert allowed_seen == ALLOWED_ROOTS  # an exception that no longer exists is dropped from the list


def test_the_name_based_registries_name_modules_of_effrag_that_exist():
    """The CLI's subcommands, the pipeline registry and the framework adapters are resolved by name at run time:
    every name is an effrag module (a file here), never one of another package."""
    from effrag import cli, integrations
    from effrag.pipelines import base

    mods = _modules()
    subcommands = [spec.split(":")[0] for spec in cli.SUBCOMMANDS]
    pipelines = list(base.KNOWN_MODULES.values())
    adapters = [f"effrag.integrations.{m}" for m in integrations._ADAPTERS.values()]
    for name in subcommands + pipelines + adapters:
        assert name in mods, f"{name}: named in a registry but not a module of effrag"
    for spec in cli.SUBCOMMANDS:
        module, func = spec.split(":")
        assert callable(getattr(importlib.import_module(module), func, None)), spec
    # every pipeline module the registry can scan registers itself from inside effrag.pipelines
    registered = [m for m, f in mods.items() if m.startswith("effrag.pipelines.") and
                  "@register_pipeline(" in f.read_text(encoding="utf-8")]
    assert set(pipelines) <= set(registered)


def test_the_entry_point_group_is_the_one_way_in_from_data_synthesis():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    commands = project["entry-points"]["effrag.commands"]
    assert commands and all(v.split(".")[0] == "data_synthesis" for v in commands.values())
    cli = (ROOT / "effrag" / "cli.py").read_text(encoding="utf-8")
    assert 'entry_points(group=COMMAND_GROUP)' in cli and 'COMMAND_GROUP = "effrag.commands"' in cli
