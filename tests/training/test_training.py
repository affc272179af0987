"""The one training loop: configs, data validation, train/eval/save, resume, 2 real processes, DeepSpeed.

Tiny encoders and records come from tests/helpers.py (built in code, no download). Multi-process runs use
the real launcher: ``ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2``.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from helpers import REPO, copy_records, launch_training, reset_accelerate, tiny_overrides, weights

from effrag.models import FilterModel, LabelerModel, load_model
from effrag.training import ConfigError, evaluate_only, load_config, train
from effrag.training.data import RecordError, check_labeler_record, read_jsonl

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")  # tests/conftest.py


# -- config and data ------------------------------------------------------------------------------
def test_config_base_overrides_coercion_and_errors(tmp_path):
    (tmp_path / "base.yaml").write_text("task: labeler\ntrain:\n  lr: 5e-6\n  epochs: 2\nmodel:\n  max_length: 384\n")
    (tmp_path / "child.yaml").write_text("base: base.yaml\ntrain:\n  batch_size: 8\n")
    cfg = load_config(tmp_path / "child.yaml", ["--train.epochs", "3", "--data.eval_files=a.jsonl,b.jsonl",
                                                  "--data.max_train_examples", "null"])
    assert cfg.train.lr == 5e-6 and isinstance(cfg.train.lr, float)  # YAML 1.1 reads 5e-6 as a string
    assert (cfg.train.epochs, cfg.train.batch_size, cfg.model.max_length) == (3.0, 8, 384)
    assert cfg.data.eval_files == ["a.jsonl", "b.jsonl"] and cfg.data.max_train_examples is None
    with pytest.raises(ConfigError, match=r"train.*unknown key\(s\) \['lrr'\]"):
        load_config(tmp_path / "child.yaml", ["--train.lrr", "1"])
    with pytest.raises(ConfigError, match="cannot read 'fast' as float"):
        load_config(tmp_path / "child.yaml", ["--train.lr", "fast"])
    assert load_config(None, ["--train.mixed_precision", "no"]).train.mixed_precision == "no"
    assert load_config(None, {"train": {"mixed_precision": False}}).train.mixed_precision == "no"  # YAML `no`
    with pytest.raises(ConfigError, match="has no value"):
        load_config(None, ["--train.lr"])


def test_shipped_configs_load_with_paper_settings():
    paper = {n: load_config(REPO / "configs" / f"{n}_paper.yaml") for n in ("labeler", "filter")}
    assert paper["labeler"].train.lr == 5e-6 and paper["filter"].train.lr == 1e-5
    assert (paper["labeler"].model.max_length, paper["filter"].model.max_length) == (384, 256)
    for cfg in paper.values():
        assert cfg.model.name_or_path == "microsoft/deberta-v3-large" and cfg.train.epochs == 2
        assert cfg.train.batch_size * 4 == 32  # per GPU x 4 GPUs as in the paper
    cpu = {n: load_config(REPO / "configs" / f"{n}.yaml") for n in ("labeler", "filter")}
    assert cpu["filter"].task == "filter" and cpu["filter"].data.train_file.endswith("train_all/filter.jsonl")
    assert cpu["labeler"].model.name_or_path == "minilm"


def test_default_configs_ship_in_the_package_and_load_by_name():
    import fnmatch

    import tomllib

    from effrag import configs

    packaged = Path(configs.__file__).parent
    assert (REPO / "configs").resolve() == packaged  # the user-facing configs/ is the packaged folder
    names = ["labeler", "filter", "irrr", "reader", "labeler_paper", "filter_paper"]
    assert set(names) | {"serve"} <= set(configs.names())
    for name in names:
        assert load_config(name).to_dict() == load_config(REPO / "configs" / f"{name}.yaml").to_dict()
    assert load_config("reader").task == "reader" and configs.path("deepspeed/zero2.json").is_file()
    with pytest.raises(ConfigError, match=r"config file not found: labeller \(nor a packaged config name: .*labeler"):
        load_config("labeller")
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["effrag"]
    files = [f.relative_to(packaged.parent).as_posix() for f in packaged.rglob("*")
             if f.is_file() and f.suffix not in (".py", ".pyc")]
    assert files and all(any(fnmatch.fnmatch(f, g) for g in globs) for f in files)  # a wheel carries them all


def test_bad_records_name_file_line_and_field(tmp_path):
    good = copy_records(1)[0]
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps(good) + "\n" + json.dumps({**good, "labels": good["labels"][:-1]}) + "\n")
    with pytest.raises(RecordError, match=r"bad.jsonl:2: field 'labels' has 11 entries for 12 chunk_words"):
        read_jsonl(f, check_labeler_record)
    f.write_text(json.dumps({**good, "tag": 2}) + "\n")
    with pytest.raises(RecordError, match=r"bad.jsonl:1: field 'tag'"):
        read_jsonl(f, check_labeler_record)
    f.write_text("{not json\n")
    with pytest.raises(RecordError, match=r"bad.jsonl:1: invalid JSON"):
        read_jsonl(f, check_labeler_record)


def test_length_grouped_sampler_is_a_seeded_permutation_of_similar_length_batches():
    from effrag.training.data import LengthGroupedSampler

    lengths = [(i * 37) % 100 for i in range(103)]
    s = LengthGroupedSampler(lengths, batch_size=8, seed=3, mega=4)
    s.set_epoch(1)
    order = list(s)
    assert sorted(order) == list(range(103)) and order == list(s)  # permutation, replayable per epoch
    s.set_epoch(2)
    assert list(s) != order
    spread = [max(lengths[j] for j in b) - min(lengths[j] for j in b) for b in (order[i:i + 8] for i in range(0, 96, 8))]
    assert sum(spread) / len(spread) < 25  # random batches of 8 over 0..99 would spread ~75


# -- in-process training ----------------------------------------------------------------------------
def test_train_labeler_evaluates_saves_best_and_last(tiny, tmp_path):
    out = tmp_path / "run"
    cfg = load_config(None, tiny_overrides(tiny, "labeler", out, train__max_steps=40, train__eval_every=20,
                                           train__lr=3e-3))
    res = train(cfg)
    assert res["global_step"] == 40 and res["ranks_in_sync"] is True and res["lr"] == 0.0
    ev = res["eval"]
    assert ev["n"] == 7 and ev["hotpotqa/n"] + ev["musique/n"] == 7  # per-dataset breakdown
    assert ev["tag_accuracy"] >= 5 / 7 and ev["token_f1"] > 0.7, ev  # all-<Continue> would score 4/7
    log = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    losses = [x["train/loss"] for x in log if "train/loss" in x]
    assert sum(losses[-4:]) < sum(losses[:4])
    assert [x["step"] for x in log if "eval/token_f1" in x] == [20, 40]
    for sub in ("best", "last"):
        meta = json.loads((out / sub / "effrag_config.json").read_text())
        assert meta["training"]["config"]["train"]["max_steps"] == 40
        assert "data_sha256" in meta["training"]["run_info"]
        # the checkpoint's card may ship: its paths are portable (<tmp>/... here), not this machine's
        assert meta["training"]["config"]["train"]["output_dir"].startswith("<tmp>/")
        assert not any(str(a).startswith("/") for a in meta["training"]["run_info"]["command"])
    assert json.loads((out / "best" / "metrics.json").read_text())["step"] == res["best_step"]
    model = load_model(out / "last")
    assert isinstance(model, LabelerModel)
    r = copy_records(7, seed=1)
    preds = model.predict([x["query"] for x in r], [x["chunk_words"] for x in r])
    assert sum((p > 0.5) == bool(x["tag"]) for (p, _), x in zip(preds, r)) == round(ev["tag_accuracy"] * 7)
    reset_accelerate()
    again = evaluate_only(cfg, str(out / "last"))
    assert again["token_f1"] == pytest.approx(ev["token_f1"]) and again["n"] == 7
    assert json.loads((out / "eval_metrics.json").read_text())["model"] == str(out / "last")


def test_continue_from_saved_model_keeps_encoder_and_heads_with_new_options(tiny, tmp_path):
    from effrag.training.loop import build_model
    from effrag.training.tasks import get_task

    first = LabelerModel.from_encoder(tiny["base"], {"max_length": 32})
    torch.nn.init.normal_(first.chunk_head.proj.weight)  # heads a fresh model would not have
    first.save_pretrained(tmp_path / "saved")
    cfg = load_config(None, tiny_overrides(tiny, "labeler", tmp_path / "run", model__name_or_path=str(tmp_path / "saved"),
                                           model__token_class_weights=[1.0, 4.0]))
    model = build_model(get_task("labeler"), cfg)
    saved = first.state_dict()
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
    assert model.token_class_weights.tolist() == [1.0, 4.0]  # this run's options, not the saved ones


def test_resume_from_mid_epoch_checkpoint_continues_same_schedule(tiny, tmp_path):
    # 40 examples / batch 4 = 10 batches per epoch; checkpoint at step 14 is mid epoch 2
    a, b = tmp_path / "a", tmp_path / "b"
    kw = dict(train__max_steps=20, train__save_every=7, train__save_total_limit=3, train__eval_every=0,
              train__scheduler="cosine", train__group_by_length=True)
    res_a = train(load_config(None, tiny_overrides(tiny, "filter", a, **kw)))
    state = json.loads((a / "checkpoints" / "step_0000014" / "trainer_state.json").read_text())
    assert (state["global_step"], state["epoch"], state["batch_in_epoch"]) == (14, 1, 4)
    (b / "checkpoints").mkdir(parents=True)
    shutil.copytree(a / "checkpoints" / "step_0000014", b / "checkpoints" / "step_0000014")
    reset_accelerate()
    res_b = train(load_config(None, tiny_overrides(tiny, "filter", b, train__resume_from_checkpoint="latest", **kw)))
    assert res_b["global_step"] == 20 and res_b["lr"] == pytest.approx(res_a["lr"], abs=1e-12)
    assert res_b["examples_seen_per_process"] == 6 * 4  # only the 6 remaining batches
    log_b = [json.loads(x) for x in (b / "log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in log_b if "train/lr" in x] == list(range(15, 21))
    lr_a = {x["step"]: x["train/lr"] for x in map(json.loads, (a / "log.jsonl").read_text().splitlines()) if "train/lr" in x}
    assert all(x["train/lr"] == pytest.approx(lr_a[x["step"]]) for x in log_b if "train/lr" in x)
    wa, wb = weights(a / "last"), weights(b / "last")
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=1e-5), k
    assert res_b["eval"]["token_f1"] == pytest.approx(res_a["eval"]["token_f1"], abs=1e-6)


def test_cli_reports_config_errors(tmp_path, capsys):
    from effrag.training import cli as train_cli

    assert train_cli.main(["--config", str(tmp_path / "missing.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err
    assert train_cli.main(["--train.report_to", "tensorboard", "--data.train_file", "x.jsonl"]) == 2
    assert "report_to must be 'none' or 'wandb'" in capsys.readouterr().err


def test_wandb_requested_without_package_is_a_clear_error(tiny, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    cfg = load_config(None, tiny_overrides(tiny, "filter", tmp_path, train__report_to="wandb"))
    with pytest.raises(ConfigError, match=r"pip install 'effrag\[wandb\]'"):
        train(cfg)


def test_wandb_offline_tracking(tiny, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "wb"
    train(load_config(None, tiny_overrides(tiny, "filter", out, train__report_to="wandb", train__max_steps=2,
                                           train__run_name="tiny")))
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


# -- real multi-process runs -----------------------------------------------------------------------
@pytest.mark.slow
def test_two_cpu_processes_stay_in_sync(tiny, tmp_path):
    res = launch_training(tiny, tmp_path / "ddp", ["--multi_gpu"], use_cpu=True)
    info = json.loads((tmp_path / "ddp" / "run_info.json").read_text())
    assert info["num_processes"] == 2 and info["distributed_type"] == "DistributedType.MULTI_CPU"
    assert res["num_processes"] == 2 and res["ranks_in_sync"] is True
    assert len(res["param_checksums"]) == 2 and res["param_checksums"][0] == res["param_checksums"][1]
    assert res["eval"]["n"] == 7  # gather_for_metrics dropped the padding duplicates
    # 40 examples over 2 ranks x batch 4 = 5 batches per rank per epoch; 6 steps x accum 2 = 2 epochs
    assert res["examples_seen_per_process"] == 40 and res["global_step"] == 6
    assert isinstance(load_model(tmp_path / "ddp" / "best"), FilterModel)


@pytest.mark.slow
def test_deepspeed_zero2_on_cpu(tiny, tmp_path):
    """First run on a machine JIT-compiles DeepSpeed's shared-memory comm op (minutes); later runs ~1 min."""
    pytest.importorskip("deepspeed")
    res = launch_training(tiny, tmp_path / "ds", ["--use_deepspeed", "--deepspeed_config_file",
                                           str(REPO / "configs" / "deepspeed" / "zero2.json")], use_cpu=False)
    info = json.loads((tmp_path / "ds" / "run_info.json").read_text())
    assert info["distributed_type"] == "DistributedType.DEEPSPEED"
    assert res["ranks_in_sync"] is True and res["global_step"] == 6 and res["eval"]["n"] == 7
    assert isinstance(load_model(tmp_path / "ds" / "last"), FilterModel)


