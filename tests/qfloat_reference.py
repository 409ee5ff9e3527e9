"""An independent, pure-Python QFloat writer for tests: no torch, no numpy, nothing from qcli.codec.

It restates docs/arithmetic.md and qfloat-spec §2-3 one scalar at a time, in a different way from the
codec so the two cannot share a bug: f32 arithmetic is a float64 operation rounded once through
`struct` (exact for one +, *, / of two f32 operands), scale round-up is "the smallest value of the
dtype's finite grid that is >= s" found by bisection, and a minifloat code is the nearest table entry
with ties to the even code. Blocks are found per element by integer division of its index.
"""

from __future__ import annotations

import bisect
import itertools
import math
import struct

MIN_POSITIVE = 2.0**-126

# Hand-copied from qfloat-spec §1.2 and §2.2: (a, b) and h = (b - a) / 2.
RANGE = {
    "Q8F": (-128, 127),
    "Q8S": (-127, 127),
    "Q4F": (-8, 7),
    "Q4S": (-7, 7),
    "Q2F": (-2, 1),
    "Q2S": (-1, 1),
    "E4M3": (-448.0, 448.0),
    "E5M2": (-57344.0, 57344.0),
    "E2M1": (-6.0, 6.0),
}
BITS = {"Q8F": 8, "Q8S": 8, "E4M3": 8, "E5M2": 8, "Q4F": 4, "Q4S": 4, "E2M1": 4, "Q2F": 2, "Q2S": 2}


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def from_f32_bits(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b))[0]


def _minifloat_positive(e_bits: int, m_bits: int, bias: int, ieee_top: bool) -> list[float]:
    """All finite non-negative values by code order (code = e << m | mantissa)."""
    out = []
    for code in range(1 << (e_bits + m_bits)):
        e, m = code >> m_bits, code & ((1 << m_bits) - 1)
        if ieee_top and e == (1 << e_bits) - 1:
            break
        if e == 0:
            out.append(m * 2.0 ** (1 - bias - m_bits))
        else:
            out.append((1 + m / 2**m_bits) * 2.0 ** (e - bias))
    return out


# Positive code tables; E4M3 drops its NaN code 0x7F (the last one).
MINIFLOAT = {
    "E4M3": _minifloat_positive(4, 3, 7, ieee_top=False)[:-1],
    "E5M2": _minifloat_positive(5, 2, 15, ieee_top=True),
    "E2M1": _minifloat_positive(2, 1, 1, ieee_top=False),
}
SIGN_BIT = {"E4M3": 0x80, "E5M2": 0x80, "E2M1": 0x8}


def minifloat_code(v: float, value: str) -> int:
    """Nearest code, ties to the even code, after clamping to the format's max; the sign is kept."""
    table = MINIFLOAT[value]
    mag = min(abs(v), table[-1])
    i = bisect.bisect_left(table, mag)
    if i == len(table) or table[i] != mag:
        lo, hi = i - 1, i
        d_lo, d_hi = mag - table[lo], table[hi] - mag
        i = lo if d_lo < d_hi or (d_lo == d_hi and lo % 2 == 0) else hi
    negative = math.copysign(1.0, v) < 0
    return i | (SIGN_BIT[value] if negative else 0)


def minifloat_value(code: int, value: str) -> float:
    mag = MINIFLOAT[value][code & (SIGN_BIT[value] - 1)]
    return -mag if code & SIGN_BIT[value] else mag


def _f16_grid() -> list[float]:
    return [struct.unpack("<e", struct.pack("<H", c))[0] for c in range(0x7C00)]


def _bf16_grid() -> list[float]:
    return [from_f32_bits(c << 16) for c in range(0x7F80)]


def _ue8m0_grid() -> list[float]:
    """UE8M0 (Burn 0.22.1, cubecl 0.11.3): a bare biased exponent, code c standing for 2^(c - 127) for c in
    0..254 (so 2^-127, subnormal in f32, through 2^127); code 0xFF is NaN and is no grid value."""
    return [2.0 ** (c - 127) for c in range(255)]


SCALE_GRID = {"F16": _f16_grid(), "BF16": _bf16_grid(), "UE4M3": MINIFLOAT["E4M3"], "UE8M0": _ue8m0_grid()}
SCALE_MAX = {
    "F32": from_f32_bits(0x7F7FFFFF),
    "F16": 65504.0,
    "BF16": from_f32_bits(0x7F7F0000),
    "UE4M3": 448.0,
    "UE8M0": 2.0**127,
}
SIGNED_SCALES = {"F32", "F16", "BF16"}  # UE4M3 and UE8M0 are unsigned (the U)


