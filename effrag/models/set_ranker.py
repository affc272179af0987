"""A set-wise pool ranker: the loop's top candidates scored together, so each score can depend on the others.

Why: a pointwise ranker asks "is this chunk relevant to this query?", and every one we trained plateaus at the same
dev-group MRR. A multi-hop answer is a set: the second paragraph matters *because* the first one names it. The
hand-made link bonus (:mod:`effrag.pipelines.efficientrag.pool`) is the one feature that reads the set. Here it
becomes an input a model weighs: a small transformer over one feature vector per candidate, whose attention is
biased by which candidate's title the others name (Wikipedia's hyperlink, as the link bonus reads it).

The input is what the loop already knows of each candidate (:func:`candidate_features`): the pool ranker's logit,
the Labeler's p(<Continue>), retrieval and requery ranks, the hop, the pool order's own score with and without
the link terms, and lexical links to the question and to the other candidates. Nothing is encoded again, so the
model costs microseconds per question, not pair forwards.

Training is listwise (:func:`set_loss`): every gold candidate must outscore every non-gold one in the same set.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from effrag.state_files import atomic_path, write_text_atomic
from effrag.text import link_form, link_title

FEATURE_NAMES = (
    "plain_rel", "linked_rel", "ranker_rel", "labeler_logit", "log_retrieval_rank", "log_requery_rank",
    "requeried", "hop0", "hop1", "hop2", "hop3plus", "rejected", "position", "log_position",
    "named_by_top", "log_named_by", "log_names", "title_in_question", "title_in_queries", "question_overlap",
    "has_title",
)
NO_RANK = 50  # a chunk a later query did not reach ranks here (log1p of it), as the pool treats it
_WORD = re.compile(r"[a-z0-9]+")
FORMAT = "effrag-set-ranker/1"


def _content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if len(w) >= 4}


def candidate_features(question: str, queries: Sequence[str], records: Sequence[Mapping[str, Any]],
                       link_top: int = 3) -> tuple[list[list[float]], list[list[float]]]:
    """The set's features ``[M][len(FEATURE_NAMES)]`` and its link matrix ``[M][M]`` (``links[i][j]`` = 1 when
    candidate j's text names candidate i's title), from the candidate records the pool writes
    (:func:`effrag.pipelines.efficientrag.pool.pool_candidates`), in the pool's order."""
    m = len(records)
    if not m:
        return [], []
    names = [link_title(r["title"]) for r in records]
    texts = [link_form(r["text"]) for r in records]
    links = [[1.0 if i != j and names[i] and f" {names[i]} " in texts[j] else 0.0 for j in range(m)]
             for i in range(m)]
    plain = [r["plain"] for r in records]
    linked = [r["linked"] for r in records]
    ranker = [r["ranker"] for r in records]
    top_plain = sorted(range(m), key=lambda i: -plain[i])[:link_top]
    q_form, q_words = link_form(question), _content_words(question)
    query_forms = [link_form(q) for q in queries]
    out = []
    for i, r in enumerate(records):
        hop = int(r["hop"])
        chunk_words = _content_words(r["title"] + " " + r["text"])
        requery = r.get("requery_rank")
        named_by = sum(links[i])
        out.append([
            max(plain[i] - max(plain), -20.0) / 5.0,
            max(linked[i] - max(linked), -20.0) / 5.0,
            max(ranker[i] - max(ranker), -20.0) / 5.0,
            max(min(r["labeler"], 10.0), -10.0) / 5.0,
            math.log1p(r["retrieval_rank"] or 0) / 3.0,
            math.log1p(NO_RANK if requery is None else requery) / 3.0,
            0.0 if requery is None else 1.0,
            float(hop == 0), float(hop == 1), float(hop == 2), float(hop >= 3),
            float(bool(r["rejected"])),
            i / max(m, 1),
            math.log1p(i) / 3.0,
            float(any(links[i][j] for j in top_plain)),
            math.log1p(named_by),
            math.log1p(sum(links[k][i] for k in range(m))),
            float(bool(names[i]) and f" {names[i]} " in q_form),
            float(bool(names[i]) and any(f" {names[i]} " in f for f in query_forms)),
            len(q_words & chunk_words) / max(len(q_words), 1),
            float(bool(names[i])),
        ])
    return out, links


def _torch():
    import torch
    return torch


