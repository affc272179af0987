"""A late-interaction pool ranker: a chunk is read once, at index time, and every later (query, chunk) read is a
MaxSim over stored token vectors (Khattab & Zaharia's ColBERT), not a transformer forward.

Why: the cross-encoder ranker reads each (query, chunk) pair with the whole encoder, and on MuSiQue the loop needs
the 6-layer teacher's ~34 reads per question to keep its bar (issue #45). Here the encoder reads the query alone
(once per query) and each chunk alone (once per chunk, cacheable at index time); a pair's score is
``exp(log_scale) * sum_i max_j <q_i, d_j>`` over the L2-normalised projections of their token states. The scale is
learned, so the scores sit on the teacher's log-odds scale the loop's pool weights were tuned on.

Trained like the distilled ranker (:mod:`.ranker`): one group of candidates per (query, gold chunk), the listwise loss
on the gold mixed with the KL divergence from the cross-encoder teacher's softmax over the group. A training feature
is the group's query sequence (``rank_query`` 1) followed by its candidates.

``predict`` has the cross-encoder's signature, so the loop reads with either. Chunk vectors are cached in memory by
the chunk's words (:meth:`index` fills the cache ahead of the questions, from a :mod:`.late_vectors` store on disk
where it holds them); a chunk never seen is encoded on first read.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .heads import DEFAULT_OPTIONS, EncoderWithHeads, forward_batches
from .late_codec import CODEC_NAME, ProductQuantizer
from .late_vectors import VectorStore, chunk_digest, model_fingerprint, shard_chunks, store_folder
from .ranker import RankerOutput, group_loss
from .tokenization import IGNORE

NOT_A_CANDIDATE = -1e4
CODEC_ENV = "EFFRAG_LATE_CODEC"  # 0: read a checkpoint without its codec (vectors kept as computed)  # the score of a group's query row in training (never above a gold)


class LateRankerModel(EncoderWithHeads):
    model_type = "late_ranker"
    label_names = {"rel": ["irrelevant", "relevant"]}
    # max_length: a chunk's sub-tokens; query_max_length: a query's; dim: the stored vector size per token;
    # cache_chunks: how many chunks' vectors are kept in memory (the least recently read go first)
    default_options = {**DEFAULT_OPTIONS, "max_length": 128, "query_max_length": 32, "dim": 128,
                       "distill_weight": 0.5, "distill_temperature": 1.0, "cache_chunks": 200_000,
                       "query_norm": 0}

    def build_heads(self, hidden: int, dropout: float) -> None:
        self.proj = nn.Linear(hidden, int(self.options["dim"]), bias=False)
        self.log_scale = nn.Parameter(torch.zeros(()))
        self._vectors = ChunkVectors()
        self.codec: ProductQuantizer | None = None  # with one, chunk vectors are kept as its codes (late_codec)

    @classmethod
    def from_pretrained(cls, path: str | Path, *args, **kwargs) -> LateRankerModel:
        """The checkpoint, and its codec where the checkpoint's recorded files name ``codec.safetensors`` (checked
        with them, then against the SHA-256 inside it). ``$EFFRAG_LATE_CODEC=0`` leaves the codec out: the vectors
        are then kept as computed (about 15x the bytes; what the codec's quality report compares with)."""
        import os

        from .model_files import read_effrag_config

        model = super().from_pretrained(path, *args, **kwargs)
        use = os.environ.get(CODEC_ENV, "1").strip()
        if use not in ("0", "1"):
            raise ValueError(f"{CODEC_ENV}={use!r}: expected 1 (use a checkpoint's codec, the default) or 0")
        if use == "1" and CODEC_NAME in (read_effrag_config(path).get("files") or {}):
            model.codec = ProductQuantizer.load(Path(path) / CODEC_NAME)
        return model

    def save_pretrained(self, path: str | Path, *args, **kwargs) -> None:
        """As :meth:`EncoderWithHeads.save_pretrained`, with the codec (if any) saved and recorded beside."""
        if self.codec is not None:
            self.codec.save(path, self._codec_provenance)
        super().save_pretrained(path, *args, **kwargs)

    _codec_provenance: dict | None = None

    def attach_codec(self, path: str | Path, codec: ProductQuantizer, provenance: dict | None = None) -> None:
        """Give this model ``codec`` and add it to its saved folder ``path``: ``codec.safetensors`` written and
        recorded among the checkpoint's files (the weights untouched). The stores' variant names the codec, so
        vectors made before are never read as codes."""
        from ..integrity import file_record
        from .model_files import read_effrag_config, update_effrag_config

        written = codec.save(path, provenance)
        files = dict(read_effrag_config(path).get("files") or {})
        files[CODEC_NAME] = file_record(written)
        update_effrag_config(path, files=files)
        self.codec, self._codec_provenance = codec, provenance
        self._forget_vectors()

    # -- the vectors --------------------------------------------------------------------------------
    def train(self, mode: bool = True) -> LateRankerModel:
        """Training mode drops the chunk vectors in memory and the weights' fingerprint: the weights are about to
        change in this process, and vectors made before would be read (and stored under the old weights' folder)
        as if they were the new weights'. Eval mode keeps them."""
        if mode:
            self._forget_vectors()
        return super().train(mode)

    def load_state_dict(self, state_dict, *args, **kwargs):
        out = super().load_state_dict(state_dict, *args, **kwargs)
        self._forget_vectors()  # other weights: other vectors
        return out

    def _forget_vectors(self) -> None:
        vectors = getattr(self, "_vectors", None)
        if vectors is not None:
            vectors.clear()
            vectors.weights = None

    # -- the vectors --------------------------------------------------------------------------------
    def token_vectors(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[B, T, dim] L2-normalised projections of the encoder's token states, zero at padding."""
        hidden = self.encode_hidden(input_ids, attention_mask)
        vec = F.normalize(self.proj(hidden).float(), dim=-1)
        return vec * attention_mask.unsqueeze(-1).to(vec.dtype)

    def maxsim(self, query: torch.Tensor, query_mask: torch.Tensor, chunks: torch.Tensor,
               chunk_mask: torch.Tensor) -> torch.Tensor:
        """Scores [N] of one query's vectors [Tq, dim] against N chunks' [N, Tc, dim] (masks [Tq], [N, Tc])."""
        sim = torch.einsum("qk,ntk->nqt", query.float(), chunks.float())
        sim = sim.masked_fill(chunk_mask[:, None, :] == 0, -1.0)  # padding never the best match (cosine >= -1)
        total = (sim.max(-1).values * query_mask.float()).sum(-1)
        if self.options.get("query_norm"):  # per query token, times a fixed length: scores comparable across queries
            total = total * (float(self.options["query_norm"]) / query_mask.float().sum().clamp(min=1))
        return total * self.log_scale.exp()

    # -- training -----------------------------------------------------------------------------------
    def forward(self, input_ids, attention_mask, token_type_ids=None, rank_group=None, rank_label=None,
                rank_teacher=None, rank_query=None, labels=None) -> RankerOutput:
        if rank_group is None or rank_query is None:
            raise ValueError("a late_ranker batch needs rank_group and rank_query (one query row per group)")
        vec = self.token_vectors(input_ids, attention_mask)
        scores = torch.full((len(input_ids),), NOT_A_CANDIDATE, dtype=torch.float, device=vec.device)
        is_query = rank_query.bool()
        for g in torch.unique(rank_group):
            in_g = rank_group == g
            q = torch.nonzero(in_g & is_query)[:, 0]
            docs = torch.nonzero(in_g & ~is_query)[:, 0]
            if len(q) != 1:
                raise ValueError(f"group {int(g)} has {len(q)} query rows, expected 1")
            scores[docs] = self.maxsim(vec[q[0]], attention_mask[q[0]], vec[docs], attention_mask[docs])
        out = RankerOutput(scores=scores)
        if rank_label is not None:
            docs = ~is_query
            out.loss = group_loss(self, scores[docs], rank_group[docs], rank_label[docs],
                                  None if rank_teacher is None else rank_teacher[docs])
        return out

    def encode_text(self, texts: list[str], max_length: int) -> list[dict]:
        enc = self.tokenizer(texts, truncation=True, max_length=max_length)
        return [{"input_ids": ids, "attention_mask": mask} for ids, mask in zip(enc["input_ids"], enc["attention_mask"])]

    def group_features(self, query: str, chunks: list[str], gold: list[int], teacher: list[float],
                       max_length: int | None = None) -> list[dict]:
        """A training group's sequences: the query (``rank_query`` 1), then each chunk with its label and teacher
        score (NaN where none)."""
        q = self.encode_text([query], int(self.options["query_max_length"]))[0]
        seqs = [{**q, "rank_label": IGNORE, "rank_teacher": math.nan, "rank_query": 1}]
        for f, y, t in zip(self.encode_text(chunks, max_length or self.max_length), gold, teacher):
            seqs.append({**f, "rank_label": int(y), "rank_teacher": float(t), "rank_query": 0})
        return seqs

    # -- inference ----------------------------------------------------------------------------------
    @torch.inference_mode()
    def _encode_all(self, texts: list[str], max_length: int, batch_size: int, bf16: bool) -> list[torch.Tensor]:
        """Each text's token vectors [T, dim] (padding dropped), on the CPU in bf16 or fp32."""
        from ..hardware import resolve_bf16

        feats = self.encode_text(texts, max_length)
        out: list[torch.Tensor | None] = [None] * len(texts)
        kept = torch.bfloat16 if resolve_bf16(bf16, self.device.type) else torch.float32
        for idx, vec in forward_batches(self, feats, batch_size, bf16,
                                        run=lambda b: self.token_vectors(b["input_ids"], b["attention_mask"])):
            for row, i in enumerate(idx):
                out[i] = vec[row, : len(feats[i]["input_ids"])].to("cpu", kept)
        return out  # type: ignore[return-value]

    def vector_variant(self, bf16: bool, max_length: int | None) -> dict:
        """What a chunk's vectors depend on besides its words: these weights (as they run: an int8 copy's are its
        own) and tokenizer, the stored dtype and the chunk length. The key of their folder in a
        :class:`~.late_vectors.VectorStore`."""
        if self._vectors.weights is None:
            self._vectors.weights = model_fingerprint(self)
        length, b16 = self._read_as(max_length, bf16)
        return {"weights": self._vectors.weights, "dim": int(self.options["dim"]), "dtype": "bf16" if b16 else "fp32",
                "max_length": length, "codec": None if self.codec is None else self.codec.sha256[:16]}

    def vector_store(self, root: str | Path, bf16: bool, max_length: int | None) -> VectorStore:
        """This model's store of chunk vectors under ``root`` (one folder per :meth:`vector_variant`)."""
        variant = self.vector_variant(bf16, max_length)
        return VectorStore(store_folder(root, variant), variant)

    def _read_as(self, max_length: int | None, bf16: bool) -> tuple[int, bool]:
        """The length and dtype a chunk's vectors are made at, the first part of its key in memory (a call that reads
        at another ``max_length`` or precision never gets vectors made for another)."""
        from ..hardware import resolve_bf16

        return int(max_length or self.max_length), resolve_bf16(bf16, self.device.type)

    def vectors_of(self, words, max_length: int | None = None, bf16: bool = False) -> torch.Tensor | None:
        """The vectors [T, dim] held in memory for a chunk read at ``max_length`` and ``bf16``, else None (with a
        codec: decoded from the codes held)."""
        payload = self._vectors.get((*self._read_as(max_length, bf16), tuple(words)))
        return None if payload is None else self._decode(payload)

    def _encode(self, vecs: list[torch.Tensor]) -> list[torch.Tensor]:
        """What is kept of each chunk's vectors: its codes with a codec, else the vectors as computed."""
        return vecs if self.codec is None else [self.codec.compress(v) for v in vecs]

    def _decode(self, payload: torch.Tensor) -> torch.Tensor:
        return payload if self.codec is None else self.codec.decompress(payload)

    def attach_store(self, store: VectorStore, max_length: int | None = None, bf16: bool = False) -> None:
        """Read chunks missing from memory from ``store`` (on demand, memory-mapped) before encoding them: how a
        corpus too large to load whole is read (:meth:`EfficientRAGLoop.prepare`). Only reads at the store's length
        and precision use it."""
        self._vectors.stores[self._read_as(max_length, bf16)] = store

    def _encode_chunks(self, keys: list[tuple], batch_size: int, bf16: bool, max_length: int | None,
                       store: VectorStore | None = None, progress=None) -> dict[tuple, torch.Tensor]:
        """Encode the chunks of ``keys`` (:meth:`_read_as` + words) in parts of
        :data:`~.late_vectors.SHARD_CHUNKS`, each part cached and (with ``store``) written as a shard before the next.
        Returns every payload made (the cache may not hold them all)."""
        made: dict[tuple, torch.Tensor] = {}
        limit = int(self.options["cache_chunks"])
        step = shard_chunks()
        for i in range(0, len(keys), step):
            part = keys[i: i + step]
            vecs = self._encode(self._encode_all([" ".join(k[-1]) for k in part], max_length or self.max_length,
                                                 batch_size, bf16))
            if store is not None:
                store.add([chunk_digest(k[-1]) for k in part], vecs)
            for key, vec in zip(part, vecs):
                made[key] = vec
                self._vectors.put(key, vec, limit)
            if progress is not None:
                progress(len(part))
        return made

    def index(self, chunks: list[list[str]] | list[tuple[str, ...]], batch_size: int = 32, bf16: bool = False,
              max_length: int | None = None, store: VectorStore | None = None, progress=None,
              load: bool = True) -> dict[str, int]:
        """Have the vectors of every chunk not cached yet (index time): from ``store`` where it holds them, else
        encoded (and added to ``store``, which questions then read on demand: :meth:`attach_store`). ``load``
        False leaves the stored ones on disk (``effrag index build``: nothing is read into memory). ``progress(n)``
        is called as each part of n chunks is done. Returns how many were ``loaded`` (or found, with ``load``
        False) and how many ``encoded``."""
        length, b16 = self._read_as(max_length, bf16)
        keys = [k for k in OrderedDict.fromkeys((length, b16, tuple(c)) for c in chunks) if k not in self._vectors]
        loaded = 0
        if store is not None and keys:
            self.attach_store(store, max_length, bf16)
            by_digest = {chunk_digest(k[-1]): k for k in keys}
            limit = int(self.options["cache_chunks"])
            if load:
                found = store.load(by_digest)
                for d, vec in found.items():
                    self._vectors.put(by_digest[d], vec, limit)
            else:
                found = store.contains(by_digest)
            loaded = len(found)
            if progress is not None and loaded:
                progress(loaded)
            keys = [k for d, k in by_digest.items() if d not in found]  # not "not cached": the limit may drop some
        self._encode_chunks(keys, batch_size, bf16, max_length, store, progress)
        if store is not None and (loaded or keys):  # this corpus's shards are known: the rest may be pruned
            store.prune_others()
        return {"loaded": loaded, "encoded": len(keys)}

    def _payloads(self, keys: list[tuple], batch_size: int, bf16: bool,
                  max_length: int | None) -> dict[tuple, torch.Tensor]:
        """Each key's payload: from memory, else from the attached store (on demand), else encoded."""
        out = {k: self._vectors.get(k) for k in OrderedDict.fromkeys(keys)}
        missing = [k for k, v in out.items() if v is None]
        store = self._vectors.stores.get(self._read_as(max_length, bf16)) if missing else None
        if store is not None:
            by_digest = {chunk_digest(k[-1]): k for k in missing}
            limit = int(self.options["cache_chunks"])
            for d, payload in store.load(by_digest).items():
                out[by_digest[d]] = payload
                self._vectors.put(by_digest[d], payload, limit)
            missing = [k for k in missing if out[k] is None]
        if missing:  # encoded here and returned: one call may hold more new chunks than the cache keeps
            out.update(self._encode_chunks(missing, batch_size, bf16, max_length))
        return out

    @torch.inference_mode()
    def predict(self, queries: list[str], chunks: list[list[str]], batch_size: int = 32,
                max_length: int | None = None, bf16: bool = False) -> list[float]:
        """The score of each (query, chunk word list) pair: the query is encoded once, each chunk once per cache
        life (at ``max_length`` sub-tokens, default the model's) or read from an attached store."""
        if len(queries) != len(chunks):
            raise ValueError(f"{len(queries)} queries for {len(chunks)} chunks")
        length, b16 = self._read_as(max_length, bf16)
        keys = [(length, b16, tuple(c)) for c in chunks]
        chunk_vecs = {k: self._decode(v) for k, v in self._payloads(keys, batch_size, bf16, max_length).items()}
        uniq = list(OrderedDict.fromkeys(queries))
        qvecs = dict(zip(uniq, self._encode_all(uniq, int(self.options["query_max_length"]), batch_size, bf16)))
        by_query: dict[str, list[int]] = {}
        for i, q in enumerate(queries):
            by_query.setdefault(q, []).append(i)
        scores = [0.0] * len(queries)
        for q, rows in by_query.items():
            vecs = [chunk_vecs[keys[i]] for i in rows]
            width = max(len(v) for v in vecs)
            dim = vecs[0].shape[-1]
            stacked = torch.zeros(len(vecs), width, dim)
            mask = torch.zeros(len(vecs), width)
            for j, v in enumerate(vecs):
                stacked[j, : len(v)] = v.float()
                mask[j, : len(v)] = 1
            qv = qvecs[q]
            values = self.maxsim(qv, torch.ones(len(qv)), stacked, mask).tolist()
            for j, i in enumerate(rows):
                scores[i] = values[j]
        return scores


class ChunkVectors:
    """A late ranker's in-memory chunk vectors: (length, bf16, chunk words) -> [T, dim], the least recently read
    dropped first past a limit; and the fingerprint of the weights that made them
    (:meth:`LateRankerModel.vector_variant`). A copy of the model (``copy.deepcopy``, as
    :func:`~effrag.pipelines.efficientrag.models.int8_copy` makes) starts empty: the vectors belong to the encoder
    that computed them, and copying a corpus's worth would double the memory."""

    def __init__(self):
        self._d: OrderedDict[tuple, torch.Tensor] = OrderedDict()
        self.weights: str | None = None
        self.stores: dict[tuple, VectorStore] = {}  # (length, bf16) -> the store read on a miss

    def __deepcopy__(self, memo) -> ChunkVectors:
        return ChunkVectors()

    def __contains__(self, key) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)

    def __iter__(self):
        return iter(self._d)

    def clear(self) -> None:
        self._d.clear()
        self.stores.clear()

    def get(self, key: tuple) -> torch.Tensor | None:
        vec = self._d.get(key)
        if vec is not None:
            self._d.move_to_end(key)
        return vec

    def put(self, key: tuple, vec: torch.Tensor, limit: int) -> None:
        self._d[key] = vec
        self._d.move_to_end(key)
        while len(self._d) > limit:
            self._d.popitem(last=False)
