"""Scale-out benchmark (issue #15): FAISS flat / IVF-Flat / IVF-PQ / HNSW and Milvus Lite.

    nice -n 10 python scripts/bench_scale.py --part pooled              # the real pooled corpus
    nice -n 10 python scripts/bench_scale.py --part synthetic --sizes 1000000 5000000
    nice -n 10 python scripts/bench_scale.py --part report              # results.md: every row measured

Every (size, backend) is measured in its own child process (``--one``), so its peak RSS is its own.
Vectors are searched as vectors (queries are encoded once, up front): queries/s is the backend's.
Recall@10 is against exact inner-product search over the same vectors.

* ``pooled``: the embeddings of every passage of hotpotqa/2wikimqa/musique train+dev (the cached
  ``effrag eval --retriever dense --bf16`` flat index, read back with ``reconstruct_n``), queries =
  the first 300 dev questions of each dataset.
* ``synthetic``: N vectors made from those real embeddings: row i = normalise(base[i mod n0] + noise),
  noise ~ N(0, ``--noise``^2) per dimension, written to a memory-mapped ``.npy`` (seeded).
* ``report``: ``results.md``, the rows of ``results.jsonl`` as one table (``report.md`` beside it holds the
  growth from the pooled size to 1M to 5M and the 21M sizing table derived from these rows).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np

from effrag.cli_args import DATASETS  # noqa: E402

K = 10


def pooled_files(data_dir: str) -> list[str]:
    return [str(Path(data_dir) / d / f"{s}.jsonl") for d in DATASETS for s in ("train", "dev")]


def rss_peak_mb() -> float:
    """Peak resident memory of this process (VmHWM: unlike ru_maxrss, not inherited over fork + exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---------------------------------------------------------------------------- inputs
def prepare_pooled(args, work: Path) -> None:
    """base.npy (pooled corpus embeddings) and queries.npy (dev questions), from the cached flat index."""
    from effrag.data import load_questions
    from effrag.setup import RunSetup

    if (work / "base.npy").is_file() and (work / "queries.npy").is_file():
        return
    t0 = time.perf_counter()
    pooled = RunSetup.build(corpus_from=pooled_files(args.data), retriever="dense", bf16=True, index_type="flat",
                            retriever_options={"gpu": False})
    corpus, flat = pooled.corpus, pooled.retriever
    print(f"pooled corpus {len(corpus)} passages, flat index ready in {time.perf_counter() - t0:.0f} s", flush=True)
    np.save(work / "base.npy", flat._cpu_index.reconstruct_n(0, flat._cpu_index.ntotal))
    qs = [q.question for d in DATASETS for q in load_questions(Path(args.data) / d / "dev.jsonl")[:300]]
    np.save(work / "queries.npy", flat.encoder.encode_queries(qs))
    (work / "pooled.json").write_text(json.dumps({"n": len(corpus), "fingerprint": corpus.fingerprint()}))


def make_synthetic(base: np.ndarray, n: int, path: Path, noise: float, seed: int = 0) -> Path:
    if path.is_file() and np.load(path, mmap_mode="r").shape[0] == n:
        return path
    out = np.lib.format.open_memmap(path.with_suffix(".tmp.npy"), mode="w+", dtype=np.float32, shape=(n, base.shape[1]))
    rng = np.random.default_rng(seed)
    for s in range(0, n, 200_000):
        rows = base[np.arange(s, min(n, s + 200_000)) % len(base)]
        x = rows + rng.normal(0, noise, rows.shape).astype(np.float32)
        out[s:s + len(x)] = x / np.linalg.norm(x, axis=1, keepdims=True)
    out.flush()
    del out
    path.with_suffix(".tmp.npy").replace(path)
    return path


def exact_topk(emb, q: np.ndarray, k: int = K, block: int = 500_000) -> np.ndarray:
    """Exact inner-product top-k ids, scanning the (memory-mapped) vectors block by block."""
    best_s = np.full((len(q), k), -np.inf, np.float32)
    best_i = np.zeros((len(q), k), np.int64)
    for s in range(0, len(emb), block):
        sc = q @ np.asarray(emb[s:s + block]).T
        cand_s = np.concatenate([best_s, sc], axis=1)
        cand_i = np.concatenate([best_i, np.arange(s, s + sc.shape[1])[None].repeat(len(q), 0)], axis=1)
        top = np.argpartition(-cand_s, k - 1, axis=1)[:, :k]
        best_s, best_i = np.take_along_axis(cand_s, top, 1), np.take_along_axis(cand_i, top, 1)
    return best_i


# ---------------------------------------------------------------------------- one measurement (child)
def measure_one(args) -> dict:
    import faiss

    from effrag.retrieval.faiss_index import build_faiss_index, set_search_params

    faiss.omp_set_num_threads(args.threads)
    work = Path(args.work)
    emb = np.load(args.one_file, mmap_mode="r")
    q = np.load(args.queries)
    truth = np.load(args.truth)
    n = len(emb)
    rss0 = rss_peak_mb()
    t0 = time.perf_counter()
    row = {"n": n, "backend": args.one_type}
    if args.one_type == "milvus":
        from effrag.retrieval.milvus import MilvusRetriever

        class _Rows:  # Milvus needs only the corpus's size here: searched by vector, ids are rows
            def __init__(self, n):
                self.passages = range(n)

            def __len__(self):
                return len(self.passages)

        db = work / f"milvus-{n}.db"
        r = MilvusRetriever.build(_Rows(n), None, str(db), emb, collection=f"bench{n}", show_progress=False)
        build_s = time.perf_counter() - t0
        search = lambda x: r.search_vectors(x, K)  # noqa: E731
        size = sum(f.stat().st_size for f in db.rglob("*") if f.is_file()) if db.is_dir() else db.stat().st_size
        row.update(settings="FLAT (IP), milvus-lite")
    else:
        opts = {"hnsw": dict(hnsw_m=32, ef_construction=args.ef_construction),
                "ivf": dict(nlist=args.nlist or None, train_size=args.train_size),
                "ivfpq": dict(nlist=args.nlist or None, train_size=args.train_size)}.get(args.one_type, {})
        index = build_faiss_index(emb, args.one_type, **opts)
        build_s = time.perf_counter() - t0
        set_search_params(index, args.one_type, nprobe=args.nprobe, ef_search=args.ef_search)
        path = work / f"index-{args.one_type}-{n}.faiss"
        faiss.write_index(index, str(path))
        size = path.stat().st_size
        path.unlink()
        search = lambda x: index.search(x, K)  # noqa: E731
        if args.one_type == "flat":
            settings = "exact"
        elif args.one_type == "hnsw":
            settings = f"M=32 efConstruction={args.ef_construction} efSearch={args.ef_search}"
        else:
            settings = (f"nlist={faiss.extract_index_ivf(index).nlist} nprobe={args.nprobe} train={args.train_size}"
                        + (" pq=48x8bit" if args.one_type == "ivfpq" else ""))
        row.update(settings=settings)
    search(q[:8])  # warm-up
    t1 = time.perf_counter()
    _, ids = search(q)
    qps = len(q) / (time.perf_counter() - t1)
    recall = float(np.mean([len(set(a[a >= 0]) & set(b)) / K for a, b in zip(ids, truth)]))
    row.update(build_s=round(build_s, 2), peak_rss_mb=round(rss_peak_mb(), 1),
               rss_added_mb=round(rss_peak_mb() - rss0, 1), disk_mb=round(size / 2**20, 1),
               qps=round(qps, 1), recall_at_10=round(recall, 4), threads=args.threads)
    return row


def run_child(args, file: Path, truth: Path, backend: str, work: Path, queries: Path) -> dict:
    cmd = [sys.executable, __file__, "--one", backend, "--one-file", str(file), "--truth", str(truth),
           "--queries", str(queries),
           "--work", str(work), "--threads", str(args.threads), "--nprobe", str(args.nprobe),
           "--ef-search", str(args.ef_search), "--ef-construction", str(args.ef_construction),
           "--train-size", str(args.train_size), "--nlist", str(args.nlist)]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        return {"n": int(np.load(file, mmap_mode="r").shape[0]), "backend": backend, "error": res.stderr[-800:]}
    row = json.loads(res.stdout.strip().splitlines()[-1])
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    return row


def append(out: Path, row: dict, commit: str) -> None:
    row = {**row, "commit": commit}  # the commit each row was measured at (rows accumulate over runs)
    print(json.dumps(row), flush=True)
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


# ---------------------------------------------------------------------------- parts
def part_pooled(args, out: Path, work: Path) -> None:
    prepare_pooled(args, work)
    base, q = np.load(work / "base.npy"), np.load(work / "queries.npy")
    truth = work / f"truth-{len(base)}.npy"
    np.save(truth, exact_topk(base, q))
    for backend in args.types + ["milvus"]:
        append(out, {"part": "pooled", **run_child(args, work / "base.npy", truth, backend, work,
                                                         work / "queries.npy")}, args.commit)


def part_synthetic(args, out: Path, work: Path) -> None:
    base, q = np.load(work / "base.npy"), np.load(work / "queries.npy")[: args.synthetic_queries]
    np.save(work / "queries-synth.npy", q)
    for n in args.sizes:
        t0 = time.perf_counter()
        f = make_synthetic(base, n, work / f"synthetic-{n}.npy", args.noise)
        gen_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        truth = work / f"truth-{n}.npy"
        if not truth.is_file():
            np.save(truth, exact_topk(np.load(f, mmap_mode="r"), q))
        print(f"{n}: vectors in {gen_s:.0f} s, exact top-10 of {len(q)} queries in {time.perf_counter() - t0:.0f} s")
        for backend in args.types:
            if backend == "hnsw" and n > args.hnsw_max:
                continue
            if backend in ("flat", "ivf") and n * base.shape[1] * 4 > args.max_ram_gb * 2**30:
                continue
            append(out, {"part": "synthetic", "noise": args.noise, **run_child(args, f, truth, backend, work,
                                                                                   work / "queries-synth.npy")},
                   args.commit)


def build_backend_dirs(args, work: Path, backends: list[str]) -> dict[str, Path]:
    """Saved index folders over the pooled corpus, one per backend, filled from base.npy (no re-encoding)."""
    from effrag.setup import RunSetup

    pooled = RunSetup.build(corpus_from=pooled_files(args.data), retriever=None)  # the corpus; indexes below
    emb = np.load(work / "base.npy", mmap_mode="r")
    dirs = {}
    for b in backends:
        d = work / f"idx-{b}"
        if not (d / "index_meta.json").is_file():
            if b == "milvus":
                r = pooled.over("milvus", cache=False, bf16=True, uri=str(d / "milvus.db"), embeddings=emb,
                                show_progress=False).retriever
            else:
                r = pooled.over("dense", cache=False, bf16=True, index_type=b, embeddings=emb, nprobe=args.nprobe,
                                ef_search=args.ef_search, gpu=False, show_progress=False).retriever
            r.save(d)
            if b == "milvus":
                r.close()  # Milvus Lite serves one process: let `effrag eval` open it
        dirs[b] = d
    return dirs


def part_e2e(args, out: Path, work: Path) -> None:
    """``effrag eval --index <backend>`` for Direct-R and EfficientRAG on each dev file."""
    prepare_pooled(args, work)  # base.npy, when this work folder has not run the pooled part
    dirs = build_backend_dirs(args, work, args.types + ["milvus"])
    ck = Path(args.checkpoints)
    done = set()
    if (out / "results.jsonl").is_file():  # a rerun only adds what is missing or failed
        for line in (out / "results.jsonl").read_text().splitlines():
            r = json.loads(line)
            if r.get("part") == "e2e" and "error" not in r:
                done.add((r["dataset"], r["method"], r["backend"], r["n"]))
    for ds in DATASETS:
        dev = Path(args.data) / ds / "dev.jsonl"
        for method, limit in (("direct-r", args.e2e_limit), ("efficientrag", args.er_limit)):
            if not limit:
                continue
            extra = ["--k", "10"] if method == "direct-r" else [
                "--labeler", str(ck / "labeler"), "--filter", str(ck / "filter"),
                "--er-config", str(ck / f"loop-{ds}.json")]
            for b, d in dirs.items():
                if (ds, method, b, limit) in done:
                    continue
                run = out / "e2e" / f"{ds}-{method}-{b}"
                cmd = [sys.executable, "-m", "effrag.cli", "eval", "--method", method, "--questions", str(dev),
                       "--index", str(d), "--bf16", "--limit", str(limit), "--output", str(run), *extra]
                t0 = time.perf_counter()
                res = subprocess.run(cmd, capture_output=True, text=True)
                row = {"part": "e2e", "dataset": ds, "method": method, "backend": b, "n": limit,
                       "wall_s": round(time.perf_counter() - t0, 1)}
                if res.returncode != 0:
                    row["error"] = res.stderr[-500:]
                else:
                    m = json.loads((run / "metrics.json").read_text())[-1]
                    row.update(recall=m["recall"], avg_chunks=m.get("avg_chunks"), latency_s=m.get("latency_s"))
                append(out, row, args.commit)


TARGET = 21_000_000


def sizing(rows: list[dict], target: int = TARGET) -> list[str]:
    """21M-passage memory/disk per index type, scaled linearly from the largest measured size of each
    (build time too, n log n for HNSW).

    Per-vector bytes = disk size / n at that size (a FAISS index in memory is the size of its file, so
    memory = disk for FAISS; the build also needs the sampled training vectors and the add batches).
    """
    lines = ["| index | measured at | bytes/vector | disk at 21M | memory at 21M | build time at 21M, 2 cores |",
             "|---|---|---|---|---|---|"]
    best: dict[str, dict] = {}
    for r in rows:
        if r.get("part") in ("pooled", "synthetic") and "error" not in r:
            if r["n"] >= best.get(r["backend"], {}).get("n", 0):
                best[r["backend"]] = r
    for b, r in best.items():
        per = r["disk_mb"] * 2**20 / r["n"]
        gb = per * target / 2**30
        growth = target / r["n"] * (math.log(target) / math.log(r["n"]) if b == "hnsw" else 1)  # HNSW: n log n
        build_h = r["build_s"] * growth / 3600
        lines.append(f"| {b} | {r['n']:,} | {per:,.0f} | {gb:,.1f} GiB | {gb:,.1f} GiB"
                     + (" (Milvus server memory, not measured)" if b == "milvus" else "")
                     + f" | {build_h:,.1f} h |")
    return lines


def write_table(out: Path) -> None:
    """``results.md``: the index rows of ``results.jsonl``, the end-to-end rows (the latest per dataset, method
    and backend), the failed attempts (one line each; a rerun retries them), then the sizing table."""
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    ok = [r for r in rows if "error" not in r]
    cols = ["part", "n", "backend", "settings", "build_s", "peak_rss_mb", "disk_mb", "qps", "recall_at_10", "threads"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in ok if r.get("part") != "e2e"]
    e2e = {(r["dataset"], r["method"], r["backend"]): r for r in ok if r.get("part") == "e2e"}
    lines += ["", "| dataset | method | backend | n | recall | avg chunks | wall s |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {d} | {m} | {b} | {r['n']} | {r['recall']:.4f} | {r['avg_chunks']} | {r.get('wall_s', '')} |"
              for (d, m, b), r in e2e.items()]
    failed = [r for r in rows if "error" in r]
    if failed:
        lines += ["", "Failed attempts (retried by a rerun):", ""]
        lines += [f"- {r.get('part')} {r.get('dataset', r.get('n'))} {r.get('method', '')} {r.get('backend')}: "
                  + " ".join(str(r["error"]).split())[-160:] for r in failed]
    lines += ["", *sizing(rows)]
    (out / "results.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    from effrag.cli_args import (
        add_checkpoints_arg,
        add_data_dir_arg,
        add_output_arg,
        add_source_args,
        add_threads_arg,
        add_work_arg,
    )
    from effrag.provenance import report_source

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=["pooled", "synthetic", "e2e", "report"], default="pooled")
    add_checkpoints_arg(p, "checkpoints/efficientrag-all", help="an EfficientRAG system folder (labeler/, filter/, "
                                                                "loop-<ds>.json)")
    p.add_argument("--e2e-limit", type=int, default=200, help="Direct-R: first N dev questions per dataset")
    p.add_argument("--er-limit", type=int, default=50, help="EfficientRAG: first N dev questions per dataset")
    add_data_dir_arg(p)
    add_output_arg(p, "reports/scale")
    add_work_arg(p, help="scratch folder for vectors, GBs at 5M (default $TMPDIR/effrag-scale, outside the repo)")
    p.add_argument("--types", nargs="+", default=["flat", "ivf", "ivfpq", "hnsw"])
    p.add_argument("--sizes", nargs="+", type=int, default=[1_000_000, 5_000_000])
    p.add_argument("--noise", type=float, default=0.02, help="std of the Gaussian noise per dimension")
    p.add_argument("--synthetic-queries", type=int, default=300)
    p.add_argument("--hnsw-max", type=int, default=1_000_000, help="largest size HNSW is built at")
    p.add_argument("--max-ram-gb", type=float, default=8.0, help="skip flat/IVF-Flat above this many GiB of vectors")
    add_threads_arg(p, 2, help="FAISS threads")
    p.add_argument("--nlist", type=int, default=0, help="IVF lists (0: 4 sqrt(n))")
    p.add_argument("--nprobe", type=int, default=16)
    p.add_argument("--ef-search", type=int, default=128)
    p.add_argument("--ef-construction", type=int, default=200)
    p.add_argument("--train-size", type=int, default=131072)
    p.add_argument("--one", dest="one_type", help=argparse.SUPPRESS)
    p.add_argument("--one-file", help=argparse.SUPPRESS)
    p.add_argument("--truth", help=argparse.SUPPRESS)
    p.add_argument("--queries", help=argparse.SUPPRESS)
    add_source_args(p)
    args = p.parse_args()
    out = Path(args.output)
    work = Path(args.work or Path(tempfile.gettempdir()) / "effrag-scale")
    if args.one_type:  # a child of the run below, which checked the tree
        print(json.dumps(measure_one(args)))
        return
    args.commit = report_source(out, args.allow_dirty)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    if args.part == "pooled":
        part_pooled(args, out, work)
    elif args.part == "synthetic":
        part_synthetic(args, out, work)
    elif args.part == "e2e":
        part_e2e(args, out, work)
    else:
        write_table(out)


if __name__ == "__main__":
    main()
