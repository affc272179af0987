"""bf16 only where it is fast: GPUs and CPUs with native bf16; fp32 elsewhere unless forced."""
from __future__ import annotations

import logging

import pytest
import torch

from effrag import hardware


@pytest.fixture
def cpu_without_bf16(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: False)
    monkeypatch.delenv("EFFRAG_BF16", raising=False)
    hardware._warn_once.cache_clear()


def test_bf16_falls_back_to_fp32_on_a_cpu_without_native_bf16(cpu_without_bf16, caplog):
    with caplog.at_level(logging.WARNING, logger="effrag.hardware"):
        assert hardware.resolve_bf16(True, "cpu") is False
        assert hardware.resolve_bf16(True, "cpu") is False
    assert sum("no native bf16" in r.message for r in caplog.records) == 1  # said once
    assert hardware.resolve_bf16(True, "cuda") is True
    assert hardware.resolve_bf16(False, "cuda") is False


def test_bf16_env_override(cpu_without_bf16, monkeypatch):
    monkeypatch.setenv("EFFRAG_BF16", "force")
    assert hardware.resolve_bf16(True, "cpu") is True
    assert hardware.resolve_bf16(False, "cpu") is False  # force keeps requests, never adds bf16
    monkeypatch.setenv("EFFRAG_BF16", "off")
    assert hardware.resolve_bf16(True, "cuda") is False


def test_bf16_kept_on_a_cpu_with_native_bf16(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: True)
    monkeypatch.delenv("EFFRAG_BF16", raising=False)
    assert hardware.resolve_bf16(True, "cpu") is True


def test_predict_with_bf16_request_equals_fp32_when_bf16_is_slow(cpu_without_bf16):
    """A real (tiny) Labeler: a bf16 request on such a CPU gives exactly the fp32 outputs."""
    from transformers import AutoModel, BertConfig

    from effrag.models import LabelerModel
    from effrag.models.heads import load_tokenizer, resolve_encoder

    torch.manual_seed(0)
    tok = load_tokenizer(resolve_encoder("minilm"))
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64)
    model = LabelerModel(AutoModel.from_config(cfg), tok, {"max_length": 64}).eval()
    args = (["who wrote it?", "when?"], [["The", "book", "was", "written"], ["In", "1990", "."]])
    assert model.predict(*args, bf16=True) == model.predict(*args, bf16=False)
