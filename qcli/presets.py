"""Named quantization schemes: what `--scheme NAME` and a recipe's `preset = "NAME"` stand for.

Each preset is a `QuantScheme` Burn accepts (`scheme.accept_problems` is empty) and at least one Burn
backend loads (`qcli.burn_backends`), plus the calibration qcli measures its scales with. docs/presets.md
tabulates them with the backends that load each one. Names are matched case-insensitively; the
canonical spelling is lower case.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from qcli import BURN_VERSION
from qcli.errors import SchemeError, UsageError
from qcli.scheme import (
    LOOKUP_WHY,
    Calibration,
    Native,
    PackedU32,
    QuantScheme,
    QuantValue,
    ScaleDtype,
)


@dataclass(frozen=True)
class Preset:
    """A named scheme and the calibration its scales are measured with."""

    name: str
    scheme: QuantScheme
    calibration: Calibration
    description: str


def _blocked(value: QuantValue, block: int) -> QuantScheme:
    """`value` packed in u32 words, one F16 scale per `block` consecutive values of a row."""
    return QuantScheme().with_value(value).with_store(PackedU32(0)).per_block([block], ScaleDtype.F16)


def _per_tensor(value: QuantValue) -> QuantScheme:
    return QuantScheme().with_value(value).with_store(PackedU32(0)).per_tensor(ScaleDtype.F32)


_MINMAX = Calibration.MinMax
_PRESET_LIST = [
    Preset("q8s", _per_tensor(QuantValue.Q8S), _MINMAX,
           "8-bit integers, one F32 scale per tensor: Burn's default layout; one outlier costs every value precision"),
    Preset("q8s-native", _per_tensor(QuantValue.Q8S).with_store(Native()), _MINMAX,
           "q8s with one byte per value: the only layout Burn's NdArray backend loads"),
    Preset("q8s-b32", _blocked(QuantValue.Q8S, 32), _MINMAX,
           "8-bit integers, one F16 scale per 32 values: robust to outliers"),
    Preset("q4s-b32", _blocked(QuantValue.Q4S, 32), _MINMAX,
           "4-bit integers, one F16 scale per 32 values: the default, about 4.5 bits per weight"),
    Preset("q4s-b64", _blocked(QuantValue.Q4S, 64), _MINMAX,
           "4-bit integers, one F16 scale per 64 values: smaller, a little more error"),
    Preset("q4s-b128", _blocked(QuantValue.Q4S, 128), _MINMAX,
           "4-bit integers, one F16 scale per 128 values: smallest 4-bit preset"),
    Preset("q4f-b32", _blocked(QuantValue.Q4F, 32), _MINMAX,
           "4-bit integers over the full range [-8, 7], one F16 scale per 32 values"),
    Preset("q4f-b32-global", _blocked(QuantValue.Q4F, 32).per_tensor(ScaleDtype.F32), _MINMAX,
           "q4f-b32's blocks under one F32 scale per tensor: the 4-bit form a Burn wgpu model computes with "
           "lowest error"),
    Preset("q2s-b32", _blocked(QuantValue.Q2S, 32), _MINMAX,
           "2-bit integers {-1, 0, 1}, one F16 scale per 32 values: ternary weights"),
    Preset("e4m3", _per_tensor(QuantValue.E4M3), _MINMAX,
           "FP8 E4M3 codes, one F32 scale per tensor"),
    Preset("e5m2", _per_tensor(QuantValue.E5M2), _MINMAX,
           "FP8 E5M2 codes (wider range, fewer mantissa bits), one F32 scale per tensor"),
    Preset("e4m3-b32", _blocked(QuantValue.E4M3, 32), _MINMAX,
           "FP8 E4M3 codes, one F16 scale per 32 values"),
    Preset("fp4-b32", _blocked(QuantValue.E2M1, 32), _MINMAX,
           "FP4 E2M1 codes, one F16 scale per 32 values: the 4-bit float format Burn's GPU backends load"),
]
PRESETS: dict[str, Preset] = {p.name: p for p in _PRESET_LIST}
DEFAULT_PRESET = "q4s-b32"
# The presets a refusal's `--requantize` offers, by the codes' width: ones a Burn model computes with on flex
# (q4f-b32, the full 4-bit grid, decodes everywhere but computes nowhere: docs/output.md).
REQUANTIZE_NARROW, REQUANTIZE_WIDE = "q4s-b32", "q8s-b32"

# Names other quantizers use for schemes Burn has no QFloat form for, so asking for one gets the reason
# rather than "unknown preset". Codebooks need mode Lookup; the others a zero point (the K-quants with
# mins among them: K_QUANT_MINS, below).
LOOKUP_NAMES = ("nf4", "iq2_xs", "iq3_xs", "iq4_nl", "iq4_xs")
ZERO_POINT_NAMES = ("q4_1", "q5_1", "w4a16_asym", "affine", "asym", "asymmetric", "hqq")
# Formats Burn has a QuantScheme for but no backend of this release loads: asked for by name, they are
# refused with the reason and what loads instead.
UNLOADABLE = {
    "nvfp4": "Burn's flex and ndarray backends decode no E2M1 values and wgpu reads no UE4M3 scales, and "
             "Burn cannot read back its own QuantScheme::nvfp4() (PackedNative)",
    "mxfp4": "Burn's flex and ndarray backends decode no E2M1 values and wgpu reads no UE8M0 scales",
}
UNLOADABLE_INSTEAD = "use fp4-b32 (E2M1 with F16 scales of 32 values, loads on wgpu) or q4s-b32 (flex and wgpu)"
ZERO_POINT_WHY = (
    "Burn has no zero point: every QuantScheme is symmetric around 0, so an asymmetric "
    "(zero-point, affine) scheme has no QFloat form"
)


# llama.cpp (GGUF) and FP8 names: refused, each with the Burn preset nearest to it and, where that is not
# the same grid, the difference in one phrase. GGUF's byte layout is never Burn's; these are about values.
_E4M3 = ("e4m3", "FP8 E4M3 codes, one F32 scale per tensor (e4m3-b32: F16 scales per 32 values); loads on "
         "Burn's wgpu only", "an FP8 format's")
FOREIGN_NAMES: dict[str, tuple[str, str, str]] = {
    "q8_0": ("q8s-b32", "8-bit, blocks of 32 with F16 scales, as Q8_0 (the same [-127, 127] grid)", "llama.cpp's"),
    "q4_0": ("q4f-b32", "4-bit over the full range [-8, 7] in blocks of 32 with F16 scales, as Q4_0, but scaled by "
             "max|x| / 7.5 where Q4_0 divides the signed max by -8", "llama.cpp's"),
    "q5_0": ("q8s-b32", "8-bit, blocks of 32 with F16 scales: Burn has no 5-bit values (q4f-b32 is the smaller "
             "choice)", "llama.cpp's"),
    **dict.fromkeys(("fp8", "f8", "float8", "fp8_e4m3", "f8_e4m3", "fp8_e4m3fn", "f8_e4m3fn", "e4m3fn"), _E4M3),
    **dict.fromkeys(("fp8_e5m2", "f8_e5m2"), ("e5m2", "FP8 E5M2 codes, one F32 scale per tensor; loads on Burn's "
                                              "wgpu only", "an FP8 format's")),
}
# llama.cpp's K-quants: super-blocks of 256 values with integer sub-block scales under an F16 scale, and
# for Q2_K, Q4_K and Q5_K an integer min per sub-block. Burn's block scales are floats and it has no min
# (zero point), so none has a QFloat form. `_s`, `_m`, `_l` name llama.cpp's mixes of them.
_FLOAT_SCALES = f"block scales are floats ({', '.join(ScaleDtype)}), not integers"
_K_MINS = ("integer sub-block scales and mins under an F16 scale; Burn has no zero point (a min) and its "
           + _FLOAT_SCALES)
_K_SYMMETRIC = f"integer sub-block scales under an F16 scale; Burn's {_FLOAT_SCALES}"
K_QUANTS: dict[str, tuple[str, str, str]] = {
    "q2_k": (_K_MINS, "q4s-b32", "4-bit, blocks of 32 with F16 scales; q2s-b32 is ternary, for BitNet-style "
             "models only"),
    "q3_k": (_K_SYMMETRIC, "q4s-b32", "4-bit, blocks of 32 with F16 scales"),
    "q4_k": (_K_MINS, "q4s-b32", "4-bit, blocks of 32 with F16 scales and no min"),
    "q5_k": (_K_MINS, "q8s-b32", "8-bit, blocks of 32: Burn has no 5-bit values; q4s-b32 is the smaller choice"),
    "q6_k": (_K_SYMMETRIC, "q8s-b32", "8-bit, blocks of 32: Burn has no 6-bit values; q4s-b32 is the smaller "
             "choice"),
}
K_QUANT_MIXES = ("_xs", "_s", "_m", "_l")
K_QUANT_MINS = tuple(name for name, (layout, _, _) in K_QUANTS.items() if layout is _K_MINS)


def k_quant(name: str) -> str | None:
    """The K-quant `name` is or mixes (`q4_k` for `Q4_K_M`), or None."""
    key = name.strip().lower().replace("-", "_")
    base = next((key[: -len(mix)] for mix in K_QUANT_MIXES if key.endswith(mix)), key)
    return base if base in K_QUANTS else None


def foreign_preset(name: str) -> SchemeError | UsageError | None:
    """The error for a llama.cpp or FP8 name (`q8_0`, `q4_k_m`, `fp8`), naming the nearest Burn preset; None
    for any other name. A name with a near preset is a `UsageError`, a K-quant (no QFloat form) a
    `SchemeError`."""
    key = name.strip().lower().replace("-", "_")
    if key in FOREIGN_NAMES:
        preset, what, origin = FOREIGN_NAMES[key]
        return UsageError(f"{name.strip()!r} is {origin} name, not a qcli preset", hint=f"use {preset}: {what}")
    base = k_quant(name)
    if base is not None:
        layout, preset, what = K_QUANTS[base]
        mix = " mix" if base != key else ""
        return SchemeError(f"{name.strip()} is a llama.cpp K-quant{mix}, refused: super-blocks of 256 values with "
                           f"{layout}", f"use {preset} ({what}), or keep the tensor")
    return None


def resolve_preset(name: str | None, default: str = DEFAULT_PRESET) -> Preset:
    """The preset `--scheme` names (any case), or `default` (a Burn backend's: `burn_backends.default_preset`);
    codebook and zero-point names are refused."""
    return get_preset(default if name is None else name)


def get_preset(name: str) -> Preset:
    """The preset called `name` (any case).

    `SchemeError` for a codebook, K-quant or zero-point scheme Burn cannot hold, `UsageError` for any other
    name: a llama.cpp or FP8 name (`q8_0`, `fp8`) gets the nearest preset, a typo the closest name.
    """
    key = name.strip().lower()
    if key in PRESETS:
        return PRESETS[key]
    foreign = foreign_preset(name)
    if foreign is not None:
        raise foreign
    instead = f"use a Symmetric scheme of the same width, e.g. --scheme {DEFAULT_PRESET}, or keep the tensor"
    if key in LOOKUP_NAMES:
        raise SchemeError(f"{name} is a codebook scheme (mode Lookup), refused: {LOOKUP_WHY}", instead)
    if key in ZERO_POINT_NAMES:
        raise SchemeError(f"{name} is an asymmetric scheme: {ZERO_POINT_WHY}", instead)
    if key in UNLOADABLE:
        raise SchemeError(f"{name} loads on no backend of Burn {BURN_VERSION}: {UNLOADABLE[key]}", UNLOADABLE_INSTEAD)
    close = difflib.get_close_matches(key, PRESETS, n=1, cutoff=0.5)
    suggestion = f"did you mean {close[0]!r}? " if close else ""
    raise UsageError(f"unknown preset {name!r}", hint=f"{suggestion}known presets: {', '.join(PRESETS)}")
