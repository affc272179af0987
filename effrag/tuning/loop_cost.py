"""What EfficientRAG's loop costs per question, in plain Labeler forwards (``scripts/bench_loop_cost.py``).

Each variant of a loop config is run batched and one question at a time; the *unit* is one plain fp32 forward of
the Labeler over a (query, chunk) pair it read, timed between the loop's batches (the machine's load drifts, so
the unit is timed beside what it divides); the ratio is loop seconds per question / unit seconds per pair.
Recall, the pools' identity with the baseline's and the inputs each model read come with every variant.
"""
from __future__ import annotations

import statistics
import time

# What one input costs against a (query, chunk) pair at the trained length, for choosing among configs by what they
# read (the benchmark measures seconds). A Filter input is the query and the kept words (~30 sub-tokens). A pair cut
# at L sub-tokens costs about min(1, L / 188) of an uncut one: the pairs' median is ~123 sub-tokens, so a cut at 128
# spares only the longer half (measured with MiniLM-L6 on HotpotQA pairs, 2026-11-27: 0.68 at 128, 0.50 at 96).
FILTER_READ = 0.25
FULL_LENGTH_TOKENS = 188
# A late-interaction ranker's read (effrag.models.late_ranker) is a MaxSim over vectors the index stored: what it costs
# at query time is its queries' encoding (~20 sub-tokens each, once per query and hop) spread over the ~10 chunks each
# query reads, about 1/60 of a Labeler pair read; the chunks' own encoding is index time.
LATE_RANKER_READ = 1 / 60


def length_factor(max_length: int | None) -> float:
    """A pair read cut at ``max_length`` sub-tokens, in uncut pair reads (1.0 for None: the trained length)."""
    return 1.0 if max_length is None else min(1.0, max_length / FULL_LENGTH_TOKENS)


def read_cost(config: dict, forwards, ranker_factor: float = 1.0) -> float:
    """One question's reading cost in trained-length pair reads: ``forwards`` = [Labeler pairs, ranker pairs,
    Filter inputs] (:func:`effrag.tuning.efficientrag.forwards`), each pair weighed by its config's input length,
    a ranker pair also by ``ranker_factor`` (:func:`ranker_read_factor`: 1/3 for a 2-layer ranker beside a 6-layer
    Labeler)."""
    lab, rank, fil = forwards
    lab_len = config.get("labeler_max_length")
    rank_len = config.get("ranker_max_length") or lab_len
    return lab * length_factor(lab_len) + rank * length_factor(rank_len) * ranker_factor + fil * FILTER_READ


def ranker_read_factor(ranker_dir, labeler_dir) -> float:
    """What one ranker read costs against one Labeler read at the Labeler's trained length: the encoders' layer ratio
    (same width; the embeddings and the head are a few percent of a forward) times the ratio of their own input
    lengths' :func:`length_factor` (a 2-layer student trained at 128 sub-tokens beside the 6-layer Labeler at 256:
    1/3 x 0.68). A config's ``ranker_max_length`` is counted on top (:func:`read_cost`), which overstates a further
    cut of a ranker already shorter than it; no recipe config cuts the student. A late-interaction ranker's read is
    :data:`LATE_RANKER_READ`. 1.0 when a folder's config.json or effrag_config.json does not say."""
    import json
    from pathlib import Path

    try:
        if json.loads((Path(ranker_dir) / "effrag_config.json").read_text()).get("model_type") == "late_ranker":
            return LATE_RANKER_READ
    except (OSError, ValueError, AttributeError):
        pass  # costed below, which warns
    layers, lengths = [], []
    for d in (ranker_dir, labeler_dir):
        try:
            layers.append(int(json.loads((Path(d) / "config.json").read_text())["num_hidden_layers"]))
            lengths.append(int(json.loads((Path(d) / "effrag_config.json").read_text())["max_length"]))
        except (OSError, ValueError, KeyError, TypeError) as e:
            import logging

            # not silent: a 2-layer student costed as a full read changes which config is cheapest
            logging.getLogger(__name__).warning("%s: cannot read its layers and length (%s): a ranker read is costed "
                                                "as a full Labeler read (factor 1.0)", d, " ".join(str(e).split()))
            return 1.0
    return layers[0] / layers[1] * length_factor(lengths[0]) / length_factor(lengths[1])


def labeler_pairs(results, corpus, chunk_format: str) -> list[tuple[str, str]]:
    """Every (query, chunk text) the Labeler read, from the results' per-hop trace."""
    from effrag.text import chunk_text

    out = []
    for r in results:
        for e in r.hops:
            for c in e["chunks"]:
                p = corpus[c["id"]]
                out.append((e["queries"][c["query"]], chunk_text(p.title, p.text, chunk_format)))
    return out