def test_recipe_passes_labeler_only_overrides(tmp_path):
    """scripts/train_models.py --dry-run: LABELER_ARGS (e.g. a SmolLM2 backbone) reach the Labeler's train.py, not
    the Filter's; IRRR trains on its data step's files, the distilled ranker on the teacher's groups from the
    installed teacher. The commands are those the recipe would run; nothing runs, nothing is installed."""
    import shlex

    from helpers import run_script

    from effrag.training.cards import MODELS

    shared = ["--data.max_train_examples", "100000"]
    # --force: a fresh run each (no --resume_from_checkpoint from runs/train/all); a dry run deletes nothing
    done = run_script("train_models", "--dry-run", "--force", "--models",
                      "labeler,filter,irrr,ranker_distilled,ranker_distilled_loop,ranker_distilled3",
                      "--name", "all", "--synth", tmp_path, "--teacher-data", "runs/ranker/train_all_teacher",
                      "--labeler-overrides=--model.name_or_path smollm2 --train.lr 5e-5",
                      "--launch-args=--num_processes 1", "--datasets", "hotpotqa,2wikimqa,musique", "--", *shared)
    assert done.returncode == 0, done.stderr
    assert "+ " not in done.stdout and list(tmp_path.iterdir()) == []  # printed, never run
    blocks: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        if line.startswith("# "):
            blocks[line.split()[1]] = []
        else:
            blocks[list(blocks)[-1]].append(line)
    assert list(blocks) == ["labeler", "filter", "irrr", "ranker_distilled", "ranker_distilled_loop", "ranker_distilled3"]
    train = {role: shlex.split(next(c for c in lines if " train.py " in c)) for role, lines in blocks.items()}
    for role, cmd in train.items():
        assert cmd[:7] == ["nice", "accelerate", "launch", "--num_processes", "1", "--num_machines", "1"]
        assert cmd[cmd.index("--config") + 1] == f"configs/{role}.yaml"
        assert cmd[cmd.index("--output_dir") + 1] == f"runs/train/all/{role}" and "--resume_from_checkpoint" not in cmd
    lab, fil = train["labeler"], train["filter"]
    assert lab[lab.index("--output_dir") + 2:] == ["--data.train_file", str(tmp_path / "labeler.jsonl"), *shared,
                                                   "--model.name_or_path", "smollm2", "--train.lr", "5e-5"]
    assert fil[fil.index("--output_dir") + 2:] == ["--data.train_file", str(tmp_path / "filter.jsonl"), *shared]
    # IRRR (and the reader) train on their data step's files, printed before the training command
    irrr = train["irrr"]
    assert irrr[irrr.index("--output_dir") + 2:] == [
        "--data.train_file", "runs/irrr/train_all/irrr.jsonl", "--data.eval_files",
        "runs/irrr/dev_hotpotqa/irrr.jsonl,runs/irrr/dev_2wikimqa/irrr.jsonl,runs/irrr/dev_musique/irrr.jsonl", *shared]
    steps = [shlex.split(c) for c in blocks["irrr"] if c.startswith("effrag irrr-data ")]
    assert [c[c.index("--output") + 1] for c in steps] == [
        "runs/irrr/train_all", "runs/irrr/dev_hotpotqa", "runs/irrr/dev_2wikimqa", "runs/irrr/dev_musique"]
    # the distilled ranker: the teacher's scored groups, starting from the installed teacher; the system's ranker/
    dist = train["ranker_distilled"]
    assert dist[dist.index("--output_dir") + 2:] == [
        "--data.train_file", "runs/ranker/train_all_teacher/ranker.jsonl",
        "--model.name_or_path", "checkpoints/efficientrag-all/ranker-teacher", *shared]
    assert MODELS["ranker_distilled"].checkpoint == "efficientrag-{name}/ranker"
    # trained further on the loop's own groups: from the installed student, installed over it
    loop = train["ranker_distilled_loop"]
    assert loop[loop.index("--output_dir") + 2:] == [
        "--data.train_file", "runs/ranker/train_all_teacher/ranker.jsonl",
        "--model.name_or_path", "checkpoints/efficientrag-all/ranker", *shared]
    assert MODELS["ranker_distilled_loop"].checkpoint == MODELS["ranker_distilled"].checkpoint
    cfg = load_config(Path(__file__).parents[2] / "configs" / "ranker_distilled.yaml")
    assert cfg.task == "ranker" and cfg.model.num_layers == 2 and cfg.model.extra_options["distill_weight"] > 0
    # the 3-layer ranker: from the installed teacher on the scored groups, into its own folder beside ranker/
    three = train["ranker_distilled3"]
    assert three[three.index("--output_dir") + 2:] == [
        "--data.train_file", "runs/ranker/train_all_teacher/ranker.jsonl",
        "--model.name_or_path", "checkpoints/efficientrag-all/ranker-teacher", *shared]
    assert MODELS["ranker_distilled3"].checkpoint == "efficientrag-{name}/ranker-3layer"
    cfg = load_config(Path(__file__).parents[2] / "configs" / "ranker_distilled3.yaml")
    assert cfg.task == "ranker" and cfg.model.num_layers == 3 and cfg.model.max_length == 128