def round_up(s: float, dtype: str) -> float:
    """The smallest value of `dtype` that is >= s, saturating at its max (F32: s itself).

    UE8M0 has nothing below 2^-127, so every s up to it (0 included) gives 2^-127; NaN stays NaN."""
    if dtype == "F32" or math.isnan(s):
        return s
    grid = SCALE_GRID[dtype]
    i = bisect.bisect_left(grid, s)
    return grid[min(i, len(grid) - 1)]


def scale_bytes(s: float, dtype: str) -> bytes:
    if dtype == "F32":
        return struct.pack("<f", s)
    if dtype == "F16":
        return struct.pack("<e", s)
    if dtype == "BF16":
        return struct.pack("<H", f32_bits(s) >> 16)
    if dtype == "UE8M0" and math.isnan(s):
        return b"\xff"
    return bytes([SCALE_GRID[dtype].index(s)])  # UE4M3: the e4m3 code; UE8M0: the biased exponent


def ue8m0_value(code: int) -> float:
    """The scale a UE8M0 byte stands for: 2^(code - 127), so code 0 is 2^-127; 0xFF is NaN."""
    return math.nan if code == 0xFF else 2.0 ** (code - 127)


def quantize(
    data: list[float],
    shape: list[int],
    value: str,
    store: str,
    block: list[int] | None,
    scale_dtype: str,
    two_level: bool = False,
    calibration: str = "MinMax",
) -> tuple[bytes, list[int], list[float], list[float], float | None]:
    """(payload, fields, stored scales, decoded values, global) of row-major `data` (f32 values).

    `store` is "Native", "PackedU32" or "PackedNative"; `block` None means per tensor.
    """
    shape = shape or [1]
    rank = len(shape)
    blk = shape if block is None else ([1] * rank + list(block))[-rank:]
    grid = [-(-d // b) for d, b in zip(shape, blk, strict=True)]
    index = list(itertools.product(*[range(d) for d in shape]))
    block_of = [tuple(i // b for i, b in zip(ix, blk, strict=True)) for ix in index]
    members: dict[tuple, list[float]] = {}
    for x, bk in zip(data, block_of, strict=True):
        members.setdefault(bk, []).append(x)
    order = list(itertools.product(*[range(g) for g in grid]))
    a, b = RANGE[value]
    h = (b - a) / 2
    alpha = {}
    for bk in order:
        xs = members.get(bk, [0.0])
        if calibration == "MinMax":
            alpha[bk] = max(abs(x) for x in xs)
        else:
            alpha[bk] = f32(math.fsum(abs(x) for x in xs) / len(xs))
    raw = {bk: f32(alpha[bk] / h) for bk in order}
    global_scale = None
    if two_level:
        global_scale = max(max(f32(r / SCALE_MAX[scale_dtype]) for r in raw.values()), MIN_POSITIVE)
        rel = {bk: f32(raw[bk] / global_scale) for bk in order}
        stored = {bk: round_up(r if r > 0 else MIN_POSITIVE, scale_dtype) for bk, r in rel.items()}
        effective = {bk: f32(global_scale * s) for bk, s in stored.items()}
    else:
        stored = {bk: round_up(r if r > 0 else MIN_POSITIVE, scale_dtype) for bk, r in raw.items()}
        effective = stored
    fields, decoded = [], []
    for x, bk in zip(data, block_of, strict=True):
        s = effective[bk]
        v = x if x == 0 else f32(x / s)
        if value in MINIFLOAT:
            code = minifloat_code(v, value)
            fields.append(code)
            decoded.append(f32(minifloat_value(code, value) * s))
        else:
            q = round(min(max(v, a), b))  # Python's round is half to even
            fields.append(q)
            decoded.append(f32(q * s))
    payload = _value_bytes(fields, shape, value, store)
    payload += b"".join(scale_bytes(stored[bk], scale_dtype) for bk in order)
    if two_level:
        payload += struct.pack("<f", global_scale)
    return payload, fields, [stored[bk] for bk in order], decoded, global_scale


def _value_bytes(fields: list[int], shape: list[int], value: str, store: str) -> bytes:
    bits = BITS[value]
    mask = (1 << bits) - 1
    if store == "Native":
        return bytes(f & 0xFF for f in fields)
    per_unit, unit_bytes = (32 // bits, 4) if store == "PackedU32" else (2, 1)
    last = shape[-1]
    out = bytearray()
    for start in range(0, len(fields), last):
        row = fields[start : start + last]
        row += [0] * (-len(row) % per_unit)
        for u in range(0, len(row), per_unit):
            word = sum((f & mask) << (k * bits) for k, f in enumerate(row[u : u + per_unit]))
            out += word.to_bytes(unit_bytes, "little")
    return bytes(out)
