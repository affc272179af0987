"""The errors of reading datasets, shared by the original-format loaders and the Hugging Face layouts."""
from __future__ import annotations


class DataFormatError(ValueError):
    """A dataset or corpus file does not have the expected structure."""


class _RecordError(Exception):
    """Problem inside one record; the caller adds file and location."""

    def __init__(self, fieldname: str, msg: str):
        super().__init__(f"field '{fieldname}': {msg}")
