"""Builders shared by several test files (a test file never imports another test file): tiny encoders and models
saved in the effrag checkpoint format, learnable records, training configs and a kill in mid-step, the checkout's
command entry points. Fixtures built from them live in tests/conftest.py; the HTTP service under test is in
tests/serve_helpers.py.
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHUNK_SCALE = 4.0  # save_tiny_models: the Labeler's chunk head, widened so that p(<Continue>) spreads a little


def make_tiny_efficientrag(root: Path) -> dict[str, Path]:
    """A tiny Labeler, Filter and pool ranker (2-layer BERT, MiniLM tokenizer) saved in the effrag checkpoint format
    under ``root``; returns ``{"labeler": dir, "filter": dir, "ranker": dir}``.

    Randomly initialised (seed 0) with widened heads, so that p(<Continue>) and word keep probabilities spread
    over (0, 1) and every threshold in a grid changes what the loop does. The same seed gives the same weights,
    which the golden predictions (tests/evaluation/test_golden_predictions.py) rely on.
    """
    import torch
    from transformers import AutoModel, BertConfig

    from effrag.models import FilterModel, LabelerModel, RankerModel
    from effrag.models.heads import load_tokenizer, resolve_encoder

    torch.manual_seed(0)
    tok = load_tokenizer(resolve_encoder("minilm"))
    dirs = {}
    for name, cls in (("labeler", LabelerModel), ("filter", FilterModel), ("ranker", RankerModel)):
        cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=512)
        model = cls(AutoModel.from_config(cfg), tok, {"max_length": 256})
        with torch.no_grad():
            for head in ("token_head", "chunk_head", "score_head"):
                if hasattr(model, head):
                    getattr(model, head).proj.weight.mul_(40.0)
        model.save_pretrained(Path(root) / name)
        dirs[name] = Path(root) / name
    return dirs


# -- recorded results across CPUs -------------------------------------------------------------------------------
# Floats recorded on one CPU differ in their last digits on another (bf16 and int8 kernels, the order of a sum);
# a recorded float matches within FLOAT_REL relative, or FLOAT_ABS absolute: one unit in the last place of a value
# rounded to 4 decimals (p(<Continue>) in a trace), which a 1e-6 difference can move. Everything else is exact.
FLOAT_REL, FLOAT_ABS = 1e-4, 1.5e-4


def first_difference(got, want, where: str = "") -> str | None:
    """Where ``got`` first differs from the recorded ``want`` (``"scores[3]: 0.2449 vs 0.2451"``), or None.

    Ids, order, lengths, strings, ints and bools compare exactly; floats within FLOAT_REL / FLOAT_ABS."""
    at = where or "the row"
    if isinstance(want, float) or isinstance(got, float):
        if not isinstance(got, (int, float)) or not isinstance(want, (int, float)) \
                or isinstance(got, bool) or isinstance(want, bool):
            return f"{at}: {got!r} vs recorded {want!r}"
        if abs(got - want) <= max(FLOAT_REL * max(abs(got), abs(want)), FLOAT_ABS):
            return None
        return f"{at}: {got!r} vs recorded {want!r} (beyond {FLOAT_REL:g} relative, {FLOAT_ABS:g} absolute)"
    if isinstance(want, dict) and isinstance(got, dict):
        if sorted(got) != sorted(want):
            return f"{at}: fields {sorted(got)} vs recorded {sorted(want)}"
        for k in want:
            d = first_difference(got[k], want[k], f"{where}.{k}" if where else k)
            if d:
                return d
        return None
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return f"{at}: {len(got)} items vs recorded {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            d = first_difference(g, w, f"{where}[{i}]")
            if d:
                return d
        return None
    return None if got == want and type(got) is type(want) else f"{at}: {got!r} vs recorded {want!r}"


# -- dataset files ---------------------------------------------------------------------------------------------
def raw_records(dataset: str, split: str = "dev") -> list[dict]:
    """The bundled sample file's records as JSON, unparsed by effrag."""
    from effrag.data import sample_path

    return [json.loads(line) for line in sample_path(dataset, split).read_text("utf-8").splitlines()]


