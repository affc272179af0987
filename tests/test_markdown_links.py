"""Every relative path a Markdown page links to resolves from that page: the repo README.md, docs/ and reports/.

Checked: a link or image target (``[text](path)``) and an inline code span that starts with ``./`` or ``../``,
outside fenced and indented command blocks. A folder that moves (``reports/archive/``, issue #72) breaks the pages
that point into it or out of it; this names each such page and path.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_PATH = re.compile(r"`(\.\.?/[^`\s]*)`")
# not a page's relative path: the data folder beside the checkout, which commands name from the repository root
# (`../shared/data`), and an example of a path the loader refuses (docs/reliability.md)
NOT_RELATIVE = ("../shared/",)
EXAMPLES = {"../../etc"}


def pages() -> list[Path]:
    found = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "reports").rglob("*.md")]
    return sorted(p for p in found if p.is_file())


def prose(text: str) -> str:
    """The page without its fenced blocks and its indented (command) blocks."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return "\n".join(line for line in text.split("\n") if not line.startswith("    "))


def unresolved(page: Path) -> list[str]:
    text = prose(page.read_text(encoding="utf-8"))
    targets = [m.group(1) for m in LINK.finditer(text)] + [m.group(1) for m in CODE_PATH.finditer(text)]
    bad = []
    for target in targets:
        path = target.split("#")[0]
        if (not path or re.match(r"[a-z][a-z0-9+.-]*:", path) or path.startswith(NOT_RELATIVE) or path in EXAMPLES
                or any(c in path for c in "*<>{}$")):  # a URL, an anchor, a pattern or a placeholder
            continue
        if not (page.parent / path).exists():
            bad.append(target)
    return bad


def test_the_checker_finds_a_broken_link(tmp_path):
    (tmp_path / "there.md").write_text("x\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md) [gone](gone.md) `../x/gone.md` `./there.md#a` [web](https://example.org)\n"
                    "`../shared/data` `<dir>/x` `cpu-v8-*`\n\n    python x.py --output ../not/checked\n")
    assert unresolved(page) == ["gone.md", "../x/gone.md"]


def test_every_relative_markdown_path_resolves():
    broken = {str(p.relative_to(ROOT)): bad for p in pages() if (bad := unresolved(p))}
    assert not broken, broken
