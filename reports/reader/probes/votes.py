"""Answer-level votes of reader checkpoints from their oracle predictions (no model run: seconds).

    python scripts/eval_reader.py --reader checkpoints/reader-smol --modes together --output <tmp>/vote/smol   # per reader
    python reports/reader/probes/votes.py all=reports/reader/oracle smol=<tmp>/vote/smol smol2=<tmp>/vote/smol2 mocc=<tmp>/vote/mocc

Every subset of 2 or more readers, voted with the library's rule (effrag.models.reader_vote.vote: the most frequent
normalised answer, ties to the highest confidence), and the oracle (the best member per question).
"""
import itertools
import json
import sys

from effrag.models.reader import ReaderAnswer
from effrag.models.reader_vote import vote

DS = ["hotpotqa", "2wikimqa", "musique"]
dirs = dict(a.split("=", 1) for a in sys.argv[1:])
preds = {n: {ds: [json.loads(line) for line in open(f"{d}/predictions-{ds}.jsonl")] for ds in DS} for n, d in dirs.items()}


def as_answer(row: dict) -> ReaderAnswer:
    t = row["together"]
    return ReaderAnswer(t["answer"], t["confidence"], 0, 0, 0.0, "span")


def scores(subset: list[str]) -> dict:
    out, tot, orc, n_all = {}, 0.0, 0.0, 0
    for ds in DS:
        groups = list(zip(*[preds[n][ds] for n in subset]))
        assert all(len({g["id"] for g in group}) == 1 for group in groups)
        f = sum(group[vote([as_answer(g) for g in group])]["together"]["f1"] for group in groups)
        o = sum(max(g["together"]["f1"] for g in group) for group in groups)
        out[ds] = round(100 * f / len(groups), 1)
        tot, orc, n_all = tot + f, orc + o, n_all + len(groups)
    out["pooled"], out["oracle pooled"] = round(100 * tot / n_all, 2), round(100 * orc / n_all, 2)
    return out


print("| readers | " + " | ".join(DS) + " | pooled | best member per question, pooled |")
print("|---|" + "---:|" * (len(DS) + 2))
for n in dirs:
    per = {ds: 100 * sum(r["together"]["f1"] for r in preds[n][ds]) / len(preds[n][ds]) for ds in DS}
    pooled = sum(r["together"]["f1"] for ds in DS for r in preds[n][ds]) / sum(len(preds[n][ds]) for ds in DS)
    print(f"| {n} | " + " | ".join(f"{per[ds]:.1f}" for ds in DS) + f" | {100 * pooled:.2f} | - |")
for k in range(2, len(dirs) + 1):
    for subset in itertools.combinations(dirs, k):
        s = scores(list(subset))
        print(f"| {' + '.join(subset)} | " + " | ".join(f"{s[ds]:.1f}" for ds in DS)
              + f" | {s['pooled']:.2f} | {s['oracle pooled']:.2f} |")