def write_jsonl(path: Path, records: list) -> Path:
    """``records`` as a UTF-8 JSONL file at ``path`` (folders made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), "utf-8")
    return path


# -- tiny encoders and records -----------------------------------------------------------------------------
def sample_texts(n_questions: int = 40) -> list[str]:
    """Questions and context sentences of the bundled HotpotQA train sample: what the tiny tokenizers learn from."""
    from effrag.data import sample_path

    out = []
    with open(sample_path("hotpotqa", "train")) as f:
        for line in list(f)[:n_questions]:
            r = json.loads(line)
            out.append(r["question"])
            out += [s for _, sents in r["context"][:4] for s in sents]
    return out


def make_wordpiece_tokenizer(vocab_size: int = 300):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(sample_texts(), trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")


def make_spm_tokenizer(folder: Path, vocab_size: int = 300):
    """A DeBERTa-v3 style sentencepiece tokenizer (DebertaV2Tokenizer must come from from_pretrained(dir))."""
    import sentencepiece as spm
    from transformers import DebertaV2Tokenizer

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sample_texts(20)), model_writer=buf, vocab_size=vocab_size, model_type="unigram",
        pad_id=0, bos_id=1, eos_id=2, unk_id=3, pad_piece="[PAD]", bos_piece="[CLS]", eos_piece="[SEP]",
        unk_piece="[UNK]", user_defined_symbols=["[MASK]"], minloglevel=2)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spm.model").write_bytes(buf.getvalue())
    return DebertaV2Tokenizer.from_pretrained(str(folder))


def make_base(kind: str, folder: Path, dropout: float = 0.0) -> str:
    """Save a tiny randomly initialised encoder + tokenizer into ``folder`` (an encoder dir like MiniLM's): a
    DeBERTa-v2 (sentencepiece, as DeBERTa-v3), an ELECTRA (WordPiece) or a Llama (a decoder LM as backbone)."""
    import torch
    from transformers import AutoModel, DebertaV2Config, ElectraConfig, LlamaConfig

    torch.manual_seed(0)
    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                  max_position_embeddings=256, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    if kind == "deberta":
        tok = make_spm_tokenizer(folder / "_spm")
        cfg = DebertaV2Config(vocab_size=len(tok), relative_attention=True, position_buckets=64, type_vocab_size=0,
                              pos_att_type=["p2c", "c2p"], position_biased_input=False, pad_token_id=tok.pad_token_id,
                              **common)
    elif kind == "electra":
        tok = make_wordpiece_tokenizer()
        cfg = ElectraConfig(vocab_size=len(tok), embedding_size=32, pad_token_id=tok.pad_token_id, **common)
    elif kind == "llama":  # a decoder LM as the tagger backbone (SmolLM2's family)
        tok = make_wordpiece_tokenizer()
        cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                          num_key_value_heads=1, intermediate_size=64, max_position_embeddings=256,
                          attention_dropout=dropout, pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    else:
        raise ValueError(kind)
    AutoModel.from_config(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def copy_records(n: int, seed: int = 0, length: int = 12) -> list[dict]:
    """Learnable Labeler records: a fixed set of "useful" words is labelled 1, and a chunk
    containing them is tagged <Continue>; other chunks have none, all-zero labels and <Terminate>.
    (Lexical, so a tiny random encoder generalises from a few dozen examples.)"""
    import random

    from effrag.text import words

    rng = random.Random(seed)
    vocab = sorted({w for t in sample_texts(10) for w in words(t) if w.isalpha() and len(w) > 3})
    useful, other = vocab[:20], vocab[20:320]
    out = []
    for i in range(n):
        related = i % 2 == 0
        chunk = rng.sample(other, length)
        if related:
            for pos in rng.sample(range(length), length // 2):
                chunk[pos] = rng.choice(useful)
        labels = [int(w in useful) for w in chunk]
        out.append({"qid": f"q{i}", "dataset": ["hotpotqa", "musique"][i % 3 == 0], "hop": 0,
                    "query": " ".join(rng.sample(other, 4)) + "?", "chunk_id": f"c{i}", "chunk_words": chunk,
                    "labels": labels, "tag": int(related), "source": "annotation"})
    return out


def filter_records(n: int, seed: int = 0) -> list[dict]:
    """Filter records: keep the words after 'Info:'."""
    out = []
    for r in copy_records(n, seed):
        ws = r["query"].split() + ["Info", ":"] + r["chunk_words"][:5]
        out.append({"qid": r["qid"], "dataset": r["dataset"], "hop": 1, "words": ws,
                    "labels": [0] * 6 + [1] * 5, "target": " ".join(ws[6:]), "source": "annotation"})
    return out


def save_tiny_models(root: Path) -> dict[str, Path]:
    """A tiny Labeler and Filter (2-layer BERT, MiniLM tokenizer) in the effrag checkpoint format; p(<Continue>) stays
    near 0.5 (the integration tests' setting; :func:`make_tiny_efficientrag` spreads it over (0, 1))."""
    import torch
    from transformers import AutoModel, BertConfig

    from effrag.models import FilterModel, LabelerModel
    from effrag.models.heads import load_tokenizer, resolve_encoder

    torch.manual_seed(0)
    tok = load_tokenizer(resolve_encoder("minilm"))
    dirs = {}
    for name, cls in (("labeler", LabelerModel), ("filter", FilterModel)):
        cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=512)
        model = cls(AutoModel.from_config(cfg), tok, {"max_length": 256})
        with torch.no_grad():  # word keep probabilities spread widely; p(<Continue>) stays near 0.5
            model.token_head.proj.weight.mul_(40.0)
            if name == "labeler":
                model.chunk_head.proj.weight.mul_(CHUNK_SCALE)
        model.save_pretrained(root / name)
        dirs[name] = root / name
    return dirs


# -- EfficientRAG over a slice of the sample --------------------------------------------------------------------
def hotpot_dev(n: int) -> list:
    """The first ``n`` bundled HotpotQA dev questions."""
    from effrag.data import load_questions, sample_path

    return load_questions(sample_path("hotpotqa", "dev"))[:n]


def bm25_over(questions: list):
    """BM25 over the questions' own contexts (in memory)."""
    from effrag.data import Corpus
    from effrag.retrieval import build_retriever

    return build_retriever("bm25", Corpus.from_questions(questions), show_progress=False)


def loaded_models(dirs: dict) -> tuple:
    """A saved Labeler and Filter loaded once (round trip through from_pretrained), with their original head weights:
    ``(labeler, filter, heads, original)`` for :func:`fixed_heads`."""
    from effrag.models import FilterModel, LabelerModel

    lab = LabelerModel.from_pretrained(dirs["labeler"]).eval()
    fil = FilterModel.from_pretrained(dirs["filter"]).eval()
    heads = {"tag": lab.chunk_head.proj, "token": lab.token_head.proj, "filt": fil.token_head.proj}
    original = {k: (m.weight.detach().clone(), m.bias.detach().clone()) for k, m in heads.items()}
    return lab, fil, heads, original


def fixed_heads(models: tuple, tag=None, token=None, filt=None) -> tuple:
    """The models with each head either original or fixed: ``+20`` always keeps/continues, ``-20`` never."""
    import torch

    lab, fil, heads, original = models
    with torch.no_grad():
        for name, margin in (("tag", tag), ("token", token), ("filt", filt)):
            w, b = original[name]
            heads[name].weight.copy_(w if margin is None else torch.zeros_like(w))
            heads[name].bias.copy_(b if margin is None else torch.tensor([0.0, margin]))
    return lab, fil


# -- IRRR ---------------------------------------------------------------------------------------------------------
def rigged_irrr(electra: str, answer_type: int):
    """An IRRR model on the ``electra`` base whose reader always prefers ``answer_type`` (head weights zeroed, bias
    set)."""
    import torch

    from effrag.models import IRRRModel

    model = IRRRModel.from_encoder(electra, {"max_length": 128}).eval()
    with torch.no_grad():
        model.type_head.weight.zero_()
        model.type_head.bias.fill_(0.0)
        model.type_head.bias[answer_type] = 10.0
    return model


# -- training ------------------------------------------------------------------------------------------------------
def reset_accelerate() -> None:
    """Accelerator state is a process singleton: every in-process run needs a clean one."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def make_tiny_training_data(root: Path) -> dict:
    """A tiny ELECTRA base and learnable Labeler / Filter train and dev files under ``root``."""
    base = make_base("electra", root / "base")
    files = {}
    for name, recs in (("labeler", copy_records(40)), ("filter", filter_records(40))):
        for split, rows in (("train", recs), ("dev", copy_records(7, seed=1) if name == "labeler" else filter_records(7, 1))):
            f = root / f"{name}_{split}.jsonl"
            f.write_text("".join(json.dumps(r) + "\n" for r in rows))
            files[f"{name}_{split}"] = str(f)
    return {"root": root, "base": base, **files}


def tiny_overrides(tiny: dict, task: str, out: Path, **extra) -> dict:
    """A training config over :func:`make_tiny_training_data`'s files; ``section__key=value`` overrides."""
    cfg = {
        "task": task,
        "model": {"name_or_path": tiny["base"], "max_length": 32, "head_dropout": 0.0},
        "data": {"train_file": tiny[f"{task}_train"], "eval_files": [tiny[f"{task}_dev"]]},
        "train": {"output_dir": str(out), "batch_size": 4, "eval_batch_size": 3, "lr": 2e-3, "log_every": 1,
                  "mixed_precision": "no", "warmup_ratio": 0.2, "torch_threads": 1},
    }
    for key, value in extra.items():
        section, name = key.split("__")
        cfg[section][name] = value
    return cfg


def weights(d: Path) -> dict:
    """Every tensor of a saved model folder (encoder and heads)."""
    from safetensors.torch import load_file

    from effrag.models import HEADS_NAME, WEIGHTS_NAME

    return {**load_file(str(d / WEIGHTS_NAME)), **load_file(str(d / HEADS_NAME))}


def launch_training(tiny: dict, out: Path, launcher: list[str], use_cpu: bool, **extra) -> dict:
    """``accelerate launch ... train.py`` in 2 processes on a tiny Filter config (6 steps); its results.json."""
    import yaml

    cfg = tiny_overrides(tiny, "filter", out, train__max_steps=6, train__grad_accum=2, train__eval_every=3, **extra)
    cfg_file = out.parent / f"{out.name}.yaml"
    cfg_file.parent.mkdir(parents=True, exist_ok=True)
    cfg_file.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    # `--cpu --num_processes 2` silently runs one process; this is what gives 2 gloo processes on CPU.
    # With DeepSpeed it must be unset (it would silently turn DeepSpeed off).
    env.pop("ACCELERATE_USE_CPU", None)
    if use_cpu:
        env["ACCELERATE_USE_CPU"] = "true"
    proc = subprocess.run([str(Path(sys.executable).parent / "accelerate"), "launch", *launcher, "--num_processes", "2", "--num_machines", "1",
                           "--mixed_precision", "no", "--dynamo_backend", "no", str(REPO / "train.py"),
                           "--config", str(cfg_file)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "results.json").read_text())


def kill_9_when(proc: subprocess.Popen, ready, timeout: float = 120) -> None:
    """SIGKILL ``proc`` as soon as ``ready()`` is true (polled every 5 ms), failing if it ended first."""
    import signal
    import time

    try:
        deadline = time.time() + timeout
        while time.time() < deadline and proc.poll() is None and not ready():
            time.sleep(0.005)
        assert proc.poll() is None, (proc.stderr.read().decode()[-2000:] if proc.stderr else "ended before the kill")
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)


