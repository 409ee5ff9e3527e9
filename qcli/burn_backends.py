"""Which Burn release and backend loads what: the capability table behind `--burn-version` and `--burn-backend`.

Measured, not read from code, by two sweeps: what Burn decodes, and what a model computes with it. The
harnesses in tests/burn (Burn 0.22.1), tests/burn-0.21 (Burn 0.21.0) and tests/burn-0.23 (Burn 0.23.0-pre.1, a
pre-release, written for only when `--burn-version 0.23` names it) built every value x store x scale dtype
x scale level, ragged and whole rows, and every kept dtype with `Tensor::from_data` on each backend and
dequantized it; "loads" means Burn's f32 values equal qcli's decode bit for bit. A pair that decodes
"computes" when a model's ops on the quantized weight (`Embedding`, `Linear` in Row and Col layout, a
matmul; the harness's `compute`) give what the same ops give on its `dequantize()` (bench/burn_sweep.py's
TOLERANCE), without a panic. tests/io/test_burn_backends.py runs both sweeps again and holds this table to
them (0.23's to its recorded runs: tests/io/test_burn_023_recorded.py); docs/output.md has the table in
prose, with the causes in Burn's source.

wgpu is Burn's `wgpu` feature (WGSL shaders), measured on Mesa's lavapipe Vulkan driver and on an NVIDIA GPU
through its Vulkan driver: for 0.22.1 (an H200) the same decodes, fewer computes (`ComputeFailure.devices`);
for 0.23 (an H100) the same decodes and computes.
cuda is Burn's `cuda` feature, measured for 0.21.0 only, on an NVIDIA H100 (tests/burn-0.21 built with
it): 0.22.1's and 0.23's cannot be built without downloading LLVM at build time (`RELEASE_PROBLEMS`). 0.23's
wgpu row is Burn's default build; built with burn-cubecl's `tile-kernels-only` it decodes the same and also
computes E4M3 and E5M2 (tests/data/burn/wgpu-0.23-tile beside flex-0.23 and wgpu-0.23, docs/output.md).
0.23 has no ndarray backend.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from qcli import BURN_VERSION
from qcli.errors import UsageError, one_of
from qcli.io.dtypes import DType, Plain, QFloat
from qcli.presets import DEFAULT_PRESET
from qcli.scheme import (
    Native,
    PackedNative,
    PackedU32,
    QuantScheme,
    QuantValue,
    ScaleDtype,
    inner_packed,
    packs_outer,
    symmetric_integer,
)

# Burn 0.21 reads a scheme's scales from the keys `param` and `level`, 0.22 from `tensor` and `block`, as
# 0.23.0-pre.1 does (cubecl-common 0.12.0-pre.1 `src/quant/scheme.rs`: the same fields and variants).
OLDER_SERDE_VERSIONS = frozenset({"0.21.0"})
# Releases Burn has published as pre-releases: written for only when `--burn-version` names one, and said so.
PRE_RELEASES = frozenset({"0.23.0-pre.1"})
# The releases whose backends read PackedU32(1) (Burn 0.23's `PackedOrder`; 0.22.1's CPU backends cannot)
OUTER_PACKING_VERSIONS = frozenset({"0.23.0-pre.1"})


class BurnBackend(StrEnum):
    """A Burn backend by the name of its cargo feature and `Device` constructor."""

    flex = "flex"
    ndarray = "ndarray"
    wgpu = "wgpu"
    cuda = "cuda"


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
    of the tensor; `unsupported` says, per failure, what Burn does, for the message; `computes` the
    decoded schemes a model's ops still fail with; `best_preset` the preset `--burn-backend` writes without
    `--scheme` (`default_preset`): the lowest-error 4-bit form measured computing there (bench/best_form.py),
    the 8-bit blocks where no 4-bit value loads; `col_linear` why a quantized Linear weight loaded as
    `LinearLayout::Col` (written `[out, in]`) computes wrong there, where it does.
    """

    stores: dict[type, frozenset[QuantValue]]
    scale_dtypes: frozenset[ScaleDtype]
    ragged_rank: int
    kept_refused: frozenset[Plain]
    unsupported: dict[str, str]
    block_axes: int = 5
    partial_blocks: bool = True
    two_level: bool = True
    computes: tuple[ComputeFailure, ...] = ()
    best_preset: str | None = None
    col_linear: str | None = None