def build_model(n_features: int = len(FEATURE_NAMES), dim: int = 64, layers: int = 2, heads: int = 4,
                set_wise: bool = True, dropout: float = 0.1):
    """The ranker: features -> ``dim`` -> ``layers`` attention blocks over the set (link-biased) -> one score.
    ``set_wise=False`` gives the pointwise control: the same network without attention, each candidate alone."""
    torch = _torch()
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
            self.link_bias = nn.Parameter(torch.zeros(2, heads))  # per head: i attends to what names it / it names
            self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Dropout(dropout), nn.Linear(2 * dim, dim))

        def forward(self, h, links, pad):
            b, m, _ = h.shape
            # links[b, i, j]: j names i. Query i attends to key j with bias w0 * links[i, j] + w1 * links[j, i].
            bias = (self.link_bias[0].view(1, heads, 1, 1) * links.unsqueeze(1)
                    + self.link_bias[1].view(1, heads, 1, 1) * links.transpose(1, 2).unsqueeze(1))
            bias = bias.masked_fill(pad.view(b, 1, 1, m), float("-inf")).reshape(b * heads, m, m)
            x = self.norm1(h)
            h = h + self.attn(x, x, x, attn_mask=bias, need_weights=False)[0]
            return h + self.ff(self.norm2(h))

    class SetRanker(nn.Module):
        def __init__(self):
            super().__init__()
            self.config = {"format": FORMAT, "features": list(FEATURE_NAMES)[:n_features], "dim": dim,
                           "layers": layers, "heads": heads, "set_wise": set_wise, "dropout": dropout}
            self.inp = nn.Sequential(nn.Linear(n_features, dim), nn.GELU(), nn.Linear(dim, dim))
            self.blocks = nn.ModuleList([Block() for _ in range(layers)]) if set_wise else nn.ModuleList()
            self.point = nn.Sequential(nn.GELU(), nn.Linear(dim, dim), nn.GELU()) if not set_wise else nn.Identity()
            self.out = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 1))
            self.skip = nn.Linear(n_features, 1)  # a linear score the network corrects

        predict = predict_records

        def forward(self, x, links, pad):
            h = self.point(self.inp(x))
            for blk in self.blocks:
                h = blk(h, links, pad)
            s = self.out(h).squeeze(-1) + self.skip(x).squeeze(-1)
            return s.masked_fill(pad, float("-inf"))

    return SetRanker()


def predict_records(model, question: str, queries: Sequence[str], records: Sequence[Mapping[str, Any]]) -> list[float]:
    """One score per candidate record (:func:`candidate_features`), each read with all the others."""
    torch = _torch()
    feats, lk = candidate_features(question, queries, records)
    if not feats:
        return []
    x, lk, pad, _ = collate([(feats, lk, [0] * len(feats))], len(feats))
    with torch.inference_mode():
        return model(x, lk, pad)[0].tolist()


