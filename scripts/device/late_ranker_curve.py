"""The late ranker's training curve on a lent GPU: the shipped recipe (``configs/late_ranker.yaml``) at more epochs and
on fewer groups, each scored on the dev ranker groups (monitoring only). ``late_ranker_curve.sh`` runs it there.

The device takes 64 MiB a call and has no spaCy, so three steps:

    python scripts/device/late_ranker_curve.py pack --out .gpu          # here: what travels (about 58 MB)
    bash scripts/device/late_ranker_curve.sh                            # there, with .gpu carried
    python scripts/device/late_ranker_curve.py extract SRC OUT TAG      # there: a checkpoint's weights, in 15 MB shards

``pack`` writes all-MiniLM-L6-v2 with its tensors in bf16 (training loads them as fp32: the init is rounded, the
frozen word embeddings too) and the ranker groups with each candidate's text replaced by its words
(:func:`effrag.text.words_batch`, spaCy) joined by spaces, title empty. ``train`` (what the shell script calls in
place of ``train.py``) then splits on whitespace instead of calling spaCy: the features are the same as
``train.py``'s on the original groups (checked by ``pack --check``).
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

from effrag.data.loaders import MULTIHOP_DATASETS

GROUPS = {"train_all_loop_teacher": "runs/ranker/train_all_loop_teacher/ranker.jsonl",
          **{f"dev_{d}": f"runs/ranker/dev_{d}/ranker.jsonl" for d in MULTIHOP_DATASETS}}


def presplit(records: list[dict]) -> list[dict]:
    from effrag.text import chunk_text, words_batch
    words = iter(words_batch([chunk_text(c["title"], c["text"]) for r in records for c in r["candidates"]]))
    return [{**r, "candidates": [{**c, "title": "", "text": " ".join(next(words))} for c in r["candidates"]]}
            for r in records]


def split_words(texts: list[str]) -> list[list[str]]:
    return [t.split() for t in texts]


def pack(out: Path, check: int) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    from effrag.retrieval.encoder import default_encoder_path
    src = Path(default_encoder_path())
    (out / "minilm").mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (out / "minilm" / name).write_bytes((src / name).read_bytes())
    config = json.loads((src / "config.json").read_text())
    config["torch_dtype"] = config["dtype"] = "float32"
    (out / "minilm" / "config.json").write_text(json.dumps(config, indent=2))
    state = load_file(str(src / "model.safetensors"))
    save_file({k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous() for k, v in state.items()},
              str(out / "minilm" / "model.safetensors"), metadata={"format": "pt"})
    (out / "data").mkdir(exist_ok=True)
    if check:
        from effrag.models.late_ranker import LateRankerModel
        from effrag.training.tasks import late_ranker as task
        model = LateRankerModel.from_encoder(str(out / "minilm"))
    for name, path in GROUPS.items():
        records = [json.loads(line) for line in open(path)]
        with gzip.open(out / "data" / f"{name}.jsonl.gz", "wt") as f:
            f.writelines(json.dumps(r) + "\n" for r in presplit(records))
        if check:
            original = task.featurize_late_ranker(model, records[:check], 128)
            words_batch, task.words_batch = task.words_batch, split_words
            try:
                same = task.featurize_late_ranker(model, presplit(records[:check]), 128) == original
            finally:
                task.words_batch = words_batch
            if not same:
                sys.exit(f"{path}: the pre-split groups featurize differently")
        print(f"packed {path} ({len(records)} groups)")


def extract(src: Path, out: Path, tag: str, limit: int = 15_000_000) -> None:
    """The checkpoint's weights minus the frozen word embeddings, as saved, in shards of at most ``limit`` bytes
    (the device returns files of at most 16 MiB; a tensor over the limit gets a shard of its own), with its heads."""
    from safetensors.torch import load_file, save_file
    state = load_file(str(src / "model.safetensors"))
    state.pop("embeddings.word_embeddings.weight")
    shard, size, n = {}, 0, 0
    for key in sorted(state):
        t = state[key].contiguous()
        if shard and size + t.numel() * t.element_size() > limit:
            save_file(shard, str(out / f"{tag}.enc{n}.safetensors"))
            shard, size, n = {}, 0, n + 1
        shard[key] = t
        size += t.numel() * t.element_size()
    save_file(shard, str(out / f"{tag}.enc{n}.safetensors"))
    (out / f"{tag}.heads.safetensors").write_bytes((src / "heads.safetensors").read_bytes())


def main() -> None:
    if sys.argv[1:2] == ["train"]:  # train.py's command line, words split on whitespace (the groups are pre-split)
        import effrag.text
        effrag.text.words_batch = split_words
        from effrag.training.cli import main as train_main
        sys.exit(train_main(sys.argv[2:]))
    from effrag.cli_args import add_output_arg

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    add_output_arg(p, ".gpu", dest="out", help="what travels to the device")
    p.add_argument("--check", type=int, default=40, help="groups of each file featurized both ways (0: none)")
    p = sub.add_parser("extract")
    p.add_argument("src", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("tag")
    sub.add_parser("train", help="train.py's arguments")
    args = ap.parse_args()
    pack(args.out, args.check) if args.cmd == "pack" else extract(args.src, args.out, args.tag)


if __name__ == "__main__":
    main()
