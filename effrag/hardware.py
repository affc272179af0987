"""Whether bfloat16 pays off on the device at hand.

bf16 autocast is fast on GPUs and on CPUs with native bf16 (AMX or AVX512-BF16: recent Xeons,
Zen 4+), but on an AVX2-only CPU PyTorch emulates it and a MiniLM forward/backward runs 10-20x
*slower* than fp32 (measured on a 2-core AVX2 EPYC: 1.9 s vs 33 s for one training step of 16 x
128 tokens). Every ``--bf16`` / ``mixed_precision: bf16`` in effrag goes through :func:`resolve_bf16`,
which keeps bf16 where it is fast and falls back to fp32 (once, with a warning) where it is not.
``EFFRAG_BF16=force`` keeps bf16 everywhere (to reproduce a bf16 figure bit for bit), ``EFFRAG_BF16=off``
disables it everywhere.
"""
from __future__ import annotations

import logging
import os
from functools import cache, lru_cache

log = logging.getLogger(__name__)
_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


@lru_cache(maxsize=1)
def cpu_has_native_bf16() -> bool:
    """True when the CPU has AMX-BF16 or AVX512-BF16 (read from /proc/cpuinfo; else torch's capability)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return any(flag in flags for flag in _BF16_FLAGS)
    except OSError:
        pass
    try:
        import torch

        return torch.backends.cpu.get_cpu_capability() in ("AVX512_BF16", "AMX", "AVX512")
    except Exception:  # noqa: BLE001 - an unknown platform: assume the slow path is not worth it
        return False


@cache
def _warn_once(device_type: str) -> None:
    log.warning("bf16 requested, but this CPU has no native bf16 (AMX / AVX512-BF16): running fp32, which is "
                "10-20x faster here (EFFRAG_BF16=force keeps bf16)")


def resolve_bf16(requested: bool | None, device_type: str = "cpu") -> bool:
    """Whether to run bf16 autocast for a request on ``device_type`` ("cpu", "cuda", ...)."""
    mode = os.environ.get("EFFRAG_BF16", "auto").strip().lower()
    if not requested or mode == "off":
        return False
    if mode == "force" or device_type != "cpu":
        return True
    if cpu_has_native_bf16():
        return True
    _warn_once(device_type)
    return False


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the platform has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)