def ensemble(members: Sequence[Any]):
    """The members' mean score: models trained alike from other seeds. One training run's order moves the dev
    figures by about the set ranker's gain at 7 chunks (reports/efficientrag/set-ranker/), so what ships averages
    several, and its pick does not hang on one seed."""
    torch = _torch()

    class SetRankerEnsemble(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.members = torch.nn.ModuleList(members)
            self.config = {**members[0].config, "members": len(members)}

        predict = predict_records

        def forward(self, x, links, pad):
            return torch.stack([m(x, links, pad) for m in self.members]).mean(0)

    return SetRankerEnsemble().eval()


def set_loss(scores, gold, pad):
    """Listwise: for each gold candidate g, -log softmax of g against every non-gold candidate of its set. It
    asks every gold chunk to outrank all the others, which is what recall at a small cut needs."""
    torch = _torch()
    neg = scores.masked_fill(gold | pad, float("-inf"))  # non-gold only
    neg_lse = torch.logsumexp(neg, dim=-1, keepdim=True)  # [B, 1]
    both = torch.logaddexp(scores, neg_lse)
    per = (both - scores).masked_fill(~gold, 0.0)
    n = gold.sum().clamp(min=1)
    return per.sum() / n


def collate(batch: Sequence[tuple[list[list[float]], list[list[float]], list[int]]], m: int):
    """Pad sets to ``m`` candidates: ``x [B, m, F]``, ``links [B, m, m]``, ``pad [B, m]``, ``gold [B, m]``."""
    torch = _torch()
    b, f = len(batch), len(FEATURE_NAMES)
    x, links = torch.zeros(b, m, f), torch.zeros(b, m, m)
    pad, gold = torch.ones(b, m, dtype=torch.bool), torch.zeros(b, m, dtype=torch.bool)
    for k, (feats, lk, labels) in enumerate(batch):
        n = min(len(feats), m)
        if n:
            x[k, :n] = torch.tensor(feats[:n])
            links[k, :n, :n] = torch.tensor([row[:n] for row in lk[:n]])
            pad[k, :n] = False
            gold[k, :n] = torch.tensor([bool(v) for v in labels[:n]])
    return x, links, pad, gold


WEIGHTS, CONFIG = "set_ranker.safetensors", "set_ranker.json"


def save_ensemble(models: Sequence[Any], folder: str | Path, provenance: Mapping[str, Any] | None = None) -> None:
    """Members in ``member<i>/`` (each as :func:`save` writes one), and ``set_ranker.json`` naming them."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"member{i}" for i in range(len(models))]
    for name, m in zip(names, models):
        save(m, folder / name, {**dict(provenance or {}), "seed": int(name.removeprefix("member"))})
    if (folder / WEIGHTS).exists():
        (folder / WEIGHTS).unlink()
    write_text_atomic(folder / CONFIG, json.dumps({"format": FORMAT, "members": names,
                                                   "provenance": dict(provenance or {})}, indent=2) + "\n")


def save(model, folder: str | Path, provenance: Mapping[str, Any] | None = None) -> None:
    """``set_ranker.safetensors`` (fp16: the model is small, its scores move by < 1e-3) and ``set_ranker.json``
    (its shape, features, provenance and the weights' SHA-256). The saved weights are what runs: a model is scored
    as :func:`load` returns it."""
    import hashlib

    from safetensors.torch import save_file

    torch = _torch()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_path(folder / WEIGHTS) as tmp:
        save_file({k: v.detach().to(torch.float16).contiguous() for k, v in model.state_dict().items()}, str(tmp))
    digest = hashlib.sha256((folder / WEIGHTS).read_bytes()).hexdigest()
    write_text_atomic(folder / CONFIG, json.dumps({**model.config, "sha256": digest,
                                                   "provenance": dict(provenance or {})}, indent=2) + "\n")


def load(folder: str | Path):
    """The model :func:`save` wrote, in fp32. A file of another format, features or shape, or weights whose SHA-256
    is not the one recorded, is refused with its path."""
    import hashlib

    from safetensors.torch import load_file

    torch = _torch()
    folder = Path(folder)
    try:
        cfg = json.loads((folder / CONFIG).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{folder / CONFIG}: not a set-wise ranker's config ({e})") from None
    if cfg.get("format") != FORMAT:
        raise ValueError(f"{folder / CONFIG}: format {cfg.get('format')!r}, expected {FORMAT!r}")
    if "members" in cfg:  # an ensemble: each member checked as one model
        names = cfg["members"]
        if not names or any(not isinstance(n, str) or Path(n).name != n or not (folder / n).is_dir() for n in names):
            raise ValueError(f"{folder / CONFIG}: 'members' must name member folders inside {folder}, got {names!r}")
        return ensemble([load(folder / n) for n in names])
    if list(cfg["features"]) != list(FEATURE_NAMES)[: len(cfg["features"])]:
        raise ValueError(f"{folder / CONFIG}: features differ from this version's FEATURE_NAMES")
    raw = (folder / WEIGHTS).read_bytes()
    if hashlib.sha256(raw).hexdigest() != cfg.get("sha256"):
        raise ValueError(f"{folder / WEIGHTS}: SHA-256 differs from the one {CONFIG} records (a changed or damaged "
                         "file); re-export the set ranker")
    model = build_model(len(cfg["features"]), cfg["dim"], cfg["layers"], cfg["heads"], cfg["set_wise"],
                        cfg["dropout"])
    try:
        model.load_state_dict({k: v.to(torch.float32) for k, v in load_file(str(folder / WEIGHTS)).items()})
    except RuntimeError as e:
        raise ValueError(f"{folder / WEIGHTS}: tensors do not fit {CONFIG}'s shape ({str(e).splitlines()[0]})") \
            from None
    return model.eval()
