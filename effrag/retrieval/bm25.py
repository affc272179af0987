"""Sparse retrieval: BM25 over title + text with bm25s.

Tokenisation is bm25s's (lower-case, ``\\w\\w+`` words, English stopwords) plus
the Snowball English stemmer when PyStemmer is installed (``stemmer="auto"``).
The stemmer choice is saved with the index, because queries must be tokenised
exactly as the corpus was.
"""
from __future__ import annotations

import logging
from functools import lru_cache
from pathlib import Path

from ..integrity import CorruptFileError, short_error, writing
from .base import Hit
from .meta import REBUILD, files_under, read_meta, verify_index, write_meta


@lru_cache(maxsize=1)
def _bm25s():
    """``import bm25s`` once, then undo its import-time ``setLevel(DEBUG)``, which floods any program that logs."""
    import bm25s

    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return bm25s


def _make_stemmer(name: str | None):
    if not name:
        return None
    import Stemmer  # PyStemmer

    return Stemmer.Stemmer(name)


def resolve_stemmer(stemmer: str | None) -> str | None:
    """``"auto"`` -> ``"english"`` if PyStemmer is importable, else None (no stemming)."""
    if stemmer != "auto":
        return stemmer or None
    try:
        import Stemmer  # noqa: F401
    except ImportError:
        return None
    return "english"


def _unreadable_file(folder: Path) -> Path | None:
    """The first ``.npy`` or ``.json`` file in a saved bm25s folder that does not read back, if any."""
    import json

    import numpy as np

    for p in sorted(folder.iterdir()):
        try:
            if p.suffix == ".npy":
                np.load(p, allow_pickle=False, mmap_mode="r")
            elif p.suffix == ".json":
                json.loads(p.read_text(encoding="utf-8"))
        except (ValueError, OSError, EOFError, UnicodeDecodeError):
            return p
    return None


