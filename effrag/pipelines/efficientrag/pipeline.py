"""EfficientRAG behind one door: the registered pipeline (``effrag eval --method efficientrag``) is also the
public API object (``effrag.EfficientRAG``), the source the adapters and ``effrag serve`` wrap.

    rag = EfficientRAG.from_pretrained("efficientrag-all", corpus="corpus.jsonl")   # a system, its retriever
    rag = EfficientRAG.from_pretrained("labeler/", "filter/", retriever=index_or_search_or_function)
    rag.retrieve(question) / rag.retrieve_batch(questions)     # the loop's Result: ranked pool, hops
    rag.answer(question, llm="default")                        # plus one generator call
    rag.config = rag.config.replace(tag_threshold=0.3)         # the loop's options, changed in place

``from_pretrained`` resolves a system folder or shipped name (:mod:`.system`) or a pair of
checkpoints; ``build_pipeline("efficientrag", retriever, ...)`` takes the ``effrag eval`` options. The loop
itself is :mod:`.loop`.
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..base import DEFAULT_RETRIEVER, Pipeline, register_pipeline
from ..generation import Generator, answer_results
from ..result import Result
from .config import EfficientRAGConfig, build_config, cli_flags, request_options
from .loop import EfficientRAGLoop
from .models import load_models

SET_RANKER_MISSING = ("set_ranker_top needs a set-wise pool ranker: a system folder with set-ranker/ "
                      "(scripts/train_set_ranker.sh), or set_ranker=DIR")


@register_pipeline("efficientrag", aliases=("efficient-rag",))
class EfficientRAGPipeline(Pipeline):
    """EfficientRAG retrieval, plus one generator call per question when ``generator`` is given.

    The models come from a system (``model``: a folder or a shipped name, :mod:`.system`; the
    shipped ``efficientrag-all`` when neither ``model`` nor ``labeler``/``filter`` is given) or from
    checkpoint folders (``labeler``, ``filter``, ``ranker``). The result's chunks are the candidate pool
    (what the paper's Recall@K counts); ``hops`` the loop's rounds, ``generation`` the generator's record, ``timing``
    the loop time split into retrieval / labeler / filter / other (and generation). ``config`` or
    ``er_config`` (a JSON file; a system's ``loop.json`` by default) give the loop options; keyword options
    (the ``effrag eval`` flags) override them. ``k`` (``effrag eval --k``) sets ``hop_k`` only when given:
    a config file's ``hop_k`` is not silently replaced by the CLI's default. The pool ranker runs when the
    config orders the pool by it (``pool_order: rank``).
    """

    k_in_config = True
    depth_option = "hop_k"
    chunk_score_name = "p_continue"  # the Labeler's tag probability; the pool orders by Chunk.order_score
    call_options = frozenset(f.name for f in fields(EfficientRAGConfig))  # the loop's settings, per call
    uses_generator = True
    uses_system = True
    uses_dataset = True  # a system's loop-<dataset>.json for questions of that dataset (effrag eval)

    def __init__(self, retriever, labeler=None, filter=None, config=None, generator=None,
                 k: int | None = None, er_config: str | None = None, er_batch_size: int | None = None,
                 er_bf16: bool | None = None, ranker=None, model=None, dataset: str | None = None,
                 prepare: bool = True, vector_store: str | Path | bool | None = None, set_ranker=None,
                 **options: Any):
        named = ranker is not None
        labeler, filter, ranker, config, own_set = self._resolve(model, labeler, filter, ranker, config or er_config,
                                                                 dataset)
        set_ranker = own_set if set_ranker is None else set_ranker  # a system's own set-ranker/, if it has one
        # which loop config file ran (None: options given in code), for a front end to say so
        self.config_source = str(config) if isinstance(config, (str, Path)) else None
        config = self._config(config, k, er_batch_size, er_bf16, **options)
        if not named and config.pool_order != "rank" and config.labeler_top is None:
            ranker = None  # a system's own ranker only reads when the config ranks by it
        from effrag.setup import as_retriever

        models = load_models(labeler, filter, ranker=ranker)
        if config.set_ranker_top and set_ranker is None:
            raise ValueError(SET_RANKER_MISSING)
        if isinstance(set_ranker, (str, Path)):  # loaded whenever the system has one: a request may ask for it
            from effrag.models.set_ranker import load as load_set_ranker

            set_ranker = load_set_ranker(set_ranker)
        self.loop = EfficientRAGLoop(models[0], models[1], as_retriever(retriever), config,
                                     ranker=models[2] if ranker is not None else None, set_ranker=set_ranker)
        # the retriever's corpus split and tokenised once, as an index is built: each question's reads then cost only
        # the models (EfficientRAGLoop.prepare; prepare=False leaves it to the first questions that read a chunk)
        # A late-interaction ranker's chunk vectors are kept on disk (vector_store: a folder; None: the default one,
        # effrag.models.late_vectors; False: none), so a corpus is encoded at its first opening only; an index built
        # with --system holds its own (effrag.pipelines.efficientrag.vectors), read on demand
        if vector_store is None:
            from effrag.models.late_vectors import default_root, index_vector_store

            vector_store = index_vector_store(self.loop.retriever) or default_root()
        self.prepared = (self.loop.prepare(vector_store=vector_store or None) if prepare
                         else {"passages": 0, "seconds": 0.0})
        if self.prepared["passages"]:
            import logging

            logging.getLogger(__name__).info(
                "prepared %d chunks in %.1f s (late-interaction vectors: %d loaded, %d encoded)",
                self.prepared["passages"], self.prepared["seconds"], self.prepared.get("vectors_loaded", 0),
                self.prepared.get("vectors_encoded", 0))
        self.generator = generator
        self._generators: dict[tuple, Generator] = {}

    @classmethod
    def from_pretrained(cls, model: str | Path = "efficientrag-all", filter_dir: str | Path | None = None,
                        retriever: Any = None, *, corpus: Any = None,
                        config: EfficientRAGConfig | dict | str | None = None, dataset: str | None = None,
                        ranker: str | Path | None = None, generator: Any = None,
                        vector_store: str | Path | bool | None = None, **options: Any) -> EfficientRAGPipeline:
        """A trained system: ``model`` is a system folder or a shipped name (``labeler/``, ``filter/``, ``[ranker/]``,
        ``loop.json``; :mod:`.system`), or, with ``filter_dir``, a Labeler checkpoint.

        ``config`` defaults to the system's ``loop-<dataset>.json`` when ``dataset`` names one, else its general
        ``loop.json``. ``retriever`` is a search object, an index folder, a function, or a kind (``"bm25"``,
        ``"dense"``, ``"hybrid"``) to build over ``corpus``; left out, the kind the loop config was tuned for is
        built over ``corpus`` (:class:`effrag.setup.RunSetup`), with the encoder it names (``"encoder"``). ``options`` are :class:`EfficientRAGConfig`
        fields (``tag_threshold=``, ...). ``vector_store``: where a late-interaction ranker's chunk vectors are kept
        (a folder; None: ``$EFFRAG_CACHE_DIR/late-vectors``; False: nowhere, encoded at every opening).
        """
        from effrag.setup import RETRIEVER_KINDS, RunSetup, as_retriever

        names = {"model": model} if filter_dir is None else {"labeler": model, "filter": filter_dir}
        given = {"config": config, "ranker": ranker, **options}
        plan = cls.plan({**names, **{k: v for k, v in given.items() if v is not None}}, dataset=dataset)
        if retriever is None or (isinstance(retriever, str) and retriever in RETRIEVER_KINDS):
            kind = retriever or plan.retriever or DEFAULT_RETRIEVER
            if corpus is None:
                raise ValueError(f"from_pretrained needs a retriever, or a corpus to build the {kind} retriever over")
            retriever = RunSetup.build(corpus=corpus, retriever=kind, encoder=plan.encoder, bf16=True,
                                       cache=False).retriever
        return plan.build(as_retriever(retriever, corpus), generator=generator, vector_store=vector_store,
                          dataset=dataset)

    @classmethod
    def request_rules(cls) -> dict[str, Any]:
        """Every loop and pool option, with its rule; the runtime ones (batch size, bf16, int8) are fixed by a
        service at start-up."""
        return request_options()

    @classmethod
    def system_options(cls, model: str | None = None, config_file: str | None = None) -> dict[str, Any]:
        """The checkpoints and loop config of system ``model`` (default: the shipped one): ``config_file``, else the
        system's ``loop.json``, else its first ``loop-<dataset>.json`` (HotpotQA's first: Wikipedia paragraphs,
        two hops)."""
        from effrag.pretrained import LOOP_DATASETS

        from .system import DEFAULT_SYSTEM, open_system

        system = open_system(model or DEFAULT_SYSTEM, config_file)
        config = system.config
        if config is None:
            config = next((c for d in LOOP_DATASETS if (c := system.root / f"loop-{d}.json").is_file()), None)
        return {"labeler": system.labeler, "filter": system.filter, "ranker": system.ranker, "er_config": config}

    @staticmethod
    def _resolve(model, labeler, filter, ranker, config, dataset: str | None = None):
        """``(labeler, filter, ranker, config, set_ranker)``: from the system ``model`` when no checkpoint is named
        (its ``loop-<dataset>.json`` when it has one for ``dataset``, else its ``loop.json``; its ``set-ranker/``)."""
        from .system import DEFAULT_SYSTEM, open_system

        if labeler is None and filter is None:
            system = open_system(model or DEFAULT_SYSTEM, config if isinstance(config, (str, Path)) else None, dataset)
            return system.labeler, system.filter, ranker or system.ranker, config or system.config, system.set_ranker
        if model is not None:
            raise ValueError("give --model (a system) or --labeler/--filter (checkpoints), not both")
        if labeler is None or filter is None:
            raise ValueError("efficientrag needs both --labeler DIR and --filter DIR (or --model, a system folder)")
        return labeler, filter, ranker, config, None

    @staticmethod
    def _config(config, k, er_batch_size, er_bf16, **options: Any) -> EfficientRAGConfig:
        if k is not None and options.get("hop_k") is None:
            options["hop_k"] = k
        options.setdefault("bf16", er_bf16)
        return build_config(config, batch_size=er_batch_size, **options)

    @classmethod
    def check_options(cls, **options: Any) -> None:
        cls.plan(options, dataset=options.pop("dataset", None))

    @classmethod
    def plan(cls, options: dict[str, Any] | None = None, *, dataset: str | None = None, k: int | None = None,
             default_k: int | None = None):
        """The system resolved once for ``dataset``'s questions (its ``loop-<dataset>.json``, else ``loop.json``), the
        options checked against it, and the retriever and encoder that loop config was tuned over."""
        from effrag.pipelines.plan import Plan, depth

        from .system import config_encoder, config_retriever

        opts = dict(options or {})
        get = opts.get
        _, _, ranker, config, own_set = cls._resolve(get("model"), get("labeler"), get("filter"), get("ranker"),
                                                     get("config") or get("er_config"), dataset)
        loop_options = {key: v for key, v in opts.items() if key not in (
            "labeler", "filter", "config", "k", "er_config", "er_batch_size", "er_bf16", "ranker", "model")}
        cfg = cls._config(config, get("k"), get("er_batch_size"), get("er_bf16"), **loop_options)
        needs = cfg.needs_ranker()
        if needs and ranker is None:
            raise ValueError(f"{needs} needs a pool ranker (--ranker DIR, or a system folder with ranker/)")
        if cfg.set_ranker_top and own_set is None:
            raise ValueError(SET_RANKER_MISSING)
        settings = config if isinstance(config, (str, Path)) else None
        return Plan(cls, opts, dataset, config_retriever(settings), config_encoder(settings), depth(cls, k, default_k),
                    None if settings is None else str(settings))

    @classmethod
    def check_file_options(cls, checkpoints: dict[str, Any], options: dict[str, Any], where: str,
                           prefix: str = "method.") -> None:
        """A config file's system or checkpoints, and its loop options (and the loop config file its ``config``
        names) against the loop's one rule (:data:`.config.RULES`): a wrong type is one line naming
        the file and key at start-up, not a 500 on every request."""
        from .config import check_options
        from .system import DEFAULT_SYSTEM

        if bool(checkpoints.get("labeler")) != bool(checkpoints.get("filter")):  # none: the shipped system
            raise ValueError(f"{where}: method efficientrag needs {prefix}labeler and {prefix}filter (checkpoint "
                             f"folders), or {prefix}model (a system folder or a shipped name; default "
                             f"{DEFAULT_SYSTEM})")
        if checkpoints.get("model") and (checkpoints.get("labeler") or checkpoints.get("filter")):
            raise ValueError(f"{where}: give {prefix}model (a system) or {prefix}labeler/{prefix}filter, not both")
        options = dict(options)
        loop_file = options.pop("config", None)
        check_options(options, where, f"{prefix}options.")
        if loop_file is not None and not isinstance(loop_file, str):
            raise ValueError(f"{where}: {prefix}options.config: expected the path of a loop config file, "
                             f"got {loop_file!r}")
        try:
            build_config(loop_file, **options)  # the file's own options (named in its errors), and rules across options
        except ValueError as e:
            raise ValueError(f"{where}: {prefix}options: {e}" if loop_file is None else str(e)) from None
        from effrag.models.model_files import read_effrag_config

        for key in ("labeler", "filter"):  # a wrong folder fails now, not after the index is built (minutes, dense)
            if checkpoints.get(key):
                try:
                    read_effrag_config(checkpoints[key])
                except (OSError, ValueError) as e:
                    raise ValueError(f"{where}: {prefix}{key}: {' '.join(str(e).split())}") from None

    config = property(lambda self: self.loop.config, lambda self, cfg: setattr(self.loop, "config", cfg),
                      doc="The loop's options (assigning a new config changes the loop's).")

    @classmethod
    def add_args(cls, parser) -> None:
        g = parser.add_argument_group("efficientrag")
        g.add_argument("--model", metavar="DIR|NAME", help="an EfficientRAG system: a folder with labeler/, filter/, "
                       "[ranker/], loop.json (what the recipe writes) or a shipped name (default efficientrag-all "
                       "when no --labeler is given); its loop.json and that config's retriever are the defaults")
        g.add_argument("--labeler", metavar="DIR", help="trained Labeler checkpoint directory")
        g.add_argument("--filter", metavar="DIR", help="trained Filter checkpoint directory")
        g.add_argument("--ranker", metavar="DIR", help="trained pool ranker checkpoint directory (pool_order rank)")
        g.add_argument("--er-config", metavar="JSON", help="loop config file (e.g. a system's loop-<dataset>.json)")
        for f in cli_flags():  # every loop option, read off its field (config.option)
            if f.rule.type is bool:  # --flag / --no-flag: a default-true option can be turned off too
                g.add_argument(f.flag, dest=f.dest, action=argparse.BooleanOptionalAction, default=None, help=f.help)
            else:
                g.add_argument(f.flag, dest=f.dest, type=f.rule.type, default=None, choices=f.rule.choices,
                               help=f.help)

    @property
    def retriever(self) -> Any:
        return self.loop.retriever

    def run(self, question: str) -> Result:
        return self.run_batch([question])[0]

    def run_batch(self, questions: list[str]) -> list[Result]:
        return with_answers(self.retrieve_batch(questions), self.generator)

    def retrieve(self, question: str) -> Result:
        """The question's :class:`Result`, retrieval only: iterate it for the ranked chunks; ``hops`` per hop."""
        return self.retrieve_batch([question])[0]

    def retrieve_batch(self, questions: Sequence[str]) -> list[Result]:
        """All questions hop by hop together (same results as one at a time, higher throughput)."""
        if isinstance(questions, str):
            raise TypeError("retrieve_batch takes a list of questions; use retrieve(question) for one")
        return self.loop.run(list(questions))

    def answer(self, question: str, llm: Any = "default", *, dataset: str | None = None,
               context: str = "chunks", **generator_options: Any) -> Result:
        """Retrieve, then one LLM call with the paper's retrieval QA prompt for ``dataset``.

        ``llm`` is an :class:`effrag.llm.LLM` or a spec (``"default"`` = bundled SmolLM2);
        ``context="kept_words"`` sends only the Labeler's kept words (compressed context).
        The result is what ``effrag eval --method efficientrag --llm`` records for the question:
        ``answer``, the LLM usage, the LLM's raw output in ``generation``.
        """
        key = (id(llm) if not isinstance(llm, str) else llm, dataset, context, tuple(sorted(generator_options.items())))
        gen = self._generators.get(key)
        if gen is None:
            gen = self._generators[key] = Generator(llm, dataset=dataset, context=context, **generator_options)
        return with_answers(self.retrieve_batch([question]), gen)[0]


def with_answers(results: list[Result], generator: Any = None) -> list[Result]:
    """Loop results answered by ``generator`` when given (:func:`.generation.answer_results`; in place): its
    record in ``generation``, its time in ``timing``."""
    for r, reply in zip(results, answer_results(generator, results)):
        r.generation = reply.get("trace") or None
        if "latency_s" in reply:
            r.timing["generation"] = reply["latency_s"]
    return results
