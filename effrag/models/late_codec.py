"""Product quantisation of a late ranker's token vectors: one byte per sub-vector, about 6 KB per chunk.

Why: stored as computed (bf16, 128 dims), a chunk's ~96 token vectors take about 25 KB, 25 GB per million passages.
That is too much to keep on disk beside an index, let alone in memory. ColBERTv2's residual compression was measured
first on these vectors: a centroid per token plus 1-2 bits per dimension of the residual. It kept too little,
because the vectors cluster loosely: a token's cosine to the nearest of 4,096 centroids averages 0.57, so the
residual holds most of the vector.

Product quantisation (Jegou et al., 2011) cuts each unit token vector into ``subspaces`` equal parts. For each part
it stores the index of the nearest of 256 code words, found by k-means over a sample of token vectors in that part.
That is ``subspaces`` bytes per token; bf16 takes 256. The default, 64 (2 dimensions a byte), is the fewest bytes
measured that keep both the ranker's MRR within 0.005 and the shipped loop configs' recall within 0.3 points:
- 32 bytes (about 3.1 KB a chunk) is the level the MRR rule picks on train groups (``scripts/late_codec_quality.py``).
  It lost 0.4 points of HotpotQA's recall at 7 chunks on the dev questions (``scripts/codec_recall.py``).
- 16 bytes lost 0.005-0.006 of MRR.
- Coarse centroids first (residual quantisation) measured no better at 2 more bytes a token.

Decoding concatenates the code words and renormalises.

The codec belongs to the model that made the vectors. :meth:`ProductQuantizer.save` writes ``codec.safetensors``
into the checkpoint folder, where it is recorded with the checkpoint's other files and so hash-checked at load.
Every store of that model's vectors names the codec's SHA-256 in its variant, so vectors made under one codec are
never decoded by another. A codec is data, not code: nothing is unpickled.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
import torch.nn.functional as F

CODEC_FORMAT = "effrag-late-codec/1"
CODEC_NAME = "codec.safetensors"
DEFAULT_SUBSPACES = 64  # bytes a token: 32 kept the MRR, not the loop's recall (reports/scale/codec-recall)
DEFAULT_COARSE = 0  # coarse centroids before the product quantiser (0: none)
CODES = 256
TRAIN_TOKENS = 131_072  # token vectors the code books are fitted on
KMEANS_ITERS = 15


def _tensor_sha(*tensors: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def kmeans(x: torch.Tensor, k: int, iters: int = KMEANS_ITERS, generator: torch.Generator | None = None,
           block: int = 65536) -> torch.Tensor:
    """``k`` centroids of the rows of ``x`` [N, d] (squared Euclidean; an empty cluster takes a random row).
    Deterministic for a given ``x`` and generator state."""
    g = generator or torch.Generator().manual_seed(0)
    k = min(k, len(x))
    cent = x[torch.randperm(len(x), generator=g)[:k]].clone()
    for _ in range(iters):
        assign = _nearest(x, cent, block)
        sums = torch.zeros_like(cent).index_add_(0, assign, x)
        counts = torch.bincount(assign, minlength=k)
        empty = counts == 0
        if empty.any():
            sums[empty] = x[torch.randint(len(x), (int(empty.sum()),), generator=g)]
            counts[empty] = 1
        cent = sums / counts.unsqueeze(1)
    return cent


def _nearest(x: torch.Tensor, cent: torch.Tensor, block: int = 65536) -> torch.Tensor:
    """The index of each row's nearest centroid (squared Euclidean)."""
    out = torch.empty(len(x), dtype=torch.long)
    norms = (cent * cent).sum(-1)
    for i in range(0, len(x), block):
        out[i: i + block] = (norms - 2 * x[i: i + block] @ cent.T).argmin(-1)
    return out


META_KEY = "effrag-late-codec"  # the one metadata key a codec file is written with (format, sha256, provenance)


def _codec_meta(metadata: dict) -> dict:
    """A codec file's ``{"format", "sha256", "provenance"}``: from its one key, or from the three separate keys the
    files written before 2026-11-29 hold (the shipped codec among them)."""
    if META_KEY in metadata:
        return json.loads(metadata[META_KEY])
    return {"format": metadata.get("format"), "sha256": metadata.get("sha256"),
            "provenance": json.loads(metadata.get("provenance") or "{}")}


