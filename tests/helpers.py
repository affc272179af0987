"""Builders shared by several test files (a test file never imports another test file)."""
from __future__ import annotations

from pathlib import Path


def make_tiny_efficientrag(root: Path) -> dict[str, Path]:
    """A tiny Labeler, Filter and pool ranker (2-layer BERT, MiniLM tokenizer) saved in the effrag checkpoint format
    under ``root``; returns ``{"labeler": dir, "filter": dir, "ranker": dir}``.

    Randomly initialised (seed 0) with widened heads, so that p(<Continue>) and word keep probabilities spread
    over (0, 1) and every threshold in a grid changes what the loop does. The same seed gives the same weights,
    which the golden predictions (tests/test_golden_predictions.py) rely on.
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