@dataclass(frozen=True)
class ComputeFailure:
    """Schemes a backend decodes but a model's ops panic on or compute wrong with: those of `values` at
    one of `levels` ("tensor", "block" along one axis, "nd-block", "two-level") and, where `scale_dtypes`
    is given, only with block scales outside it; `devices`: where it was measured failing."""

    why: str
    values: frozenset[QuantValue]
    levels: frozenset[str]
    devices: frozenset[str]
    scale_dtypes: frozenset[ScaleDtype] | None = None

    def applies(self, scheme: QuantScheme) -> bool:
        spared = self.scale_dtypes is not None and (scheme.block is None or scheme.block.dtype in self.scale_dtypes)
        return scheme.value in self.values and level(scheme) in self.levels and not spared


def level(scheme: QuantScheme) -> str:
    """How `scheme` scales, in ComputeFailure's words."""
    if scheme.block is None:
        return "tensor"
    if scheme.is_two_level():
        return "two-level"
    return "nd-block" if sum(extent > 1 for extent in scheme.block.size.dims()) > 1 else "block"


# Where a failure was measured: flex and ndarray on the CPU; wgpu on Mesa's CPU Vulkan driver and on an
# NVIDIA GPU's; cuda on an NVIDIA GPU.
CPU, LAVAPIPE, NVIDIA, NVIDIA_CUDA = "cpu", "lavapipe", "nvidia-vulkan", "nvidia-cuda"
_ON_CPU = frozenset({CPU})
_BLOCKED = frozenset({"block", "nd-block", "two-level"})
_SUB_BYTE = frozenset(v for v in QuantValue if v.size_bits() < 8)
_FULL_RANGE = frozenset({QuantValue.Q8F, QuantValue.Q4F, QuantValue.Q2F})
# Burn's `Linear` reshapes (Row) or transposes (Col) its weight before the matmul, and flex requantizes a
# block-scaled tensor on every such layout op (burn-flex 0.22.1 src/ops/qtensor.rs:376) with its own
# max-abs scales (:67): qcli's values survive that only for a Symmetric value with one level of F32 or F16
# scales (a two-level weight's tensor scale is recomputed too).
_FLEX_WHY = ("flex requantizes a block-scaled weight when Linear reshapes or transposes it, with max-abs scales "
             "of its own, so Linear computes wrong (by up to 46 %) unless the value is Symmetric and the blocks "
             "one level of F32 or F16 scales")
_FLEX_COMPUTES = (
    ComputeFailure(_FLEX_WHY, _FULL_RANGE, _BLOCKED, _ON_CPU),
    ComputeFailure(_FLEX_WHY, frozenset(QuantValue), frozenset({"two-level"}), _ON_CPU),
    ComputeFailure(_FLEX_WHY, frozenset(QuantValue) - _FULL_RANGE, _BLOCKED, _ON_CPU,
                   scale_dtypes=frozenset({ScaleDtype.F32, ScaleDtype.F16})),
)
# A two-level weight is dequantized before wgpu's matmul (burn-cubecl 0.22.1 src/kernel/matmul/base.rs:44);
# every other one goes to a quantized matmul kernel chosen without autotune (`MatmulStrategy::Cube`).
_WGPU_COMPUTES = (
    ComputeFailure("wgpu cannot reshape a weight whose blocks span several axes, as Linear does (\"Reshape "
                   "of ND block-quantized tensor is not yet supported\")", frozenset(QuantValue),
                   frozenset({"nd-block"}), frozenset({LAVAPIPE, NVIDIA})),
    ComputeFailure("wgpu's quantized matmul fails on E4M3 and E5M2 weights (\"An error happened during "
                   "execution\")", frozenset({QuantValue.E4M3, QuantValue.E5M2}), frozenset({"tensor", "block"}),
                   frozenset({LAVAPIPE, NVIDIA})),
    ComputeFailure("wgpu's quantized matmul kernel for a 2-bit weight asks for more shared memory than a "
                   "device gives (\"Shared memory budget exceeded\": 81920 bytes of lavapipe's 32768, "
                   "294912 of an NVIDIA GPU's 49152)", frozenset({QuantValue.Q2S, QuantValue.Q2F}),
                   frozenset({"tensor", "block"}), frozenset({LAVAPIPE, NVIDIA})),
    ComputeFailure("wgpu's quantized matmul kernel for a 4-bit weight asks an NVIDIA GPU for 73728 bytes of "
                   "shared memory, which allows 49152 (\"Shared memory budget exceeded\"; lavapipe runs it)",
                   _SUB_BYTE - {QuantValue.Q2S, QuantValue.Q2F}, frozenset({"tensor", "block"}),
                   frozenset({NVIDIA})),
)

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
    computes=_FLEX_COMPUTES,
    best_preset="q4s-b32",
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
    best_preset="q8s-b32",  # no 4-bit value loads on ndarray
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
    computes=_WGPU_COMPUTES,
    best_preset="q4f-b32-global",
)
# Burn 0.23.0-pre.1 (a pre-release), measured on the CPU (flex) and on lavapipe (wgpu) as 0.22.1 was. flex
# decodes every case of the sweep: every value in every store, every scale dtype, padded rows at every rank
# (burn-std 0.23 `src/tensor/quantization/packing.rs` pads each line of any rank to whole words). It still
# requantizes a block-scaled weight on every layout op (burn-flex 0.23.0-pre.1 `src/ops/qtensor.rs:349`,
# `block_safe_layout_op`, with `quantize_dynamic`'s max-abs scales, `:64`), but now keeps a two-level weight's
# tensor scale: a Symmetric value or a minifloat in one or two levels of F32 or F16 scales computes right.
_FLEX_0_23_WHY = ("Burn 0.23's flex requantizes a block-scaled weight when Linear reshapes or transposes it, with "
                  "max-abs scales of its own, so Linear computes wrong (by up to 36 %) unless the value is "
                  "Symmetric or a minifloat and the block scales F32 or F16")
