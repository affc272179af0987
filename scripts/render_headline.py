"""Write the headline figures from the evidence ``reports/headline.json`` names (``effrag.headline``).

    python scripts/render_headline.py            # rewrite every rendered block: the README's results table and its
                                                 # copy of the quickstart's table, the shipped card's figures
    python scripts/render_headline.py --check    # change nothing; exit 1 when a block is stale

``--check`` also exits 1 when the committed quickstart output ran on another shipped system or sample than the
installed one: that output is rerun, not rendered.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from effrag.headline import quickstart_inputs_stale, render_targets

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--spec", type=Path, default=ROOT / "reports" / "headline.json")
    p.add_argument("--root", type=Path, default=ROOT, help="the checkout the spec's paths are relative to")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 when a block is stale")
    args = p.parse_args(argv)
    try:
        spec = json.loads(args.spec.read_text())
        targets = render_targets(spec, args.root)
        inputs = quickstart_inputs_stale(spec, args.root)
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"render_headline: {e}")
    stale = [path for path, (now, new) in targets.items() if now != new]
    if args.check:
        for path in targets:
            print(f"{path}: " + ("stale: python scripts/render_headline.py" if path in stale else "current"))
        if inputs:
            print(inputs)
        return 1 if stale or inputs else 0
    for path in stale:
        (args.root / path).write_text(targets[path][1])
        print(f"written: {path}")
    if inputs:
        print(inputs, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