def _sync(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


class PlainForward:
    """One plain forward of the Labeler (MiniLM-L6) per pair: inputs tokenised and padded beforehand, only
    ``model(**batch)`` timed, length-sorted batches of ``batch_size``, in fp32 and, where the CPU runs it natively,
    in bf16 (:mod:`effrag.hardware`): the unit is the faster of the two, so no CPU's slow path inflates it."""

    def __init__(self, labeler, pairs: list[tuple[str, str]], batch_size: int = 64, max_length: int | None = None):
        from effrag.hardware import resolve_bf16
        from effrag.models.tokenization import length_batches, pad_batch
        from effrag.text import words_batch

        self.model, self.n = labeler, len(pairs)
        enc = labeler.encode(words_batch([q for q, _ in pairs]), words_batch([c for _, c in pairs]),
                             max_length=max_length)
        feats = [e.features() for e in enc]
        for f in feats:
            f.pop("labels")
        self.lengths = [len(f["input_ids"]) for f in feats]
        self.batches = [pad_batch([feats[i] for i in idx], labeler.tokenizer.pad_token_id)
                        for idx in length_batches(self.lengths, batch_size)]
        self.modes = ["fp32"] + (["bf16"] if resolve_bf16(True, labeler.device.type) else [])
        self.seconds = dict.fromkeys(self.modes, 0.0)
        self.pairs, self._next = 0, 0

    def step(self) -> None:
        """Time the next batch (cyclically) in each mode; steps interleaved with the loop's batches see the same
        load."""
        import torch

        device = self.model.device
        b = {k: v.to(device) for k, v in self.batches[self._next % len(self.batches)].items()}
        with torch.inference_mode():
            for mode in self.modes:
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=mode == "bf16"):
                    _sync(device)
                    t0 = time.perf_counter()
                    self.model(**b)
                    _sync(device)  # a GPU runs asynchronously: the clock is read once its work is done
                    self.seconds[mode] += time.perf_counter() - t0
        self.pairs += len(b["input_ids"])
        self._next += 1

    def seconds_per_pair(self) -> float:
        """Time per pair, the faster mode's, over whole cycles of the batches since the last call (so every length
        is counted)."""
        if not self.batches:
            return float("nan")
        while self._next % len(self.batches) or not self.pairs:
            self.step()
        self.last_mode = min(self.modes, key=lambda m: self.seconds[m])
        out = self.seconds[self.last_mode] / self.pairs
        self.seconds, self.pairs = dict.fromkeys(self.modes, 0.0), 0
        return out


def warmup_size(loop, batch: int) -> int:
    """Questions run before the timed runs: one on a CPU; a whole batch on a GPU, which picks its kernels per input
    shape on first use (on an H200, a first variant warmed by one question ran at 2.2x its identical repeat)."""
    device = getattr(getattr(loop, "labeler", None), "device", None)
    return batch if getattr(device, "type", "cpu") == "cuda" else 1


def run_variant(loop, texts: list[str], gold: list[list[str]], batch: int, single: int, between=None) -> dict:
    """Batched and one-at-a-time loop runs: results, seconds, recall, stage times."""
    from effrag.evaluation.metrics import recall

    loop.run(texts[:warmup_size(loop, batch)])  # warm-up (and the int8 copies, made once)
    results, batched_s = [], 0.0
    for i in range(0, len(texts), batch):
        t0 = time.perf_counter()
        results += loop.run(texts[i: i + batch])
        batched_s += time.perf_counter() - t0
        if between:
            between(results[i:])
    t0 = time.perf_counter()
    for q in texts[:single]:
        loop.run([q])
    single_s = time.perf_counter() - t0
    n = len(texts)
    stages = {k: sum(r.timing[k] for r in results) / n for k in ("retrieval", "labeler", "filter", "other")}
    return {"results": results, "n": n, "s_per_q": batched_s / n, "qps_batched": n / batched_s,
            "qps_single": single / single_s if single else None,
            "recall": statistics.fmean(recall([c.id for c in r.chunks], g) for r, g in zip(results, gold)),
            "iterations": statistics.fmean(r.iterations for r in results), "stages": stages}


