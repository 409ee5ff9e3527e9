"""Byte sizes as people write them, for `--max-shard-size` and the GPU pipeline's memory settings."""

from __future__ import annotations

import math

from qcli.errors import UsageError


def parse_size(text: str, setting: str) -> int:
    """Bytes from `50GB`, `500MiB`, `1.5TB` or a plain count (decimal units, binary with `i`); `UsageError`
    naming `setting` (the option or variable `text` came from) for anything else, or no bytes."""
    number = text.strip().upper().removesuffix("B")
    scale = 1
    for i, prefix in enumerate("KMGT", start=1):
        if number.endswith(prefix + "I"):
            number, scale = number[:-2], 1024**i
        elif number.endswith(prefix):
            number, scale = number[:-1], 1000**i
    try:
        value = float(number) * scale
        size = int(value) if math.isfinite(value) else 0  # inf, nan, 1e400: no size
    except (ValueError, OverflowError):
        size = 0
    if size <= 0:
        raise UsageError(f"{setting} {text!r} is not a size", hint="give a byte count, e.g. 50GB, 500MiB or 2e9")
    return size
