"""Tolerant JSON extraction from LLM generations.

Even with grammar-constrained decoding, models wrap JSON in code fences, add a
sentence before it, leave trailing commas or use Python-style single quotes.
:func:`parse_json_loose` accepts those and nothing more: a generation that has
no complete JSON object (e.g. cut off by ``max_tokens``) raises
:class:`JSONParseError` with a snippet, so callers can reject or retry.
"""
from __future__ import annotations

import json
import re
from typing import Any

_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.S)
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
_SMART = str.maketrans({"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'"})
_PY_LITERALS = re.compile(r"(?<![\w\"'])(True|False|None)(?![\w\"'])")


class JSONParseError(ValueError):
    """The text holds no parsable JSON object."""

    def __init__(self, reason: str, text: str):
        snippet = text if len(text) <= 160 else text[:157] + "..."
        super().__init__(f"{reason}: {snippet!r}")
        self.reason = reason
        self.text = text


def _first_object(text: str) -> str | None:
    """The first balanced ``{...}`` of ``text``, honouring quoted strings; None if unbalanced."""
    start = text.find("{")
    while start != -1:
        depth, quote, escaped = 0, None, False
        for i in range(start, len(text)):
            ch = text[i]
            if quote:
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == quote and (quote == '"' or re.match(r"\s*[,:}\]]", text[i + 1 :])):
                    quote = None
            elif ch in "\"'":
                # An apostrophe inside a bare word (it's) is not a quote.
                if ch == "'" and i > 0 and text[i - 1].isalnum():
                    continue
                quote = ch
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return text[start : i + 1]
        return None  # the first "{" never closes: truncated generation
    return None


def _single_to_double(s: str) -> str:
    """Turn single-quoted JSON strings into double-quoted ones, leaving apostrophes in words."""
    out: list[str] = []
    i, n = 0, len(s)
    while i < n:
        ch = s[i]
        if ch == '"':  # copy a double-quoted string verbatim
            j = i + 1
            while j < n and s[j] != '"':
                j += 2 if s[j] == "\\" else 1
            out.append(s[i : j + 1])
            i = j + 1
        elif ch == "'" and not (i > 0 and s[i - 1].isalnum()):
            j = i + 1
            buf: list[str] = []
            while j < n:
                if s[j] == "\\" and j + 1 < n:
                    buf.append(s[j : j + 2])
                    j += 2
                    continue
                # a closing quote is followed by , : } ] or whitespace before one of them
                if s[j] == "'" and re.match(r"\s*[,:}\]]", s[j + 1 :]):
                    break
                buf.append('\\"' if s[j] == '"' else s[j])
                j += 1
            out.append('"' + "".join(buf).replace("\\'", "'") + '"')
            i = j + 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _candidates(obj: str):
    """``obj`` then ever more repaired versions of it."""
    yield obj
    fixed = _TRAILING_COMMA.sub(r"\1", obj.translate(_SMART))
    yield fixed
    fixed = _PY_LITERALS.sub(lambda m: {"True": "true", "False": "false", "None": "null"}[m.group(1)], fixed)
    yield fixed
    yield _TRAILING_COMMA.sub(r"\1", _single_to_double(fixed))


def parse_json_loose(text: str) -> dict[str, Any]:
    """The first JSON object in ``text``, tolerating fences, prose, trailing commas and single quotes.

    Raises :class:`JSONParseError` naming why (no object, truncated, invalid).
    """
    if not isinstance(text, str):
        raise JSONParseError("expected a string", repr(text))
    fenced = _FENCE.findall(text)
    sources = [f for f in fenced if "{" in f] + [text]
    reason = "no JSON object found"
    for src in sources:
        if "{" not in src:
            continue
        obj = _first_object(src)
        if obj is None:
            reason = "unterminated JSON object (truncated generation?)"
            continue
        for cand in _candidates(obj):
            try:
                value = json.loads(cand, strict=False)  # raw newlines/tabs inside strings, as small models write
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
        reason = "invalid JSON object"
    raise JSONParseError(reason, text)
