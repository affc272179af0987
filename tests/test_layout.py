"""Package layout rules (issue #17): no import cycles inside ``effrag``, and one direction between packages.

Read from the source with ``ast`` (every ``import`` statement, deferred ones inside functions included),
so a cycle hidden behind a lazy import is still a cycle.
"""
from __future__ import annotations

import ast
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


def test_cycle_finder_finds_a_planted_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_effrag_imports_neither_scripts_nor_data_synthesis():
    offenders = {}
    for m, f in _modules().items():
        bad = {t for t in _imports(m, f) if t.split(".")[0] in ("scripts", "data_synthesis")}
        if bad:
            offenders[m] = bad
    assert not offenders, offenders  # the quickstart runs `effrag synthesize` through the CLI's subcommand list
