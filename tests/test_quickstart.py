"""The README's main job, on a minimal config: every stage runs, writes its outputs, and is cached."""
import json
import time

from effrag.quickstart import run_quickstart


def test_quickstart_stages_run_and_cache(tmp_path):
    wd = tmp_path / "qs"
    kw = dict(workdir=wd, retriever="bm25", epochs=1.0, max_train_examples=24, limit=3, datasets=("hotpotqa",))
    rows = run_quickstart(**kw)

    assert (wd / "corpus.jsonl").stat().st_size > 0
    for f in ("labeler.jsonl", "filter.jsonl", "stats.json"):
        assert (wd / "synth" / "train" / f).is_file()
    for task in ("labeler", "filter"):
        assert (wd / "models" / task / "best" / "effrag_config.json").is_file()
    methods = {(r["method"], r.get("k")) for r in rows}
    assert ("direct-r", 10) in methods and ("direct-r", 20) in methods
    assert any(m == "efficientrag" for m, _ in methods)
    for r in rows:
        assert r["dataset"] == "hotpotqa" and r["n"] == 3 and 0.0 <= r["recall"] <= 1.0
    assert json.loads((wd / "comparison.json").read_text()) == rows
    assert "efficientrag" in (wd / "comparison.md").read_text()

    t0 = time.time()
    again = run_quickstart(**kw)  # every stage cached: no training, no evaluation
    assert again == rows
    assert time.time() - t0 < 30
