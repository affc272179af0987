"""Write the README's results table from the evidence ``reports/headline.json`` names (``effrag.evaluation.headline``).

    python scripts/render_headline.py            # rewrite the table between the README's headline markers
    python scripts/render_headline.py --check    # exit 1 when the README's table is stale
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from effrag.evaluation.headline import headline_markdown, replace_block

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--spec", type=Path, default=ROOT / "reports" / "headline.json")
    p.add_argument("--readme", type=Path, default=ROOT / "README.md")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 when the table is stale")
    args = p.parse_args(argv)
    try:
        block = headline_markdown(json.loads(args.spec.read_text()), ROOT)
        text = args.readme.read_text()
        new = replace_block(text, block)
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"render_headline: {e}")
    if args.check:
        print("the README's table is " + ("current" if new == text else "stale: python scripts/render_headline.py"))
        return 0 if new == text else 1
    args.readme.write_text(new)
    print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
