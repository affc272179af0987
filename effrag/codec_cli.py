"""``effrag ranker-codec``: fit a late ranker's product-quantisation codec and add it to the checkpoint.

With a codec, the ranker's chunk vectors are stored (and held in memory) as 64 bytes a token instead of 256
(:mod:`effrag.models.late_codec`, issue #68). The codec is fitted on a seeded sample of the token vectors of the
passages of ``--inputs`` (the training files: no dev question's passage chooses it), read by the checkpoint as the
loop reads chunks (title and text, at the model's length, in bf16 where the CPU runs it), and recorded with its
provenance inside ``codec.safetensors``.
"""
from __future__ import annotations

import argparse
import random
from pathlib import Path

from effrag.cli_args import add_bf16_arg, positive_int


def sample_tokens(model, inputs: list[str], chunks: int = 4096, seed: int = 0, bf16: bool = True,
                  batch_size: int = 32):
    """The token vectors [N, dim] of a seeded sample of ``chunks`` distinct passages of the questions in ``inputs``,
    read by ``model`` as the loop reads chunks; and how many passages were read."""
    import torch

    from effrag.data import load_questions
    from effrag.text import chunk_text, words_batch

    seen: dict[tuple[str, str], None] = {}
    for f in inputs:
        for q in load_questions(f):
            for p in q.contexts:
                seen.setdefault((p.title, p.text), None)
    passages = sorted(seen)
    random.Random(seed).shuffle(passages)
    passages = passages[:chunks]
    if not passages:
        raise ValueError(f"no passages in {', '.join(inputs)}")
    words = words_batch([chunk_text(t, x) for t, x in passages])
    return torch.cat(model._encode_all([" ".join(w) for w in words], model.max_length, batch_size, bf16)), len(passages)


def fit_codec(model_dir: str | Path, inputs: list[str], chunks: int = 4096, subspaces: int | None = None,
              seed: int = 0, bf16: bool = True, coarse: int = 0) -> dict:
    """Fit and attach the codec (``subspaces`` None: :data:`~effrag.models.late_codec.DEFAULT_SUBSPACES`); returns
    what was done (chunks, tokens, the codec's SHA-256, bytes per token)."""
    from effrag.models import load_model
    from effrag.models.late_codec import DEFAULT_SUBSPACES, ProductQuantizer

    subspaces = subspaces or DEFAULT_SUBSPACES
    from effrag.models.late_codec import CODEC_NAME
    from effrag.models.model_files import read_effrag_config
    from effrag.provenance import file_sha256, portable, portable_path

    model = load_model(model_dir).eval()
    if not hasattr(model, "attach_codec"):
        raise ValueError(f"{model_dir}: a {model.model_type} checkpoint; a codec is for a late_ranker")
    asked = portable({"inputs_sha256": {portable_path(f): file_sha256(f) for f in inputs}, "subspaces": subspaces,
                      "coarse": coarse, "seed": seed, "bf16": bf16,
                      # the command as its options say (the process's own argv may be another program's)
                      "command": " ".join(["effrag ranker-codec --model", portable_path(model_dir), "--inputs",
                                           *map(portable_path, inputs), f"--chunks {chunks} --subspaces "
                                           f"{subspaces} --coarse {coarse} --seed {seed}",
                                           *([] if bf16 else ["--no-bf16"])])})
    # a rerun (the recipe resumes) keeps the codec these weights already carry when it was fitted as asked: the tuning
    # rows read with the codec name the checkpoint's fingerprint, its file records included, and a refit rewrites them
    recorded = ProductQuantizer.recorded_provenance(Path(model_dir) / CODEC_NAME)
    if CODEC_NAME in (read_effrag_config(model_dir).get("files") or {}) and model.codec is not None and \
            all(recorded.get(key) == value for key, value in asked.items()):
        return {"chunks": recorded.get("chunks"), "tokens": recorded.get("tokens"), "sha256": model.codec.sha256,
                "bytes_per_token": model.codec.bytes_per_token, "reused": True}
    tokens, n = sample_tokens(model, inputs, chunks, seed, bf16)
    codec = ProductQuantizer.train(tokens, subspaces=subspaces, seed=seed, coarse=coarse)
    provenance = {"inputs": [portable_path(f) for f in inputs], **asked, "chunks": n, "tokens": len(tokens)}
    model.attach_codec(model_dir, codec, provenance)
    return {"chunks": n, "tokens": len(tokens), "sha256": codec.sha256,
            "bytes_per_token": codec.bytes_per_token}


def add_codec_parser(sub) -> None:
    p = sub.add_parser("ranker-codec", help="fit a late ranker's vector codec (about 6 KB a chunk stored, "
                                            "against 23 KB) and add it to the checkpoint")
    p.add_argument("--model", required=True, metavar="DIR", help="a late_ranker checkpoint folder (ranker-late/)")
    p.add_argument("--inputs", required=True, nargs="+", metavar="FILE",
                   help="question files whose passages the codec is fitted on (the training files)")
    p.add_argument("--chunks", type=positive_int, default=4096, help="passages sampled (default 4096)")
    p.add_argument("--subspaces", type=positive_int,  # the default is the model module's (no torch import here)
                   help="bytes per token (default: effrag.models.late_codec.DEFAULT_SUBSPACES, the level that keeps "
                        "the ranker's MRR and the loop's recall, reports/scale/codec)")
    p.add_argument("--coarse", type=int, default=0, help="coarse centroids before the product quantiser (0: none)")
    p.add_argument("--seed", type=int, default=0)
    add_bf16_arg(p, default=True, help="read the passages in fp32")
    p.set_defaults(func=_cmd_codec)


def _cmd_codec(args: argparse.Namespace) -> None:
    out = fit_codec(args.model, args.inputs, args.chunks, args.subspaces, args.seed, args.bf16, args.coarse)
    how = "kept (fitted as asked before)" if out.get("reused") else "fitted"
    print(f"{args.model}: codec {out['sha256'][:16]} {how} on {out['tokens']} token vectors of {out['chunks']} "
          f"passages; {out['bytes_per_token']} bytes a token")
