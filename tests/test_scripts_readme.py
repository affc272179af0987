"""scripts/README.md has one line for every script, and names no script that is gone."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_script_has_its_line_and_every_line_its_script():
    scripts = ROOT / "scripts"
    on_disk = {p.relative_to(scripts).as_posix() for p in scripts.rglob("*") if p.suffix in (".py", ".sh")}
    text = (scripts / "README.md").read_text()
    named = {m for m in re.findall(r"^\| `([\w/.-]+\.(?:py|sh))`", text, re.M)}  # each table row's first name
    named |= {m for m in re.findall(r"`(device/[\w.-]+\.(?:py|sh))`", text)}  # a row may name two
    assert on_disk - named == set(), "scripts without a line in scripts/README.md"
    assert named - on_disk == set(), "scripts/README.md names scripts that do not exist"