_FLEX_0_23 = Capability(
    stores={PackedU32: frozenset(QuantValue), Native: frozenset(QuantValue), PackedNative: frozenset(QuantValue)},
    scale_dtypes=frozenset(ScaleDtype),
    ragged_rank=8,  # any rank: the sweep's ragged tensors of rank 1 to 3 load, and the packing pads every line
    kept_refused=frozenset(),
    unsupported={},
    computes=(
        ComputeFailure(_FLEX_0_23_WHY, _FULL_RANGE, _BLOCKED, _ON_CPU),
        ComputeFailure(_FLEX_0_23_WHY, frozenset(QuantValue) - _FULL_RANGE, _BLOCKED, _ON_CPU,
                       scale_dtypes=frozenset({ScaleDtype.F32, ScaleDtype.F16})),
    ),
    best_preset="q4s-b32",
)
# Burn 0.23's wgpu decodes exactly what 0.22.1's does (all 274 cases alike). Its quantized matmul no longer
# runs out of shared memory for a 2-bit weight on lavapipe, nor for a 4-bit one on an NVIDIA GPU (burn-cubecl
# 0.23 picks cubek 0.4's kernels); E4M3 and E5M2 still fail at execution and a reshape of N-d blocks still
# panics. An NVIDIA H100 through its Vulkan driver decoded and computed exactly as lavapipe did.
_WGPU_0_23 = Capability(
    stores=_WGPU_0_22.stores,
    scale_dtypes=_WGPU_0_22.scale_dtypes,
    ragged_rank=0,
    kept_refused=frozenset(),
    unsupported=_WGPU_0_22.unsupported,
    computes=(
        ComputeFailure("Burn 0.23's wgpu cannot reshape a weight whose blocks span several axes, as Linear does "
                       "(\"Reshape of ND block-quantized tensor is not yet supported\")", frozenset(QuantValue),
                       frozenset({"nd-block"}), frozenset({LAVAPIPE, NVIDIA})),
        ComputeFailure("Burn 0.23's wgpu quantized matmul fails on E4M3 and E5M2 weights (\"An error happened "
                       "during execution\")", frozenset({QuantValue.E4M3, QuantValue.E5M2}),
                       frozenset({"tensor", "block"}), frozenset({LAVAPIPE, NVIDIA})),
    ),
    best_preset="q4f-b32-global",
)

# Burn 0.21's CPU backends read every scale as f32 and a block as a run of consecutive values.
_CPU_0_21 = {
    "scale": "Burn 0.21's CPU backends read every scale as an f32 (other scale dtypes panic)",
    "block": "Burn 0.21's CPU backends take a block as a run of consecutive values: a block over two "
             "axes decodes wrongly and one that overhangs the tensor's edge panics",
}