class ProductQuantizer:
    """Code books [subspaces, codes, dim / subspaces] (fp32), and optionally ``coarse`` centroids [K, dim]: then a
    token is its nearest coarse centroid (2 bytes) plus the product-quantised residual (residual quantisation, as
    ColBERTv2's centroid + residual, with the residual's dimensions quantised jointly rather than one by one)."""

    def __init__(self, codebooks: torch.Tensor, coarse: torch.Tensor | None = None):
        if codebooks.ndim != 3 or not 1 <= codebooks.shape[1] <= CODES or codebooks.shape[0] < 1:
            raise ValueError(f"code books of shape {tuple(codebooks.shape)}: expected [subspaces, <= {CODES}, width]")
        self.codebooks = codebooks.float().contiguous()
        self.subspaces, _, self.width = self.codebooks.shape
        self.dim = self.subspaces * self.width
        if coarse is not None and (coarse.ndim != 2 or coarse.shape[1] != self.dim or not 1 <= len(coarse) <= 65536):
            raise ValueError(f"coarse centroids of shape {tuple(coarse.shape)}: expected [<= 65536, {self.dim}]")
        self.coarse = None if coarse is None else coarse.float().contiguous()
        self.sha256 = _tensor_sha(self.codebooks, *([] if coarse is None else [self.coarse]))
        self._norms = (self.codebooks * self.codebooks).sum(-1)  # [M, K]

    @property
    def bytes_per_token(self) -> int:
        return self.subspaces + (0 if self.coarse is None else 2)

    @classmethod
    def train(cls, vectors: torch.Tensor, subspaces: int = DEFAULT_SUBSPACES, seed: int = 0,
              sample: int = TRAIN_TOKENS, coarse: int = DEFAULT_COARSE) -> ProductQuantizer:
        """Fit code books (and ``coarse`` centroids first, 0: none) on token vectors [N, dim] (a seeded sample of
        at most ``sample`` rows, normalised)."""
        if vectors.ndim != 2 or vectors.shape[1] % subspaces:
            raise ValueError(f"vectors of shape {tuple(vectors.shape)}: the width must divide into {subspaces} parts")
        g = torch.Generator().manual_seed(seed)
        x = F.normalize(vectors.float(), dim=-1)
        if len(x) > sample:
            x = x[torch.randperm(len(x), generator=g)[:sample]]
        centroids = None
        if coarse:
            centroids = kmeans(x, coarse, generator=g)
            x = x - centroids[_nearest(x, centroids)]
        parts = x.reshape(len(x), subspaces, -1)
        books = [kmeans(parts[:, m].contiguous(), CODES, generator=g) for m in range(subspaces)]
        width = max(len(b) for b in books)
        books = [torch.cat([b, b[-1:].expand(width - len(b), -1)]) for b in books]  # a sample under 256 rows
        return cls(torch.stack(books), centroids)

    def compress(self, vectors: torch.Tensor) -> torch.Tensor:
        """Token vectors [T, dim] -> codes [T, bytes_per_token] (uint8; with coarse centroids, the first two bytes
        are the centroid's id, little-endian)."""
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise ValueError(f"vectors of shape {tuple(vectors.shape)}: this codec reads width {self.dim}")
        x = F.normalize(vectors.float(), dim=-1)
        head = []
        if self.coarse is not None:
            ids = _nearest(x, self.coarse)
            x = x - self.coarse[ids]
            head = [(ids & 0xFF).unsqueeze(1), (ids >> 8).unsqueeze(1)]
        parts = x.reshape(len(vectors), self.subspaces, self.width)
        dots = torch.einsum("tmw,mkw->tmk", parts, self.codebooks)
        codes = (self._norms.unsqueeze(0) - 2 * dots).argmin(-1)
        return torch.cat([*head, codes], 1).to(torch.uint8)

    def decompress(self, codes: torch.Tensor) -> torch.Tensor:
        """Unit token vectors [T, dim] (fp32) from :meth:`compress`'s codes."""
        codes = codes.long()
        rows = torch.arange(self.subspaces).unsqueeze(0)
        if self.coarse is None:
            return F.normalize(self.codebooks[rows, codes].reshape(len(codes), self.dim), dim=-1)
        base = self.coarse[codes[:, 0] | (codes[:, 1] << 8)]
        res = self.codebooks[rows, codes[:, 2:]].reshape(len(codes), self.dim)
        return F.normalize(base + res, dim=-1)

    # -- files ---------------------------------------------------------------------------------------
    def save(self, folder: str | Path, provenance: dict | None = None) -> Path:
        """Write ``folder/codec.safetensors`` whole (temporary file, renamed)."""
        from safetensors.torch import save_file

        from ..state_files import atomic_path

        path = Path(folder) / CODEC_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        # one metadata key: safetensors writes several in a per-process order, so the same codec would get other
        # bytes (and another file hash, which a checkpoint's fingerprint and the tuning rows read with it record)
        meta = {META_KEY: json.dumps({"format": CODEC_FORMAT, "sha256": self.sha256, "provenance": provenance or {}},
                                     sort_keys=True)}
        tensors = {"codebooks": self.codebooks, **({} if self.coarse is None else {"coarse": self.coarse})}
        with atomic_path(path) as tmp:
            save_file(tensors, str(tmp), metadata=meta)
        return path

    @staticmethod
    def recorded_provenance(path: str | Path) -> dict:
        """The provenance a codec file records (what it was fitted on and how), without loading its tensors; ``{}``
        for a missing or unreadable file."""
        try:
            data = Path(path).read_bytes()
            header = json.loads(data[8: 8 + int.from_bytes(data[:8], "little")])
            return _codec_meta(header.get("__metadata__") or {}).get("provenance") or {}
        except (OSError, ValueError, UnicodeDecodeError):
            return {}

    @classmethod
    def load(cls, path: str | Path) -> ProductQuantizer:
        """The codec in ``path``; a ValueError naming the file if it is not one or its bytes do not match the SHA-256
        recorded in it."""
        from safetensors import SafetensorError
        from safetensors.torch import load

        path = Path(path)
        try:
            data = path.read_bytes()
            header = json.loads(data[8: 8 + int.from_bytes(data[:8], "little")])
            meta = _codec_meta(header.get("__metadata__") or {})
            tensors = load(data)
            codec = cls(tensors["codebooks"], tensors.get("coarse"))
        except (SafetensorError, OSError, ValueError, KeyError, RuntimeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: not a late-vector codec ({str(e)[:120]})") from None
        if meta.get("format") != CODEC_FORMAT or meta.get("sha256") != codec.sha256:
            raise ValueError(f"{path}: its bytes do not match the SHA-256 recorded in it")
        return codec