class Killed(BaseException):
    """Stands for a SIGKILL in the middle of a step: nothing of the loop's own cleanup runs."""


def kill_during_step(monkeypatch, step: int, grad_accum: int) -> None:
    """Make the run die in the first backward pass of optimizer step ``step`` (after step - 1 was logged)."""
    from accelerate import Accelerator

    calls = {"n": 0}
    backward = Accelerator.backward

    def dying_backward(self, loss, **kw):
        calls["n"] += 1
        if calls["n"] > (step - 1) * grad_accum:
            raise Killed()
        return backward(self, loss, **kw)

    monkeypatch.setattr(Accelerator, "backward", dying_backward)


def read_log(out: Path) -> list[dict]:
    """A training run's ``log.jsonl`` lines."""
    return [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]


# -- the CLI ---------------------------------------------------------------------------------------------------
def write_command_entry_points(root: Path, name: str = "effrag_commands_from_source") -> Path:
    """A distribution's metadata under ``root`` (``<name>-0.dist-info`` with ``METADATA`` and ``entry_points.txt``)
    declaring the ``effrag.commands`` entry points of this checkout's ``pyproject.toml``; ``root`` on ``sys.path``
    makes ``importlib.metadata`` find them, as it finds an installed package's. Returns the dist-info folder."""
    import tomllib

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    commands = project["entry-points"]["effrag.commands"]
    info = Path(root) / f"{name}-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0\n")
    (info / "entry_points.txt").write_text(
        "[effrag.commands]\n" + "".join(f"{k} = {v}\n" for k, v in commands.items()))
    return info


