"""scripts/device/late_ranker_curve.py: what it packs for the GPU trains on the same features as train.py, and the
weights it sends back rebuild the checkpoint."""
from __future__ import annotations

import importlib.util

import pytest
import torch
from helpers import REPO, tiny_bert_base
from safetensors.torch import load_file

from effrag.models import LateRankerModel
from effrag.training.tasks import late_ranker as task

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def curve():
    spec = importlib.util.spec_from_file_location("late_ranker_curve", REPO / "scripts" / "device" /
                                                  "late_ranker_curve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    base = tiny_bert_base(tmp_path_factory.mktemp("curve_base"), seed=5)
    torch.manual_seed(5)
    return LateRankerModel.from_encoder(str(base), {"dim": 8, "max_length": 40, "query_max_length": 12})


GROUPS = [
    {"query": "Which river runs through the capital of France?", "candidates": [
        {"title": "Paris", "text": "Paris, France's capital (pop. 2.1M), lies on the Seine.  Its mayor's office...",
         "gold": 1, "teacher": 2.5},
        {"title": "Île-de-France", "text": "The region\taround Paris — \"the island\" — has 12,000,000 people.",
         "gold": 0, "teacher": -1.0},
        {"title": "", "text": "A chunk with no title: U.S.-made, e-mail, 3.5km/h!", "gold": 0, "teacher": 0.1}]},
    {"query": "Who wrote Les Misérables?", "candidates": [
        {"title": "Victor Hugo", "text": "Victor Hugo (1802–1885) wrote Les Misérables in 1862.", "gold": 1},
        {"title": "Émile Zola", "text": "Zola didn't; he wrote Germinal.", "gold": 0}]},
]


def test_the_pre_split_groups_featurize_exactly_as_train_py_featurizes_the_originals(curve, model, monkeypatch):
    original = task.featurize_late_ranker(model, GROUPS, 40)
    packed = curve.presplit(GROUPS)
    assert all(c["title"] == "" for r in packed for c in r["candidates"])
    assert packed[0]["candidates"][0]["text"] != GROUPS[0]["candidates"][0]["text"]  # really re-split
    assert GROUPS[0]["candidates"][0]["title"] == "Paris"  # the input is left as it was
    monkeypatch.setattr(task, "words_batch", curve.split_words)  # what `train` does on the device (no spaCy there)
    assert task.featurize_late_ranker(model, packed, 40) == original


def test_extract_sends_every_trained_tensor_in_shards_under_the_limit_and_they_rebuild_the_model(curve, model,
                                                                                                   tmp_path):
    model.save_pretrained(tmp_path / "ckpt")
    saved = load_file(str(tmp_path / "ckpt" / "model.safetensors"))
    limit = 40_000
    curve.extract(tmp_path / "ckpt", tmp_path, "x", limit=limit)
    shards = sorted(tmp_path.glob("x.enc*.safetensors"))
    assert len(shards) > 1
    back = {}
    for shard in shards:
        part = load_file(str(shard))
        assert sum(t.numel() * t.element_size() for t in part.values()) <= limit or len(part) == 1
        assert not set(part) & set(back)
        back.update(part)
    assert set(back) == set(saved) - {"embeddings.word_embeddings.weight"}  # frozen: the package has them
    assert all(torch.equal(back[k], saved[k]) for k in back)
    heads = load_file(str(tmp_path / "x.heads.safetensors"))
    fresh = LateRankerModel.from_encoder(str(tmp_path / "ckpt"), dict(model.options))
    fresh.encoder.load_state_dict({**back, "embeddings.word_embeddings.weight":
                                   saved["embeddings.word_embeddings.weight"]})
    fresh.load_state_dict(heads, strict=False)
    want, got = model.state_dict(), fresh.state_dict()
    assert set(want) == set(got) and all(torch.equal(want[k], got[k]) for k in want)