def measure(setup, labeler, filter_model, base_config, variants: dict[str, dict], *, batch: int = 16,
            single: int = 8, unit_pairs: int = 256, log=print, ranker=None, prepare: bool = True,
            set_ranker=None) -> dict:
    """Every variant's cost and recall; the unit (plain Labeler forward per pair) timed between its batches.

    With ``prepare`` the corpus is split and tokenised first, as ``effrag eval`` and ``effrag serve`` do when they
    open the system (:meth:`~effrag.pipelines.efficientrag.loop.EfficientRAGLoop.prepare`); its seconds are the
    returned ``prepared``, an index-time cost beside the per-question one. ``set_ranker``: the system's set-wise
    pool ranker, for variants with ``set_ranker_top``."""
    from effrag.pipelines.efficientrag import EfficientRAGLoop
    from effrag.tuning.efficientrag import forwards

    texts, rows, unit, base_ids = setup.texts, [], None, None
    words: dict = {}  # every variant's loop shares the prepared chunks' words
    first = EfficientRAGLoop(labeler, filter_model, setup.retriever, base_config, ranker=ranker, words=words)
    prepared = first.prepare(setup.corpus) if prepare else {"passages": 0, "seconds": 0.0}
    log(f"prepared {prepared['passages']} chunks in {prepared['seconds']:.1f} s")
    for name, changes in variants.items():
        cfg = base_config.replace(**changes)
        loop = EfficientRAGLoop(labeler, filter_model, setup.retriever, cfg, ranker=ranker, words=words,
                                set_ranker=set_ranker if cfg.set_ranker_top else None)
        def between(batch_results, cfg=cfg):
            nonlocal unit
            if unit is None:  # the baseline's first batch: its pairs give the unit's sample (every k-th)
                pairs = labeler_pairs(batch_results, setup.corpus, cfg.chunk_format)
                unit = PlainForward(labeler, pairs[:: max(1, len(pairs) // unit_pairs)][:unit_pairs])
            unit.step()

        v = run_variant(loop, texts, setup.gold, batch, single, between)
        results = v.pop("results")
        read = [forwards(r.hops) for r in results]  # [Labeler, ranker, Filter] inputs per question
        v["read_per_q"] = [statistics.fmean(x[i] for x in read) for i in range(3)]
        pairs = labeler_pairs(results, setup.corpus, cfg.chunk_format)
        ids = [[c.id for c in r.chunks] for r in results]
        v["unit_s"] = unit.seconds_per_pair()
        v["unit_mode"] = unit.last_mode
        if base_ids is None:  # the baseline: a plain forward over exactly the pairs it read
            base_ids = ids
            own = PlainForward(labeler, pairs)
            v["plain_all_s_per_q"] = own.seconds_per_pair() * len(pairs) / len(texts)
            v["plain_all_unit_s"] = unit.seconds_per_pair()  # the unit right after that full pass
            v["pair_tokens"] = {"median": statistics.median(own.lengths), "max": max(own.lengths),
                                "over_128": sum(n > 128 for n in own.lengths) / len(own.lengths)}
        v["identical"] = ids == base_ids
        v.update(name=name, changes=changes, pairs_per_q=len(pairs) / len(texts), ratio=v["s_per_q"] / v["unit_s"])
        rows.append(v)
        log(f"{name}: {v['s_per_q']:.3f} s/q, unit {1000 * v['unit_s']:.1f} ms/pair, ratio {v['ratio']:.1f}, "
            f"recall {v['recall']:.4f}, pairs/q {v['pairs_per_q']:.1f}")
    return {"rows": rows, "prepared": prepared}


def report(out: dict, base_recall: float) -> str:
    from effrag.evaluation.report import md_table

    rows = []
    for v in out["rows"]:
        s = v["stages"]
        rows.append([v["name"], f"{100 * v['recall']:.2f}", f"{100 * (v['recall'] - base_recall):+.2f}",
                     f"{v['pairs_per_q']:.1f}", " / ".join(f"{x:.1f}" for x in v["read_per_q"]), f"{v['iterations']:.2f}", f"{v['s_per_q']:.3f}",
                     f"{v['qps_batched']:.2f}", "-" if v["qps_single"] is None else f"{v['qps_single']:.2f}",
                     f"{s['retrieval']:.3f}", f"{s['labeler']:.3f}", f"{s['filter']:.3f}", f"{s['other']:.3f}",
                     f"{1000 * v['unit_s']:.1f}", f"{v['ratio']:.1f}", f"{single_ratio(v):.1f}" if v["qps_single"] else "-",
                     "yes" if v["identical"] else "no"])
    return md_table(["variant", "recall %", "Δ pts", "pairs/q", "read/q (Labeler / ranker / Filter)", "hops", "s/q", "q/s batched", "q/s single",
                     "retrieval s/q", "labeler s/q", "filter s/q", "other s/q", "unit ms/pair", "ratio",
                     "ratio single", "same pools"], rows, "lrrrrrrrrrrrrrrrl")


def single_ratio(v: dict) -> float:
    """Pair-forward equivalents per question one question at a time: the single run's seconds per question over the
    unit (a user's ``effrag eval`` or ``retrieve`` runs one question per call; ``ratio`` is batched throughput)."""
    return 1.0 / v["qps_single"] / v["unit_s"]


COST_OPTIONS = ("first_hop_k", "hop_k", "rescore_top", "max_hops", "labeler_top", "ranker_max_length",
                "labeler_max_length", "int8", "ranker")


def cost_point(config: dict) -> dict:
    """The options of a config that decide what the loop reads (its point on the cost curve)."""
    return {k: config.get(k) for k in COST_OPTIONS if config.get(k) is not None}
