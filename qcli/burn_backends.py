"""Which Burn release and backend loads what: the capability table behind `--burn-version` and `--burn-backend`.

Measured, not read from code. The harnesses in tests/burn (Burn 0.22.1) and tests/burn-0.21 (Burn 0.21.0)
built every value x store x scale dtype x scale level, ragged and whole rows, and every kept dtype with
`Tensor::from_data` on each backend and dequantized it; "loads" means Burn's f32 values equal qcli's
decode bit for bit. tests/io/test_burn_backends.py runs that sweep again and holds this table to it;
docs/output.md has the table in prose.

wgpu is Burn's `wgpu` feature (WGSL shaders), measured on Mesa's lavapipe Vulkan driver (and for 0.22.1 on
an NVIDIA H200 through its Vulkan driver, with the same results).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from qcli import BURN_VERSION
from qcli.errors import UsageError
from qcli.io.dtypes import DType, Plain, QFloat
from qcli.scheme import Native, PackedNative, PackedU32, QuantScheme, QuantValue, ScaleDtype, symmetric_integer

# Burn 0.21 reads a scheme's scales from the keys `param` and `level`, 0.22 from `tensor` and `block`.
OLDER_SERDE_VERSIONS = frozenset({"0.21.0"})


class BurnBackend(StrEnum):
    """A Burn backend by the name of its cargo feature and `Device` constructor."""

    flex = "flex"
    ndarray = "ndarray"
    wgpu = "wgpu"


# The backends a plan is checked against when no --burn-backend is given: Burn's CPU backend and its
# portable GPU one (ndarray is deprecated in Burn 0.22 in favour of flex).
COMMON_BACKENDS = (BurnBackend.flex, BurnBackend.wgpu)

_INTEGERS = frozenset(v for v in QuantValue if not v.is_minifloat())
_EIGHT_BIT_INTEGERS = frozenset(v for v in _INTEGERS if v.size_bits() == 8)
_EIGHT_BIT_NAMES = " and ".join(v for v in QuantValue if v in _EIGHT_BIT_INTEGERS)
_NONE: frozenset[QuantValue] = frozenset()


@dataclass(frozen=True)
class Capability:
    """What one backend's `q_from_data` (and `from_data` for kept tensors) accepts and decodes exactly.

    `stores` maps each store kind to the values it loads in it; `ragged_rank` is the highest rank at which
    a packed tensor whose last axis is not a whole number of u32 words still loads (0: never);
    `block_axes` the most axes a block may span; `partial_blocks` whether a block may overhang the edge
    of the tensor; `unsupported` says, per failure, what Burn does, for the message.
    """

    stores: dict[type, frozenset[QuantValue]]
    scale_dtypes: frozenset[ScaleDtype]
    ragged_rank: int
    kept_refused: frozenset[Plain]
    unsupported: dict[str, str]
    block_axes: int = 5
    partial_blocks: bool = True
    two_level: bool = True


_FLEX_0_22 = Capability(
    stores={PackedU32: _INTEGERS, Native: _EIGHT_BIT_INTEGERS, PackedNative: _NONE},
    scale_dtypes=frozenset(ScaleDtype),
    ragged_rank=1,
    kept_refused=frozenset(),
    unsupported={
        "value": "flex decodes integer values only: packed minifloats panic (\"Not yet supported\") and "
                 "Native ones are read as integers, silently wrong",
        "store": "flex panics on PackedNative (\"Not yet supported\")",
        "ragged": "flex unpacks the words of a tensor as one run, so padded rows panic or decode wrongly",
    },
)
_NDARRAY_0_22 = Capability(
    stores={PackedU32: _EIGHT_BIT_INTEGERS, Native: _EIGHT_BIT_INTEGERS, PackedNative: _NONE},
    scale_dtypes=frozenset(ScaleDtype),
    ragged_rank=0,
    kept_refused=frozenset({Plain.F16, Plain.BF16}),
    unsupported={
        "value": f"ndarray builds only {_EIGHT_BIT_NAMES} tensors (\"from_data not supported for scheme\")",
        "store": f"ndarray builds only {_EIGHT_BIT_NAMES} tensors",
        "ragged": "ndarray needs whole u32 words in every row",
        "kept": "ndarray has no F16 or BF16 tensors (\"Unsupported dtype\")",
    },
)
_WGPU_0_22 = Capability(
    stores={PackedU32: frozenset(QuantValue), Native: _NONE, PackedNative: _NONE},
    scale_dtypes=frozenset({ScaleDtype.F32, ScaleDtype.F16}),
    ragged_rank=0,
    kept_refused=frozenset(),
    unsupported={
        "store": "wgpu loads PackedU32 only: Native panics (\"not supported for native quantization\") and "
                 "PackedNative reads past its buffer",
        "scale": "wgpu's WGSL shaders read F32 and F16 scales only: BF16 scales decode wrongly, UE4M3 and "
                 "UE8M0 fail to compile",
        "ragged": "wgpu panics on a row that is not a whole number of u32 words (\"Can't store in u32\")",
    },
)
# Burn 0.21's CPU backends read every scale as f32 and a block as a run of consecutive values.
_CPU_0_21 = {
    "scale": "Burn 0.21's CPU backends read every scale as an f32 (other scale dtypes panic)",
    "block": "Burn 0.21's CPU backends take a block as a run of consecutive values: a block over two "
             "axes decodes wrongly and one that overhangs the tensor's edge panics",
}

CAPABILITIES: dict[str, dict[BurnBackend, Capability]] = {
    "0.22.1": {BurnBackend.flex: _FLEX_0_22, BurnBackend.ndarray: _NDARRAY_0_22, BurnBackend.wgpu: _WGPU_0_22},
    "0.21.0": {
        BurnBackend.flex: Capability(
            stores={PackedU32: _INTEGERS, Native: _EIGHT_BIT_INTEGERS, PackedNative: _NONE},
            scale_dtypes=frozenset({ScaleDtype.F32}),
            ragged_rank=1,
            kept_refused=frozenset(),
            unsupported={**_FLEX_0_22.unsupported, **_CPU_0_21},
            block_axes=1,
            partial_blocks=False,
            two_level=False,
        ),
        BurnBackend.ndarray: Capability(
            stores={PackedU32: _EIGHT_BIT_INTEGERS, Native: _EIGHT_BIT_INTEGERS, PackedNative: _NONE},
            scale_dtypes=frozenset({ScaleDtype.F32}),
            ragged_rank=0,
            kept_refused=frozenset({Plain.F16, Plain.BF16}),
            unsupported={**_NDARRAY_0_22.unsupported, **_CPU_0_21},
            block_axes=1,
            partial_blocks=False,
            two_level=False,
        ),
        BurnBackend.wgpu: Capability(
            stores={PackedU32: _INTEGERS, Native: _NONE, PackedNative: _NONE},
            scale_dtypes=frozenset({ScaleDtype.F32, ScaleDtype.F16}),
            ragged_rank=0,
            kept_refused=frozenset(),
            unsupported={**_WGPU_0_22.unsupported,
                         "value": "wgpu 0.21 decodes packed minifloats (E4M3, E5M2, E2M1) wrongly",
                         "scale": "wgpu 0.21 reads F32 and F16 scales only: others decode to zeros, silently",
                         "store": "wgpu 0.21 loads PackedU32 only: Native panics, PackedNative overflows"},
            two_level=False,
        ),
    },
}
BURN_VERSIONS = tuple(CAPABILITIES)
assert BURN_VERSIONS[0] == BURN_VERSION, "the first table is the release qcli targets by default"


def resolve_backend(name: str | None) -> BurnBackend | None:
    """The Burn backend `--burn-backend` names, or None for the common backends."""
    if name is None:
        return None
    try:
        return BurnBackend(name.lower())
    except ValueError:
        raise UsageError(f"unknown Burn backend {name!r}",
                         hint=f"use one of {', '.join(BurnBackend)} (docs/output.md says what each loads)") from None


def resolve_version(name: str | None) -> str:
    """The Burn release `--burn-version` names (`0.21` or `0.21.0`), or the newest stable one qcli targets."""
    if name is None:
        return BURN_VERSION
    chosen = [v for v in BURN_VERSIONS if name.strip() in (v, v.rsplit(".", 1)[0])]
    if not chosen:
        raise UsageError(f"Burn {name!r} is not a release qcli writes for",
                         hint=f"use one of {', '.join(BURN_VERSIONS)} (the default is {BURN_VERSION})")
    return chosen[0]


def load_problem(backend: BurnBackend, scheme: QuantScheme, shape: Sequence[int],
                 version: str = BURN_VERSION) -> str | None:
    """Why `backend` of Burn `version` cannot load a tensor of `shape` (as written) quantized with
    `scheme`, or None. An empty `shape` stands for a shape not known yet: only the scheme is checked."""
    return _load_problem(backend, scheme, tuple(shape), version)


@functools.lru_cache(maxsize=1 << 12)  # asked of every tensor for each backend; a model has a few shapes
def _load_problem(backend: BurnBackend, scheme: QuantScheme, shape: tuple[int, ...], version: str) -> str | None:
    capability = CAPABILITIES[version][backend]
    if scheme.is_two_level() and not capability.two_level:
        return hold_problem(scheme, version)
    if scheme.value not in capability.stores[type(scheme.store)]:
        any_store = any(scheme.value in values for values in capability.stores.values())
        return capability.unsupported["store" if any_store else "value"]
    dtypes = [scheme.tensor, scheme.block and scheme.block.dtype]
    if any(dtype is not None and dtype not in capability.scale_dtypes for dtype in dtypes):
        return capability.unsupported["scale"]
    if scheme.block is not None:
        block = scheme.block.size.to_dim_vec(len(shape)) if shape else scheme.block.size.dims()
        overhangs = bool(shape) and any(dim % extent for dim, extent in zip(shape, block, strict=True))
        spans = sum(extent > 1 for extent in block)
        if spans > capability.block_axes or (overhangs and not capability.partial_blocks):
            return capability.unsupported["block"]
    ragged = isinstance(scheme.store, PackedU32) and len(shape) > 0 and shape[-1] % scheme.num_quants() != 0
    if ragged and len(shape) > capability.ragged_rank:
        return capability.unsupported["ragged"]
    return None


def hold_problem(scheme: QuantScheme, version: str) -> str | None:
    """Why Burn `version` has no form for `scheme` at all, whatever the backend, or None."""
    if scheme.is_two_level() and version in OLDER_SERDE_VERSIONS:
        return f"Burn {version} has no two-level scheme (one scale level per tensor)"
    return None


def kept_problem(backend: BurnBackend, dtype: DType, version: str = BURN_VERSION) -> str | None:
    """Why `backend` of Burn `version` cannot build a kept tensor of Burn dtype `dtype`, or None."""
    capability = CAPABILITIES[version][backend]
    refused = isinstance(dtype, Plain) and dtype in capability.kept_refused
    return capability.unsupported["kept"] if refused else None


def qfloat(scheme: QuantScheme, version: str = BURN_VERSION) -> QFloat:
    """The QFloat dtype of `scheme` as Burn `version` reads it (0.21's keys added for 0.21, which 0.22
    ignores)."""
    return QFloat(scheme, with_0_21_keys=version in OLDER_SERDE_VERSIONS)


def _values_instead(value: QuantValue) -> tuple[QuantValue, ...]:
    """The values offered for `value` where it does not load: the Symmetric integer of its width, then, for
    an integer, the 8-bit one, which every backend loads."""
    wider = () if value.is_minifloat() else (symmetric_integer(8),)
    return tuple(v for v in dict.fromkeys((symmetric_integer(value.size_bits()), *wider)) if v is not value)


def loads_instead(backend: BurnBackend, scheme: QuantScheme, shape: Sequence[int],
                  version: str = BURN_VERSION) -> QuantScheme | None:
    """The scheme nearest to `scheme` that `backend` loads for `shape`: its store, then its scale dtypes,
    then its value changed, in that order of preference, one level only where two cannot be held; None
    when nothing near loads."""
    if scheme.is_two_level() and not CAPABILITIES[version][backend].two_level:
        scheme = QuantScheme(scheme.value, scheme.store, scheme.mode, None, scheme.block)
    # Same width first, then the most widely loaded scale dtypes: the first that loads is offered instead.
    for value in (scheme.value, *_values_instead(scheme.value)):
        for store in (scheme.store, PackedU32(0), Native()):
            for dtype in (None, ScaleDtype.F16, ScaleDtype.F32):
                candidate = _with_scale_dtype(scheme.with_value(value).with_store(store), dtype)
                if load_problem(backend, candidate, shape, version) is None:
                    return candidate
    return None


def _with_scale_dtype(scheme: QuantScheme, dtype: ScaleDtype | None) -> QuantScheme:
    """`scheme` with its innermost scale level stored as `dtype` (unchanged for None)."""
    if dtype is None:
        return scheme
    if scheme.block is not None:
        return scheme.per_block(scheme.block.size.dims(), dtype)
    return scheme.per_tensor(dtype)