def test_a_reused_run_keeps_only_its_own_installed_card():
    """Two roles install into ranker/: re-running the recipe re-installs the student over its successor, and the card
    found there (the successor's) must not be kept for it."""
    from effrag.training.cards import card_describes_run

    card = "## Command\n```\naccelerate launch train.py --config configs/ranker_distilled_loop.yaml --output_dir " \
           "runs/train/all/ranker_distilled_loop --data.train_file x.jsonl\n```\n"
    assert card_describes_run(card, "runs/train/all/ranker_distilled_loop")
    assert not card_describes_run(card, "runs/train/all/ranker_distilled")  # a prefix of the other run's folder
    assert card_describes_run(card.replace(" --data.train_file x.jsonl", ""), "runs/train/all/ranker_distilled_loop")
    assert not card_describes_run("no command here", "runs/train/all/ranker_distilled")


@pytest.mark.parametrize("override, message", [
    (["--task", "filtr"], "task: unknown 'filtr'"),
    (["--train.batch_size", "-4"], "train.batch_size must be > 0, got -4"),
    (["--train.lr", "-1e-4"], "train.lr must be > 0"),
    (["--train.warmup_ratio", "1.5"], "train.warmup_ratio must be in"),
    (["--train.mixed_precision", "fp8"], "train.mixed_precision must be no, bf16 or fp16"),
    (["--model.max_length", "0"], "model.max_length must be > 0"),
    (["--model.num_layers", "0"], "model.num_layers must be > 0 or null"),
])
def test_config_values_that_cannot_train_are_one_line_errors(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_config(Path(__file__).parents[2] / "configs" / "labeler.yaml", override)


def test_a_missing_encoder_is_a_config_error_before_any_loading(tmp_path):
    from effrag.training.config import check_encoder

    check_encoder("minilm")
    check_encoder(str(tmp_path))  # a local folder
    with pytest.raises(ConfigError, match="model.name_or_path: '/no/such/encoder' is neither an encoder alias"):
        check_encoder("/no/such/encoder", "model")
    with pytest.raises(ConfigError, match="nor a locally cached hub model"):
        check_encoder("nobody/not-a-cached-model", "model")
    cfg = load_config(Path(__file__).parents[2] / "configs" / "labeler_paper.yaml")  # loads; its encoder is checked at build
    assert cfg.model.name_or_path == "microsoft/deberta-v3-large"