# Burn 0.21's cuda, measured on an NVIDIA H100 (driver 580.159.04, NVRTC 13.0): integer values in either
# store and Native minifloats with F32, F16 or BF16 scales decode; a model's ops compute as their decode but
# for a Col Linear and a 2-bit matmul.
_CUDA_0_21 = Capability(
    stores={PackedU32: _INTEGERS, Native: _EIGHT_BIT_INTEGERS | {QuantValue.E4M3, QuantValue.E5M2},
            PackedNative: _NONE},
    scale_dtypes=frozenset({ScaleDtype.F32, ScaleDtype.F16, ScaleDtype.BF16}),
    ragged_rank=0,
    kept_refused=frozenset(),
    unsupported={
        "value": "Burn 0.21's cuda decodes packed minifloats (E4M3, E5M2, E2M1) wrongly",
        "store": "Burn 0.21's cuda panics on PackedNative (\"attempt to subtract with overflow\")",
        "scale": "Burn 0.21's cuda reads F32, F16 and BF16 scales only: UE4M3 and UE8M0 fail (\"Error while "
                 "reading data\")",
        "ragged": "Burn 0.21's cuda panics on a row that is not a whole number of u32 words (\"Can't store in u32\")",
    },
    two_level=False,
    computes=(
        ComputeFailure("Burn 0.21's cuda panics in the matmul of a 2-bit weight (\"Invalid vector size\")",
                       frozenset({QuantValue.Q2S, QuantValue.Q2F}), frozenset({"tensor", "block", "nd-block"}),
                       frozenset({NVIDIA_CUDA})),
    ),
    best_preset="q4f-b32",
    col_linear="Burn 0.21's cuda computes a quantized Linear whose weight loads as LinearLayout::Col (written "
               "[out, in]) wrong, by up to 10^9 % of its largest output, with no error",
)

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
        BurnBackend.cuda: _CUDA_0_21,
    },
    "0.23.0-pre.1": {BurnBackend.flex: _FLEX_0_23, BurnBackend.wgpu: _WGPU_0_23},
}
BURN_VERSIONS = tuple(CAPABILITIES)
# Why a release's table lacks a backend: what stopped it being measured.
RELEASE_PROBLEMS = {
    ("0.23.0-pre.1", BurnBackend.ndarray): "Burn 0.23 has no ndarray backend: its burn crate dropped the "
    "`ndarray` feature for flex, Burn's CPU backend",
    ("0.23.0-pre.1", BurnBackend.cuda): "Burn 0.23.0-pre.1's cuda backend is not measured: its `cuda` feature "
    "builds cubecl-llvm, whose build script downloads LLVM from outside the package registries, as 0.22.1's does",
    ("0.22.1", BurnBackend.cuda): "Burn 0.22.1's cuda backend is not measured: its `cuda` feature builds "
    "cubecl-llvm, whose build script (tracel-llvm-bundler 23.1.0-4) downloads LLVM from outside the package "
    "registries, which qcli's test machines cannot reach (docs/output.md)",
}


def backends(version: str = BURN_VERSION) -> tuple[BurnBackend, ...]:
    """The backends Burn `version`'s table was measured on."""
    return tuple(CAPABILITIES[version])


def release_problem(backend: BurnBackend, version: str) -> str | None:
    """Why qcli knows nothing of `backend` on Burn `version`, or None where it was measured."""
    return None if backend in CAPABILITIES[version] else RELEASE_PROBLEMS[(version, backend)]
assert BURN_VERSIONS[0] == BURN_VERSION, "the first table is the release qcli targets by default"


def resolve_backend(name: str | None) -> BurnBackend | None:
    """The Burn backend `--burn-backend` names, or None for the common backends."""
    if name is None:
        return None
    return BurnBackend(one_of(name, list(BurnBackend), "--burn-backend"))


def short_version(version: str) -> str:
    """The `--burn-version` that names `version`: its major and minor (`0.21` for 0.21.0, `0.23` for
    0.23.0-pre.1)."""
    return ".".join(version.split(".")[:2])


def version_label(version: str) -> str:
    """`version` as help and hints name it: a pre-release says so."""
    return f"{version} (pre-release)" if version in PRE_RELEASES else version


def resolve_version(name: str | None) -> str:
    """The Burn release `--burn-version` names (`0.21` or `0.21.0`; `0.23` or `0.23.0-pre.1` for the
    pre-release), or the newest stable one qcli targets."""
    if name is None:
        return BURN_VERSION
    chosen = [v for v in BURN_VERSIONS if name.strip() in (v, short_version(v))]
    if not chosen:
        raise UsageError(f"Burn {name!r} is not a release qcli writes for",
                         hint=f"use one of {', '.join(map(version_label, BURN_VERSIONS))} (the default is "
                         f"{BURN_VERSION})")
    return chosen[0]


