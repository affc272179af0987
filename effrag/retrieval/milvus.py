"""Milvus (``pymilvus``) as a dense backend behind the same ``search(queries, k)``.

The same code runs against the embedded **Milvus Lite** (a local file URI such as
``index/milvus.db``: tests, laptops, one process) and a **Milvus server or cluster**
(``http://host:19530``, optionally with a ``token``): the index can then outgrow one
machine, and several ``effrag serve`` replicas can search one collection.

A collection holds one row per passage: ``id`` (INT64, the passage's row in the corpus) and
``vector`` (FLOAT_VECTOR, the encoder's embedding), with an inner-product index (``FLAT`` by
default: exact, the same ids and scores as FAISS flat; ``IVF_FLAT``/``HNSW`` on a server).
The saved index folder (``index_meta.json`` + ``corpus.jsonl``) records the URI and collection;
a Lite database inside the folder is recorded by its relative path, so the folder can be moved.
The database file itself is not hashed (Milvus rewrites it while serving); the corpus is.

``pymilvus`` and ``milvus-lite`` are imported only here, on first use (``pip install effrag[milvus]``).
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from .base import Hit
from .meta import IndexMismatchError, read_meta, verify_index, write_meta

log = logging.getLogger(__name__)

LITE_FILE = "milvus.db"
INSERT_BATCH = 5000
SEARCH_BATCH = 256


def is_server_uri(uri: str) -> bool:
    return "://" in str(uri)


def connect(uri: str | Path, token: str | None = None):
    """A ``MilvusClient`` for a server URI or a Milvus Lite database file (created if missing)."""
    try:
        from pymilvus import MilvusClient
    except ImportError as e:
        raise ImportError(f"the milvus backend needs pymilvus and milvus-lite "
                          f"(pip install 'effrag[milvus]'): {e}") from None
    lite = not is_server_uri(uri)
    if lite:
        Path(uri).parent.mkdir(parents=True, exist_ok=True)
        uri = str(Path(uri).resolve())
    try:
        return MilvusClient(uri=str(uri), **({"token": token} if token else {}))
    except Exception as e:
        if lite and "open local milvus failed" in str(e).lower():
            raise RuntimeError(f"cannot open Milvus Lite database {uri}: another process has it open (Milvus Lite "
                               "serves one process; point several processes at a Milvus server instead)") from e
        raise


_TYPES = {"flat": "FLAT", "ivf": "IVF_FLAT", "hnsw": "HNSW"}


def milvus_index_type(name: str) -> str:
    """Milvus's name of an index type; effrag's ``flat``/``ivf``/``hnsw`` are accepted too."""
    return _TYPES.get(str(name).lower(), str(name).upper())


def _index_params(client, index_type: str, nlist: int, hnsw_m: int, ef_construction: int):
    params = client.prepare_index_params()
    extra = {"IVF_FLAT": {"nlist": nlist}, "HNSW": {"M": hnsw_m, "efConstruction": ef_construction}}
    params.add_index(field_name="vector", index_type=index_type, metric_type="IP",
                     params=extra.get(index_type, {}))
    return params


class MilvusRetriever:
    """Dense search in a Milvus collection of the corpus's embeddings (inner product).

    Build one with :meth:`build` (from embeddings: an array or the memory-mapped shards of
    ``effrag index encode``), keep it with :meth:`save`, reopen it with :meth:`load` or
    :func:`~effrag.retrieval.load_retriever`.
    """

    kind = "milvus"

    def __init__(self, corpus, encoder, uri: str | Path, collection: str = "effrag", *, index_type: str = "FLAT",
                 nlist: int = 1024, nprobe: int = 16, hnsw_m: int = 32, ef_construction: int = 200,
                 ef_search: int = 128, token: str | None = None, batch_size: int = 64, _client=None):
        self.corpus, self.encoder = corpus, encoder
        self._passages = corpus.passages
        self.uri, self.collection, self.batch_size = str(uri), collection, batch_size
        index_type = milvus_index_type(index_type)
        self.opts = {"collection": collection, "index_type": index_type, "metric": "IP", "nlist": nlist,
                     "nprobe": nprobe, "hnsw_m": hnsw_m, "ef_construction": ef_construction, "ef_search": ef_search}
        self.client = _client or connect(uri, token)
        if not self.client.has_collection(collection):
            raise FileNotFoundError(f"Milvus at {uri} has no collection {collection!r}; build it first "
                                    "(effrag index build --backend milvus)")
        self.client.load_collection(collection)
        rows = self.client.get_collection_stats(collection).get("row_count")
        if rows is not None and int(rows) != len(corpus):
            raise IndexMismatchError(f"Milvus collection {collection!r} at {uri} holds {rows} vectors "
                                     f"but the corpus has {len(corpus)}")

    @classmethod
    def build(cls, corpus, encoder, uri: str | Path, embeddings, collection: str = "effrag", *,
              index_type: str = "FLAT", nlist: int = 1024, hnsw_m: int = 32, ef_construction: int = 200,
              token: str | None = None, insert_batch: int = INSERT_BATCH, show_progress: bool = True,
              **runtime) -> MilvusRetriever:
        """(Re)create ``collection`` at ``uri`` and insert ``embeddings`` (row i = passage i) in batches."""
        from pymilvus import DataType
        from tqdm.auto import tqdm

        n, dim = embeddings.shape
        index_type = milvus_index_type(index_type)
        if n != len(corpus):
            raise ValueError(f"{n} embeddings for a corpus of {len(corpus)} passages")
        client = connect(uri, token)
        if client.has_collection(collection):
            client.drop_collection(collection)
        schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", DataType.INT64, is_primary=True)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=int(dim))
        client.create_collection(collection, schema=schema,
                                 index_params=_index_params(client, index_type, nlist, hnsw_m, ef_construction))
        with tqdm(total=n, desc="filling Milvus", unit="vector", disable=not show_progress) as bar:
            for s in range(0, n, insert_batch):
                block = np.asarray(embeddings[s:s + insert_batch], dtype=np.float32)
                client.insert(collection, [{"id": s + j, "vector": v} for j, v in enumerate(block)])
                bar.update(len(block))
        client.flush(collection)
        return cls(corpus, encoder, uri, collection, index_type=index_type, nlist=nlist, hnsw_m=hnsw_m,
                   ef_construction=ef_construction, token=token, _client=client, **runtime)

    def _search_params(self) -> dict:
        t = self.opts["index_type"]
        params = {"IVF_FLAT": {"nprobe": self.opts["nprobe"]}, "HNSW": {"ef": self.opts["ef_search"]}}.get(t, {})
        return {"metric_type": "IP", "params": params}

    def search_vectors(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, rows) like FAISS's ``search``: ``-1`` rows pad a result shorter than ``k``."""
        k = min(k, len(self._passages))
        scores = np.full((len(vectors), k), -np.inf, dtype=np.float32)
        rows = np.full((len(vectors), k), -1, dtype=np.int64)
        for s in range(0, len(vectors), SEARCH_BATCH):
            res = self.client.search(self.collection, data=[v.tolist() for v in vectors[s:s + SEARCH_BATCH]],
                                     limit=k, search_params=self._search_params(), output_fields=["id"],
                                     anns_field="vector")
            for qi, hits in enumerate(res):
                for j, h in enumerate(hits):
                    rows[s + qi, j], scores[s + qi, j] = int(h["id"]), float(h["distance"])
        return scores, rows

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if k <= 0:
            raise ValueError(f"k must be positive, got {k}")
        if not queries:
            return []
        scores, rows = self.search_vectors(self.encoder.encode_queries(list(queries), self.batch_size), k)
        out = []
        for srow, irow in zip(scores, rows):
            out.append([Hit(id=self._passages[i].id, title=self._passages[i].title, text=self._passages[i].text,
                            score=float(sc)) for sc, i in zip(srow, irow) if i >= 0])
        return out

    def close(self) -> None:
        """Release the connection; for Milvus Lite also stop this process's server of the file, so that
        another process can open it (other clients of the same file in this process stop working too)."""
        self.client.close()
        if not is_server_uri(self.uri):
            from milvus_lite.server_manager import server_manager_instance

            server_manager_instance.release_server(str(Path(self.uri).resolve()))

    # ------------------------------------------------------------------ persistence
    def save(self, directory: str | Path, write_corpus: bool = True) -> Path:
        """``index_meta.json`` + ``corpus.jsonl`` naming the collection (the vectors stay in Milvus)."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        uri = self.uri
        if not is_server_uri(uri) and Path(uri).resolve().parent == d.resolve():
            uri = Path(uri).name  # a Lite file in the folder: relative, so the folder can move
        write_meta(d, self.kind, self.corpus, {**self.opts, "uri": uri}, encoder=self.encoder,
                   write_corpus=write_corpus)
        return d

    @classmethod
    def load(cls, directory: str | Path, corpus, encoder, verify: str | None = None, uri: str | None = None,
             token: str | None = None, **runtime) -> MilvusRetriever:
        """Reopen a saved Milvus index; ``uri`` points it at another server holding the same collection."""
        d = Path(directory)
        meta = read_meta(d)
        verify_index(d, meta, verify)
        if meta["encoder"]["fingerprint"] != encoder.fingerprint():
            raise IndexMismatchError(f"{d}: Milvus collection was filled with encoder fingerprint "
                                     f"{meta['encoder']['fingerprint']}, not {encoder.fingerprint()}")
        opts = dict(meta["options"])
        saved_uri = opts.pop("uri")
        if uri is None:
            uri = saved_uri if is_server_uri(saved_uri) else str(d / saved_uri)
        opts.pop("metric", None)
        opts.update({k: v for k, v in runtime.items() if k in ("nprobe", "ef_search")})
        return cls(corpus, encoder, uri, opts.pop("collection"), token=token,
                   batch_size=runtime.get("batch_size", 64), **opts)
