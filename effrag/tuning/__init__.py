"""Tuning: choosing settings on dev questions, and scoring them on questions that did not choose them.

:mod:`.efficientrag` runs a grid of EfficientRAG loop configs over a dev file (cached model calls, recall
against chunks, the best config within a chunk budget); :mod:`.crossfit` turns the grid's per-question
results into cross-fitted figures (choose on some folds, score the held-out one) and chooses the shipped
configs, per dataset and jointly over datasets (``loop.json``).
"""
from .efficientrag import (
                           GRID_TYPES,
                           CachedModel,
                           CachedRetriever,
                           best_per_budget,
                           best_within,
                           candidates,
                           direct_r_curve,
                           forwards,
                           loop_key,
                           model_fingerprint,
                           pareto,
                           parse_grid,
                           read_grid_file,
                           run_grid,
                           score_results,
                           tuning_report,
                           tuning_setup,
)

__all__ = ["GRID_TYPES", "CachedModel", "CachedRetriever", "best_per_budget", "best_within", "candidates",
           "direct_r_curve", "forwards", "loop_key", "model_fingerprint", "pareto", "parse_grid", "run_grid", "score_results",
           "read_grid_file", "tuning_report", "tuning_setup"]