def require_measured(backend: BurnBackend | None, version: str) -> None:
    """UsageError where `--burn-backend` names a backend Burn `version`'s table was not measured on."""
    why = None if backend is None else release_problem(backend, version)
    if why is not None:
        measured = [v for v in BURN_VERSIONS if backend in CAPABILITIES[v]]
        instead = ("--burn-backend flex, the CPU backend that replaced it" if backend is BurnBackend.ndarray else
                   "--burn-backend wgpu, whose best form computes on an NVIDIA GPU")
        raise UsageError(why, hint=f"--burn-version {short_version(measured[0])} writes for the release qcli "
                         f"measured it on, or {instead}")


def default_preset(backend: BurnBackend | None, version: str = BURN_VERSION) -> str:
    """The preset a run for `backend` of Burn `version` quantizes with when no `--scheme` names one: the
    lowest-error form measured computing there (`Capability.best_preset`), else qcli's default."""
    best = None if backend is None else CAPABILITIES[version][backend].best_preset
    return best or DEFAULT_PRESET


def load_problem(backend: BurnBackend, scheme: QuantScheme, shape: Sequence[int],
                 version: str = BURN_VERSION) -> str | None:
    """Why a model on `backend` of Burn `version` cannot use a tensor of `shape` (as written) quantized
    with `scheme`: Burn does not decode it, or computes wrong or panics with it; or None. An empty `shape`
    stands for a shape not known yet: only the scheme is checked."""
    return decode_problem(backend, scheme, shape, version) or compute_problem(backend, scheme, version)


def compute_problem(backend: BurnBackend, scheme: QuantScheme, version: str = BURN_VERSION) -> str | None:
    """Why a model's ops (`Embedding`, `Linear`, matmul) on `backend` of Burn `version` compute wrong or
    panic on a weight quantized with `scheme` that Burn decodes, or None. Burn 0.21 was not measured."""
    failures = compute_failures(backend, scheme, version)
    return failures[0].why if failures else None


def compute_failures(backend: BurnBackend, scheme: QuantScheme, version: str = BURN_VERSION
                     ) -> list[ComputeFailure]:
    """Every measured way a model on `backend` fails with a weight quantized with `scheme`."""
    return [failure for failure in CAPABILITIES[version][backend].computes if failure.applies(scheme)]


def decode_problem(backend: BurnBackend, scheme: QuantScheme, shape: Sequence[int],
                   version: str = BURN_VERSION) -> str | None:
    """Why `backend` of Burn `version` cannot decode a tensor of `shape` (as written) quantized with
    `scheme` to qcli's values, or None (see `load_problem`)."""
    return _decode_problem(backend, scheme, tuple(shape), version)


@functools.lru_cache(maxsize=1 << 12)  # asked of every tensor for each backend; a model has a few shapes
def _decode_problem(backend: BurnBackend, scheme: QuantScheme, shape: tuple[int, ...], version: str) -> str | None:
    if packs_outer(scheme):  # measured where it decodes as its inner-packed form on the transpose (tests/io)
        return _decode_problem(backend, inner_packed(scheme), shape[::-1], version)
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
    if packs_outer(scheme) and version not in OUTER_PACKING_VERSIONS:
        return (f"Burn {version}'s CPU backends cannot split values packed along an outer axis ({scheme.store}); "
                f"Burn {' and '.join(sorted(OUTER_PACKING_VERSIONS))} reads them")
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
    # Same width first, then the most widely loaded scale dtypes, then a tensor level over the blocks (which
    # wgpu dequantizes before its matmul): the first that loads and computes is offered instead.
    for value in (scheme.value, *_values_instead(scheme.value)):
        for store in (scheme.store, PackedU32(0), Native()):
            for dtype in (None, ScaleDtype.F16, ScaleDtype.F32):
                one_level = _with_scale_dtype(scheme.with_value(value).with_store(store), dtype)
                for candidate in (one_level, _two_level(one_level, version)):
                    if candidate is not None and load_problem(backend, candidate, shape, version) is None:
                        return candidate
    return None


def _two_level(scheme: QuantScheme, version: str) -> QuantScheme | None:
    """`scheme`'s blocks under an F32 tensor scale, where it has blocks and one level, and `version` holds
    two."""
    if scheme.block is None or scheme.is_two_level() or hold_problem(scheme.per_tensor(ScaleDtype.F32), version):
        return None
    return scheme.per_tensor(ScaleDtype.F32)


def _with_scale_dtype(scheme: QuantScheme, dtype: ScaleDtype | None) -> QuantScheme:
    """`scheme` with its innermost scale level stored as `dtype` (unchanged for None)."""
    if dtype is None:
        return scheme
    if scheme.block is not None:
        return scheme.per_block(scheme.block.size.dims(), dtype)
    return scheme.per_tensor(dtype)
