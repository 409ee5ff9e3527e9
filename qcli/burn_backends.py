"""Which Burn backend loads what: the capability table behind `--burn-backend`.

Measured, not read from code. The harness in tests/burn (Burn 0.22.1) built every value x store x scale
dtype x scale level, ragged and whole rows, and every kept dtype with `Tensor::from_data` on each backend
and dequantized it; "loads" means Burn's f32 values equal qcli's decode bit for bit. tests/test_burn_backends.py
runs that sweep again and holds this table to it; docs/output.md has the table in prose.

wgpu is Burn's `wgpu` feature (WGSL shaders), measured on Mesa's lavapipe Vulkan driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from qcli.scheme import Native, PackedNative, PackedU32, QuantScheme, QuantValue, ScaleDtype


class BurnBackend(StrEnum):
    """A Burn backend by the name of its cargo feature and `Device` constructor."""

    flex = "flex"
    ndarray = "ndarray"
    wgpu = "wgpu"


# The backends a plan is checked against when no --burn-backend is given: Burn's CPU backend and its
# portable GPU one (ndarray is deprecated in Burn 0.22 in favour of flex).
COMMON_BACKENDS = (BurnBackend.flex, BurnBackend.wgpu)

_INTEGERS = frozenset({QuantValue.Q8F, QuantValue.Q8S, QuantValue.Q4F, QuantValue.Q4S, QuantValue.Q2F,
                       QuantValue.Q2S})
_EIGHT_BIT_INTEGERS = frozenset({QuantValue.Q8F, QuantValue.Q8S})


@dataclass(frozen=True)
class Capability:
    """What one backend's `q_from_data` (and `from_data` for kept tensors) accepts and decodes exactly.

    `stores` maps each store kind to the values it loads in it; `ragged_rank` is the highest rank at which
    a packed tensor whose last axis is not a whole number of u32 words still loads (0: never);
    `unsupported` says, per failure, what Burn does, for the message.
    """

    backend: BurnBackend
    stores: dict[type, frozenset[QuantValue]]
    scale_dtypes: frozenset[ScaleDtype]
    ragged_rank: int
    kept_refused: frozenset[str]
    unsupported: dict[str, str]


CAPABILITIES = {
    BurnBackend.flex: Capability(
        BurnBackend.flex,
        stores={PackedU32: _INTEGERS, Native: _EIGHT_BIT_INTEGERS, PackedNative: frozenset()},
        scale_dtypes=frozenset(ScaleDtype),
        ragged_rank=1,
        kept_refused=frozenset(),
        unsupported={
            "value": "flex decodes integer values only: packed minifloats panic (\"Not yet supported\") and "
                     "Native ones are read as integers, silently wrong",
            "store": "flex panics on PackedNative (\"Not yet supported\")",
            "ragged": "flex unpacks the words of a tensor as one run, so padded rows panic or decode wrongly",
        },
    ),
    BurnBackend.ndarray: Capability(
        BurnBackend.ndarray,
        stores={PackedU32: _EIGHT_BIT_INTEGERS, Native: _EIGHT_BIT_INTEGERS, PackedNative: frozenset()},
        scale_dtypes=frozenset(ScaleDtype),
        ragged_rank=0,
        kept_refused=frozenset({"F16", "BF16"}),
        unsupported={
            "value": "ndarray builds only Q8F and Q8S tensors (\"from_data not supported for scheme\")",
            "store": "ndarray builds only Q8F and Q8S tensors",
            "ragged": "ndarray needs whole u32 words in every row",
            "kept": "ndarray has no F16 or BF16 tensors (\"Unsupported dtype\")",
        },
    ),
    BurnBackend.wgpu: Capability(
        BurnBackend.wgpu,
        stores={PackedU32: frozenset(QuantValue), Native: frozenset(), PackedNative: frozenset()},
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
    ),
}


def load_problem(backend: BurnBackend, scheme: QuantScheme, shape: Sequence[int]) -> str | None:
    """Why `backend` cannot load a tensor of `shape` (as written) quantized with `scheme`, or None."""
    capability = CAPABILITIES[backend]
    loaded = capability.stores[type(scheme.store)]
    if scheme.value not in loaded:
        any_store = any(scheme.value in values for values in capability.stores.values())
        return capability.unsupported["store" if any_store else "value"]
    dtypes = [scheme.tensor, scheme.block and scheme.block.dtype]
    if any(dtype is not None and dtype not in capability.scale_dtypes for dtype in dtypes):
        return capability.unsupported["scale"]
    ragged = isinstance(scheme.store, PackedU32) and len(shape) > 0 and shape[-1] % scheme.num_quants() != 0
    if ragged and len(shape) > capability.ragged_rank:
        return capability.unsupported["ragged"]
    return None


def kept_problem(backend: BurnBackend, dtype: object) -> str | None:
    """Why `backend` cannot build a kept tensor of Burn dtype `dtype` (its serde form), or None."""
    capability = CAPABILITIES[backend]
    refused = isinstance(dtype, str) and dtype in capability.kept_refused  # Bool and QFloat are maps
    return capability.unsupported["kept"] if refused else None


# Same width first, then the most widely loaded scale dtypes: the first that loads is offered instead.
_SAME_WIDTH = {
    QuantValue.E4M3: (QuantValue.Q8S,), QuantValue.E5M2: (QuantValue.Q8S,), QuantValue.E2M1: (QuantValue.Q4S,),
    QuantValue.Q4F: (QuantValue.Q4S, QuantValue.Q8S), QuantValue.Q4S: (QuantValue.Q8S,),
    QuantValue.Q2F: (QuantValue.Q2S, QuantValue.Q8S), QuantValue.Q2S: (QuantValue.Q8S,),
    QuantValue.Q8F: (QuantValue.Q8S,),
}


def loads_instead(backend: BurnBackend, scheme: QuantScheme, shape: Sequence[int]) -> QuantScheme | None:
    """The scheme nearest to `scheme` that `backend` loads for `shape`: its store, then its scale dtypes,
    then its value changed, in that order of preference; None when nothing near loads."""
    values = (scheme.value, *_SAME_WIDTH.get(scheme.value, ()))
    for value in values:
        for store in (scheme.store, PackedU32(0), Native()):
            for dtype in (None, ScaleDtype.F16, ScaleDtype.F32):
                candidate = _with_scale_dtype(scheme.with_value(value).with_store(store), dtype)
                if candidate is not None and load_problem(backend, candidate, shape) is None:
                    return candidate
    return None


def _with_scale_dtype(scheme: QuantScheme, dtype: ScaleDtype | None) -> QuantScheme | None:
    """`scheme` with its innermost scale level stored as `dtype` (unchanged for None)."""
    if dtype is None:
        return scheme
    if scheme.block is not None:
        return scheme.per_block(scheme.block.size.dims(), dtype)
    return scheme.per_tensor(dtype)
