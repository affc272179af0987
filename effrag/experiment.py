"""The run-setup layer's former home, kept so that code written against it keeps working.

The setup (questions -> corpus -> retriever -> gold, and the run identity) lives in :mod:`effrag.setup`; the
argparse types and shared argument groups in :mod:`effrag.cli_args`. New code imports from those.
"""
from effrag.cli_args import (add_corpus_args, add_method_args, add_questions_args, add_retriever_args,  # noqa: F401
                             add_run_args, method_options, output_dir, positive_int)
from effrag.setup import (RETRIEVER_KINDS, RunSetup, dataset_file, default_cache_dir, encoder_path,  # noqa: F401
                          open_corpus, open_index, open_retriever, retriever_options)

__all__ = ["add_corpus_args", "add_method_args", "add_questions_args", "add_retriever_args", "add_run_args",
           "method_options", "output_dir", "positive_int", "RETRIEVER_KINDS", "RunSetup", "dataset_file",
           "default_cache_dir", "encoder_path", "open_corpus", "open_index", "open_retriever", "retriever_options"]
