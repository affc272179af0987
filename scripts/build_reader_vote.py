"""Write a reader-vote folder: several trained reader checkpoints answering by majority vote.

    python scripts/build_reader_vote.py --members checkpoints/reader-all checkpoints/reader-smol \\
        checkpoints/reader-smol2 --output checkpoints/reader-vote

The folder holds ``effrag_config.json`` (members relative to it, their file hashes) and a model card; the
weights stay in the members (:mod:`effrag.models.reader_vote`). Every user of a reader opens it like one:
``effrag eval --reader checkpoints/reader-vote``, ``python scripts/eval_reader.py --reader ...``, SearChain.
Seconds: the members are loaded once to check them.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def card(output: Path, members: list[Path], command: str) -> str:
    from effrag.models.heads import read_effrag_config

    rows = []
    for m in members:
        meta = read_effrag_config(m)
        training = meta.get("training") or {}
        encoder = ((training.get("config") or {}).get("model") or {}).get("name_or_path", "?")
        tuned = (meta.get("decoding_tuned") or {}).get("f1")
        rows.append(f"| `{m}` | `{encoder}` | {tuned if tuned is not None else '-'} |")
    return (f"# {output.name}\n\nExtractive readers answering by majority vote (`effrag.models.ReaderVote`): each member "
            "reads the pool as it would alone (its own windows and tuned span decoding); the answer most members "
            "give, after the official answer normalisation, wins, and a tie goes to the most confident of the tied "
            "answers. Open it like any reader: `effrag eval --method direct-r --reader "
            f"{output} ...`, `python scripts/eval_reader.py --reader {output} ...`, "
            "`effrag.models.load_reader(...)`. Reading costs the members' reading together.\n\n"
            "## Members (weights in their own folders; see their cards)\n\n| folder | encoder / started from | "
            "dev oracle F1 alone (tuned decoding, all questions) |\n|---|---|---|\n" + "\n".join(rows)
            + "\n\nDev figures: `reports/reader/README.md` (oracle reading of the vote: `reports/reader/oracle-vote/`)."
            f"\n\n## Command\n```\n{command}\n```\n")


def main(argv=None) -> int:
    from effrag.cli_args import add_output_arg

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", nargs="+", required=True, type=Path, metavar="DIR", help="reader checkpoints (2 or more)")
    add_output_arg(ap, required=True, help="the vote's checkpoint folder")
    args = ap.parse_args(argv)
    from effrag.models.reader_vote import ReaderVote

    if len(args.members) < 2:
        ap.error("--members: give at least 2 reader checkpoints")
    command = "python scripts/build_reader_vote.py " + " ".join(argv if argv is not None else sys.argv[1:])
    ReaderVote.write(args.output, args.members, provenance={"command": command})
    ReaderVote.from_pretrained(args.output)  # reads back
    (args.output / "README.md").write_text(card(args.output, args.members, command))
    print(f"wrote {args.output} ({len(args.members)} members)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