class BM25Retriever:
    """BM25 (Lucene variant) over ``"title text"`` of every passage.

    Passages sharing no term with the query score 0 and are not returned, so a
    query may get fewer than ``k`` hits.

    ``article=True`` adds IRRR's article score (Qi et al., 2021, Appendix B): every
    passage also gets the score of its whole article (all passages with its title,
    concatenated) under BM25 with squared, non-negative IDF and no length
    normalisation (b = 0), so rare terms anywhere in the article lift its paragraphs.
    """

    kind = "bm25"

    def __init__(self, corpus, k1: float = 1.2, b: float = 0.75, stopwords: str | None = "en",
                 stemmer: str | None = "auto", article: bool = False, show_progress: bool = True, _model=None):
        bm25s = _bm25s()

        self.corpus = corpus
        self._passages = corpus.passages
        self.opts = {"k1": k1, "b": b, "stopwords": stopwords, "stemmer": resolve_stemmer(stemmer)}
        if article:
            self.opts["article"] = True
        self._stemmer = _make_stemmer(self.opts["stemmer"])
        if _model is None:
            tokens = bm25s.tokenize([f"{p.title} {p.text}" for p in self._passages],
                                    stopwords=stopwords or [], stemmer=self._stemmer,
                                    show_progress=show_progress)
            _model = bm25s.BM25(k1=k1, b=b)
            _model.index(tokens, show_progress=show_progress)
        self._model = _model
        self._article = self._article_index() if article else None

    def _article_index(self):
        """(weights [articles x vocab] CSC, passage -> article row) for the Appendix-B article score."""
        import numpy as np
        from scipy import sparse

        vocab = self._model.vocab_dict
        rows: dict[str, int] = {}
        of_passage = np.array([rows.setdefault(p.title, len(rows)) for p in self._passages])
        texts = [""] * len(rows)
        for p, r in zip(self._passages, of_passage):
            texts[r] += f" {p.text}"
        for title, r in rows.items():
            texts[r] = f"{title} {texts[r]}"
        counts = sparse.lil_matrix((len(rows), len(vocab)), dtype=np.float32)
        for r, toks in enumerate(self._tokenize(texts)):
            for t in toks:
                if t in vocab:
                    counts[r, vocab[t]] += 1
        counts = counts.tocsc()
        n_docs = counts.shape[0]
        df = np.diff(counts.indptr).astype(np.float64)
        idf = np.maximum(0.0, np.log((n_docs - df + 0.5) / (df + 0.5)))
        k1 = self.opts["k1"]
        w = counts.copy()
        w.data = w.data * (1 + k1) / (w.data + k1)
        w = w @ sparse.diags((idf ** 2).astype(np.float32))
        return w.tocsc(), of_passage

    def _tokenize(self, queries: list[str]) -> list[list[str]]:
        bm25s = _bm25s()

        return bm25s.tokenize(list(queries), stopwords=self.opts["stopwords"] or [], stemmer=self._stemmer,
                              return_ids=False, show_progress=False)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if k <= 0:
            raise ValueError(f"k must be positive, got {k}")
        if not queries:
            return []
        if self._article is not None:
            return [self._search_full(q, k) for q in queries]
        rows, scores = self._model.retrieve(self._tokenize(queries), k=min(k, len(self._passages)),
                                            show_progress=False, n_threads=1)
        out = []
        for irow, srow in zip(rows, scores):
            hits = []
            for i, s in zip(irow, srow):
                if s <= 0:
                    break  # sorted: the rest share no term with the query
                p = self._passages[int(i)]
                hits.append(Hit(id=p.id, title=p.title, text=p.text, score=float(s)))
            out.append(hits)
        return out

    def _search_full(self, query: str, k: int) -> list[Hit]:
        import numpy as np

        s = self.scores(query)
        k = min(k, len(s))
        top = np.argpartition(-s, k - 1)[:k]
        hits = []
        for i in top[np.argsort(-s[top], kind="stable")]:
            if s[i] <= 0:
                break
            p = self._passages[int(i)]
            hits.append(Hit(id=p.id, title=p.title, text=p.text, score=float(s[i])))
        return hits

    def scores(self, query: str):
        """BM25 score of every passage, in corpus order, for one query (0 where no term is shared).

        What an oracle needs to know the rank of one given passage, not just the top k.
        """
        import numpy as np

        tokens = [t for t in self._tokenize([query])[0] if t in self._model.vocab_dict]
        if not tokens:
            return np.zeros(len(self._passages), dtype=np.float32)
        scores = self._model.get_scores(tokens)
        if self._article is not None:
            weights, of_passage = self._article
            ids = sorted({self._model.vocab_dict[t] for t in tokens})
            scores = scores + np.asarray(weights[:, ids].sum(axis=1)).ravel()[of_passage]
        return scores

    # ------------------------------------------------------------------ persistence
    def save(self, directory: str | Path, write_corpus: bool = True) -> Path:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        with writing(d / "bm25"):
            self._model.save(str(d / "bm25"), show_progress=False)
        write_meta(d, self.kind, self.corpus, self.opts, write_corpus=write_corpus, files=files_under(d, "bm25"))
        return d

    @classmethod
    def load(cls, directory: str | Path, corpus, verify: str | None = None, mmap: bool = False,
             **_runtime) -> BM25Retriever:
        """Load a saved index; ``verify`` (``"cheap"``/``"full"``/``"off"``) checks its files first.

        ``mmap=True`` memory-maps the score matrix instead of reading it (large corpora: the OS pages
        in what queries touch, and several processes share one copy).
        """
        bm25s = _bm25s()

        d = Path(directory)
        meta = read_meta(d)
        verify_index(d, meta, verify)
        opts = meta["options"]
        if opts["stemmer"]:
            try:
                _make_stemmer(opts["stemmer"])
            except ImportError:
                raise ImportError(f"{d}: index was built with the {opts['stemmer']!r} stemmer; "
                                  "install PyStemmer to query it") from None
        if not (d / "bm25").is_dir():
            raise FileNotFoundError(f"{d / 'bm25'} not found: the index folder is incomplete; {REBUILD}")
        try:  # never unpickle: a damaged .npy header must not turn into an offer to run pickled code
            model = bm25s.BM25.load(str(d / "bm25"), show_progress=False, allow_pickle=False, mmap=mmap)
        except FileNotFoundError:
            raise
        except (ValueError, OSError, EOFError, KeyError, TypeError) as e:
            bad = _unreadable_file(d / "bm25") or d / "bm25"
            raise CorruptFileError(f"corrupted file {bad} ({short_error(e)}); {REBUILD}") from None
        return cls(corpus, opts["k1"], opts["b"], opts["stopwords"], opts["stemmer"], article=opts.get("article", False),
                   _model=model)