def run_cli(argv, capsys):
    """(exit code, stdout, stderr) of ``effrag argv`` run in-process."""
    from effrag.cli import main

    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:  # argparse's own exits (--help, usage errors)
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def run_script(name: str, *args, cwd: Path | None = None, env: dict | None = None,
               timeout: int = 300) -> subprocess.CompletedProcess:
    """``python scripts/<name>.py args`` in a subprocess (the checkout on its path, offline, ``env`` added): a
    script's command line under test as a user runs it (``name`` may be below a folder: ``probes/profile_loop``). A report script runs on an uncommitted tree too
    (``EFFRAG_ALLOW_DIRTY=1``: the diff beside its report in the test's folder); tests/test_report_source.py tests
    the refusal."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "EFFRAG_ALLOW_DIRTY": "1", **(env or {})}
    return subprocess.run([sys.executable, str(REPO / "scripts" / f"{name}.py"), *map(str, args)], cwd=cwd or REPO,
                          env=env, capture_output=True, text=True, timeout=timeout)


def make_ranker_groups(root: Path, limit: int) -> list[str]:
    """`effrag synthesize` (annotation, no negatives) of the first ``limit`` HotpotQA train sample questions, then
    `effrag ranker-data` (BM25, groups of 4) into ``root/groups``; returns the ranker-data arguments."""
    from effrag.cli import main
    from effrag.data import sample_path

    train = str(sample_path("hotpotqa", "train"))
    assert main(["synthesize", "--inputs", train, "--output", str(root / "synth"), "--no-negatives",
                 "--limit", str(limit), "--quiet"]) == 0
    args = ["ranker-data", "--synth", str(root / "synth"), "--inputs", train, "--output", str(root / "groups"),
            "--retriever", "bm25", "--depth", "12", "--negatives", "3", "--quiet"]
    assert main(args) == 0
    return args


def tiny_bert_base(folder: Path, seed: int = 0) -> Path:
    """A random 2-layer BERT (hidden 32) with MiniLM's tokenizer saved as an encoder folder: a base to train from."""
    import torch
    from transformers import AutoModel, BertConfig

    from effrag.models.heads import load_tokenizer, resolve_encoder

    tok = load_tokenizer(resolve_encoder("minilm"))
    torch.manual_seed(seed)
    AutoModel.from_config(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
