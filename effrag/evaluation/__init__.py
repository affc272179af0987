"""Metrics (recall, EM, F1, cover-EM), the evaluation runner behind ``effrag eval`` and its predictions rows."""
from .metrics import cover_em, exact_match, f1, normalize_answer, recall
from .predictions import Prediction, read_predictions, write_row
from .report import markdown_table, md_table, write_metrics_md
from .runner import evaluate, set_seed

__all__ = ["recall", "exact_match", "f1", "cover_em", "normalize_answer", "evaluate", "set_seed", "md_table",
           "markdown_table", "write_metrics_md", "Prediction", "read_predictions", "write_row"]
