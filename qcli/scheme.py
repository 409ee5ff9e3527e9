"""Burn's quantization vocabulary: how a tensor is quantized, in Burn's own names and serde form.

Mirrors `src/quant/scheme.rs` of cubecl-common 0.11.3 (the one Burn 0.22.1 uses), so a
line of Rust and a line of Python read alike: `QuantScheme().with_value(QuantValue.Q4S).per_block([32],
ScaleDtype.F16)`. The serde form (`to_serde`/`from_serde`) is what burnpack stores as
`DType::QFloat(QuantScheme)`; `accept_problems` lists every reason Burn would refuse a scheme.

This module imports nothing heavy: the CLI validates recipes with it before torch is loaded.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from qcli.errors import SchemeError, one_of
from qcli.problem import Kind, Problem

F32_MIN_POSITIVE = 1.1754943508222875e-38  # f32::MIN_POSITIVE, 2^-126


def f32_bits(x: float) -> int:
    """The bit pattern of `x` as an f32, as a signed 32-bit integer (how the codec and the kernels view it)."""
    return struct.unpack("<i", struct.pack("<f", x))[0]


@dataclass(frozen=True)
class MinifloatFormat:
    """A sign bit, `exponent_bits`, `mantissa_bits`, exponent `bias`; `max` is the largest finite value.

    `top` says what the top binade holds: "ieee" (inf and NaN), "fn" (finite, but all ones is NaN), or
    "finite".
    """

    exponent_bits: int
    mantissa_bits: int
    bias: int
    max: float
    top: str

    @property
    def min_normal_f32_bits(self) -> int:
        """The f32 bit pattern of the smallest normal value, 2^(1 - bias): exponent field 127 + 1 - bias,
        no mantissa."""
        return (128 - self.bias) << 23

    @property
    def subnormal_spacing(self) -> float:
        return 2.0 ** (1 - self.bias - self.mantissa_bits)

    @property
    def sign_bit(self) -> int:
        return 1 << (self.exponent_bits + self.mantissa_bits)

    @property
    def widest_gap(self) -> float:
        """The spacing of the top binade, the widest between neighbouring values (32 for E4M3's 416..448)."""
        return 2.0 ** (math.floor(math.log2(self.max)) - self.mantissa_bits)


E4M3 = MinifloatFormat(exponent_bits=4, mantissa_bits=3, bias=7, max=448.0, top="fn")  # OCP e4m3fn
E5M2 = MinifloatFormat(exponent_bits=5, mantissa_bits=2, bias=15, max=57344.0, top="ieee")
E2M1 = MinifloatFormat(exponent_bits=2, mantissa_bits=1, bias=1, max=6.0, top="finite")
F16 = MinifloatFormat(exponent_bits=5, mantissa_bits=10, bias=15, max=65504.0, top="ieee")  # IEEE binary16


@dataclass(frozen=True)
class ValueTraits:
    """Everything qcli knows of one value type (`QuantValue`): its width, its clamp range, and for a
    minifloat its format; `per_native` values share one native element (2 for E2M1's `e2m1x2`). The codec,
    the kernels and the error bound read these, so a new value type is one row of `VALUE_TRAITS`."""

    bits: int
    range: tuple[float, float]
    minifloat: MinifloatFormat | None = None
    per_native: int = 1


class QuantValue(StrEnum):
    """The logical type of quantized values, independent of how they are stored."""

    Q8F = "Q8F"
    E5M2 = "E5M2"
    E4M3 = "E4M3"
    Q4F = "Q4F"
    E2M1 = "E2M1"
    Q2F = "Q2F"
    Q8S = "Q8S"
    Q4S = "Q4S"
    Q2S = "Q2S"

    @property
    def traits(self) -> ValueTraits:
        return VALUE_TRAITS[self]

    def size_bits(self) -> int:
        """Bits of one value."""
        return self.traits.bits

    def range(self) -> tuple[float, float]:
        """The clamp range `(a, b)`; "F" integers use the full two's-complement range."""
        return self.traits.range

    def half_range(self) -> float:
        """`(b - a) / 2`, exact in f32: the divisor that turns a magnitude into a scale."""
        a, b = self.range()
        return (b - a) / 2

    def is_minifloat(self) -> bool:
        """Whether the stored field is a float code (E4M3, E5M2, E2M1) rather than an integer."""
        return self.traits.minifloat is not None

    def native_packing(self) -> int:
        """How many values one native element holds: 2 for E2M1 (`e2m1x2`), 1 otherwise."""
        return self.traits.per_native

    def half_step(self) -> float:
        """Half the widest gap between neighbouring values of the grid, in units of the scale: integers
        round to the nearest whole step; a minifloat's widest gap is its top binade's."""
        return 0.5 if self.traits.minifloat is None else self.traits.minifloat.widest_gap / 2


VALUE_TRAITS = {
    QuantValue.Q8F: ValueTraits(8, (-128.0, 127.0)),
    QuantValue.Q8S: ValueTraits(8, (-127.0, 127.0)),
    QuantValue.Q4F: ValueTraits(4, (-8.0, 7.0)),
    QuantValue.Q4S: ValueTraits(4, (-7.0, 7.0)),
    QuantValue.Q2F: ValueTraits(2, (-2.0, 1.0)),
    QuantValue.Q2S: ValueTraits(2, (-1.0, 1.0)),
    QuantValue.E4M3: ValueTraits(8, (-E4M3.max, E4M3.max), E4M3),
    QuantValue.E5M2: ValueTraits(8, (-E5M2.max, E5M2.max), E5M2),
    QuantValue.E2M1: ValueTraits(4, (-E2M1.max, E2M1.max), E2M1, per_native=2),
}


@dataclass(frozen=True)
class Native:
    """One storage element per value; Burn accounts a sub-byte value as a whole byte."""

    def size_bits(self, value: QuantValue) -> int:
        return value.size_bits()

    def to_serde(self) -> str:
        return "Native"

    def __str__(self) -> str:
        return "Native"


@dataclass(frozen=True)
class PackedNative:
    """`native_packing` values in one native element (`e2m1x2` for E2M1); `dim` counts from the innermost axis."""

    dim: int = 0

    def size_bits(self, value: QuantValue) -> int:
        return value.size_bits() * value.native_packing()

    def to_serde(self) -> dict[str, int]:
        return {"PackedNative": self.dim}

    def __str__(self) -> str:
        return f"PackedNative({self.dim})"


@dataclass(frozen=True)
class PackedU32:
    """`32 / bits` values in one little-endian u32, first value in the least significant bits.

    `dim` is the packed axis counted from the innermost one: 0 packs the last axis.
    """

    dim: int = 0

    def size_bits(self, value: QuantValue) -> int:
        return 32

    def to_serde(self) -> dict[str, int]:
        return {"PackedU32": self.dim}

    def __str__(self) -> str:
        return f"PackedU32({self.dim})"


QuantStore = Native | PackedNative | PackedU32


class QuantMode(StrEnum):
    """How a stored field becomes a value: scaled directly, or as an index into a table (codebook)."""

    Symmetric = "Symmetric"
    Lookup = "Lookup"


class ScaleDtype(StrEnum):
    """The type a scale level is stored in."""

    F32 = "F32"
    F16 = "F16"
    BF16 = "BF16"
    UE8M0 = "UE8M0"
    UE4M3 = "UE4M3"

    @property
    def traits(self) -> ScaleTraits:
        return SCALE_TRAITS[self]

    def scale_size(self) -> int:
        """Bytes of one stored scale."""
        return self.traits.bytes

    def max_representable(self) -> float:
        """The largest finite scale this dtype stores; `round_up` saturates there."""
        return self.traits.max


@dataclass(frozen=True)
class ScaleTraits:
    """Everything qcli knows of one scale dtype (`ScaleDtype`): its width in bytes, its largest value,
    whether it stores a sign (`signed`: the scale search may then store a negative scale), and the grid
    cubecl's `round_up` puts a scale on, as f32 data. The codec, the kernels and the error bound
    read these, so a new scale dtype is one row of `SCALE_TRAITS`.

    A scale dtype is either f32 cut short, sharing f32's exponent (F32, BF16, UE8M0): its grid is the f32
    values whose low `23 - mantissa_bits` bits are zero, and its stored bits are an f32's top bits; or a
    `minifloat` with an exponent of its own (F16, UE4M3): below the format's smallest normal its grid is
    the subnormal spacing, and its stored bits are the format's code. `floor` is the value of code 0
    where that is not zero (UE8M0's 2^-127, subnormal in f32): every smaller scale rounds up to it.
    """

    bytes: int
    max: float
    mantissa_bits: int
    minifloat: MinifloatFormat | None = None
    floor: float | None = None
    signed: bool = field(kw_only=True)

    @property
    def step_bits(self) -> int:
        """log2 of the grid's step on f32 bit patterns (0 for F32, whose grid is every f32); also how far
        an f32's bits shift down to a cut-short dtype's stored bits."""
        return 23 - self.mantissa_bits

    @property
    def smallest(self) -> float:
        """The smallest positive value of the grid: `round_up` gives it to every positive scale below."""
        if self.minifloat is not None:
            return self.minifloat.subnormal_spacing
        if self.floor is not None:
            return self.floor
        return 2.0 ** (-126 - self.mantissa_bits)  # f32's smallest subnormal, cut short


SCALE_TRAITS = {
    ScaleDtype.F32: ScaleTraits(4, 3.4028234663852886e38, 23, signed=True),
    ScaleDtype.F16: ScaleTraits(2, F16.max, F16.mantissa_bits, F16, signed=True),
    ScaleDtype.BF16: ScaleTraits(2, 3.3895313892515355e38, 7, signed=True),  # bf16::MAX, bits 0x7F7F
    ScaleDtype.UE8M0: ScaleTraits(1, 2.0**127, 0, floor=2.0**-127, signed=False),
    ScaleDtype.UE4M3: ScaleTraits(1, E4M3.max, E4M3.mantissa_bits, E4M3, signed=False),  # E4M3's positive codes
}


class Calibration(StrEnum):
    """How the range a scale must cover is measured from the data."""

    MinMax = "MinMax"
    AbsMean = "AbsMean"
    Mse = "Mse"  # qcli's own: MinMax's range, then each block's scale searched (qcli.codec.search)
    # GPTQ on calibration activations: each Linear's weights rounded in order, the error carried onto the
    # columns not yet rounded (qcli.calibrate.gptq); only a calibration run produces it, never the codec
    Gptq = "Gptq"


# What the codec computes from a tensor's weights alone; GPTQ needs a calibration run's activations.
WEIGHT_CALIBRATIONS = (Calibration.MinMax, Calibration.AbsMean, Calibration.Mse)


def resolve_calibration(name: str) -> Calibration:
    """A calibration by name, any case (`mse`, `MinMax`)."""
    by_name = {member.name.lower(): member for member in Calibration}
    return by_name[one_of(name, list(by_name), "--calibration")]


MAX_BLOCK_DIMS = 5
MAX_BLOCK_EXTENT = 255  # Burn stores each block extent as a u8 of at least 1 (`BlockSize`)


@dataclass(frozen=True)
class BlockSize:
    """A block of values sharing one scale, right-aligned on the tensor's trailing axes.

    Stored as Burn stores it: `storage` holds the extents after leading 1s are dropped, the unused
    slots filled with 1, and `len` counts the extents kept. Equality compares the whole storage, so
    only the canonical form built by `new` compares equal to the block Burn builds.
    """

    storage: tuple[int, ...]
    len: int

    @staticmethod
    def new(dims: int | Sequence[int]) -> BlockSize:
        """The canonical block for `dims` (`[1, 32]` and `[32]` are the same block)."""
        dims = [dims] if isinstance(dims, int) else list(dims)
        if len(dims) > MAX_BLOCK_DIMS and any(d != 1 for d in dims[: len(dims) - MAX_BLOCK_DIMS]):
            raise SchemeError(
                f"a block has at most {MAX_BLOCK_DIMS} axes, got {dims}",
                hint="Burn's BlockSize stores 5 extents; use a block over the trailing axes, e.g. [32] or [4, 32]",
            )
        for d in dims:
            if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= MAX_BLOCK_EXTENT:
                raise SchemeError(
                    f"block extent {d!r} in {dims} is not between 1 and {MAX_BLOCK_EXTENT}",
                    hint="Burn stores each block extent as a u8 of at least 1; use e.g. [32] or [16]",
                )
        while dims and dims[0] == 1:
            dims.pop(0)
        return BlockSize(tuple(dims) + (1,) * (MAX_BLOCK_DIMS - len(dims)), len(dims))

    def dims(self) -> list[int]:
        """The kept extents, outermost first."""
        return list(self.storage[: self.len])

    def to_dim_vec(self, rank: int) -> list[int]:
        """The block as `rank` extents, left-padded with 1s."""
        dims = self.dims()
        return [1] * (rank - len(dims)) + dims if rank >= len(dims) else dims[len(dims) - rank :]

    def num_blocks(self, shape: Sequence[int]) -> list[int]:
        """Blocks per axis; a partial block still takes a scale."""
        return [math.ceil(d / b) for d, b in zip(shape, self.to_dim_vec(len(shape)), strict=True)]

    def to_serde(self) -> dict:
        return {"storage": list(self.storage), "len": self.len}

    def __str__(self) -> str:
        return "[" + ", ".join(map(str, self.dims())) + "]"


@dataclass(frozen=True)
class BlockScale:
    """The per-block scale level of a `QuantScheme`: one scale per block of values."""

    size: BlockSize
    dtype: ScaleDtype

    def to_serde(self) -> dict:
        return {"size": self.size.to_serde(), "dtype": self.dtype.value}


@dataclass(frozen=True)
class QuantScheme:
    """How a tensor is quantized: value type, storage, mode, and up to two scale levels.

    `tensor` is the per-tensor level and `block` the per-block level. A scheme with neither resolves to
    a per-tensor F32 scale (`tensor_scale()`), but the field stays `None`, as in Burn, so
    `QuantScheme() != QuantScheme().per_tensor(ScaleDtype.F32)`. With both, the scheme is two-level:
    block scales are stored relative to an f32 global scale.
    """

    value: QuantValue = QuantValue.Q8F
    store: QuantStore = field(default_factory=PackedU32)
    mode: QuantMode = QuantMode.Symmetric
    tensor: ScaleDtype | None = None
    block: BlockScale | None = None

    def __hash__(self) -> int:
        """The fields' hash, as a frozen dataclass's, kept once taken: planning looks every tensor's scheme
        up in caches (`layout.quantized_data_len`, `plan.shape_problem`), and hashing the nested fields
        each time was most of the cost of planning 200k tensors."""
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((self.value, self.store, self.mode, self.tensor, self.block))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __getstate__(self) -> dict:
        """A copy or pickle without the kept hash (str enums hash differently in another process)."""
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def with_value(self, value: QuantValue) -> QuantScheme:
        return replace(self, value=value)

    def with_store(self, store: QuantStore) -> QuantScheme:
        return replace(self, store=store)

    def with_mode(self, mode: QuantMode) -> QuantScheme:
        return replace(self, mode=mode)

    def per_tensor(self, dtype: ScaleDtype) -> QuantScheme:
        return replace(self, tensor=dtype)

    def per_block(self, block: int | Sequence[int], dtype: ScaleDtype) -> QuantScheme:
        return replace(self, block=BlockScale(BlockSize.new(block), dtype))

    @staticmethod
    def nvfp4() -> QuantScheme:
        """Burn's NVFP4 preset: E2M1 pairs, blocks of 16 with UE4M3 scales under an f32 global."""
        return (
            QuantScheme()
            .with_value(QuantValue.E2M1)
            .with_store(PackedNative(0))
            .per_block([16], ScaleDtype.UE4M3)
            .per_tensor(ScaleDtype.F32)
        )

    def tensor_scale(self) -> ScaleDtype | None:
        """The per-tensor level; a scheme with no level at all resolves to F32."""
        if self.tensor is None and self.block is None:
            return ScaleDtype.F32
        return self.tensor

    def block_scale(self) -> BlockScale | None:
        return self.block

    def scale_dtype(self) -> ScaleDtype:
        """The innermost level's dtype: the block's, else the tensor's, else F32."""
        if self.block is not None:
            return self.block.dtype
        return self.tensor or ScaleDtype.F32

    def num_levels(self) -> int:
        return 2 if self.is_two_level() else 1

    def is_two_level(self) -> bool:
        return self.block is not None and self.tensor is not None

    def size_bits_stored(self) -> int:
        """Bits of one storage element (32 for PackedU32)."""
        return self.store.size_bits(self.value)

    def num_quants(self) -> int:
        """Values per storage element."""
        return self.size_bits_stored() // self.value.size_bits()

    def to_serde(self, *, with_0_21_keys: bool = False) -> dict:
        """Burn's serde form: all five keys, in declaration order. `with_0_21_keys` adds the keys Burn 0.21
        reads instead of `tensor` and `block` (`param`, the innermost scale dtype, and `level`), which
        0.22 ignores: both releases read such a map (one level only; 0.21 has no two-level form)."""
        serde = {
            "value": self.value.value,
            "store": self.store.to_serde(),
            "mode": self.mode.value,
            "tensor": None if self.tensor is None else self.tensor.value,
            "block": None if self.block is None else self.block.to_serde(),
        }
        if with_0_21_keys:
            assert not self.is_two_level(), f"Burn 0.21 has no two-level scheme: {self}"
            serde["param"] = self.scale_dtype().value
            serde["level"] = "Tensor" if self.block is None else {"Block": self.block.size.to_serde()}
        return serde

    @staticmethod
    def from_serde(obj: object) -> QuantScheme:
        """Parse Burn's serde form; raises `SchemeError` naming what is malformed."""
        try:
            return _scheme_from_serde(obj)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SchemeError(
                f"not a QuantScheme in Burn's serde form: {obj!r} ({exc})",
                hint="the scheme must be a map with value, store, mode, tensor and block",
            ) from None

    def __str__(self) -> str:
        """A readable one-line form, e.g. `Q4S PackedU32(0) block [32] F16`."""
        parts = [self.value.value, str(self.store)]
        if self.mode is not QuantMode.Symmetric:
            parts.append(self.mode.value)
        if self.block is not None:
            parts.append(f"block {self.block.size} {self.block.dtype.value}")
        if self.tensor is not None:
            parts.append(f"{'global' if self.block is not None else 'tensor'} {self.tensor.value}")
        elif self.block is None:
            parts.append("tensor F32")
        return " ".join(parts)


def _scheme_from_serde(obj: object) -> QuantScheme:
    if not isinstance(obj, dict):
        raise TypeError("expected a map")
    store = obj["store"]
    if store == "Native":
        parsed_store: QuantStore = Native()
    elif isinstance(store, dict) and len(store) == 1:
        ((kind, dim),) = store.items()
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
            raise ValueError(f"store dim {dim!r}")
        packed: dict[str, type[PackedU32 | PackedNative]] = {"PackedU32": PackedU32, "PackedNative": PackedNative}
        parsed_store = packed[kind](dim)
    else:
        raise ValueError(f"store {store!r}")
    tensor = obj.get("tensor")
    block = obj.get("block")
    parsed_block = None
    if block is not None:
        size = block["size"]
        storage, length = size["storage"], size["len"]
        if (
            not isinstance(storage, list)
            or len(storage) != MAX_BLOCK_DIMS
            or not all(isinstance(s, int) and not isinstance(s, bool) and 1 <= s <= MAX_BLOCK_EXTENT for s in storage)
            or not isinstance(length, int)
            or not 0 <= length <= MAX_BLOCK_DIMS
        ):
            raise ValueError(f"block size {size!r}")
        parsed_block = BlockScale(BlockSize(tuple(storage), length), ScaleDtype(block["dtype"]))
    return QuantScheme(
        value=QuantValue(obj["value"]),
        store=parsed_store,
        mode=QuantMode(obj["mode"]),
        tensor=None if tensor is None else ScaleDtype(tensor),
        block=parsed_block,
    )


LOOKUP_WHY = (
    "Burn cannot build a lookup-quantized tensor from data: "
    "lookup quantization does not travel as a QFloat tensor (QuantScheme has no slot for the table)"
)
LOOKUP_PANICS_AT = "burn-cubecl 0.22.1 src/ops/qtensor.rs:287"  # where a Lookup tensor given to Burn panics


def accept_problems(scheme: QuantScheme, calibration: Calibration = Calibration.MinMax, *,
                    quantizer: bool = True) -> list[Problem]:
    """Every reason Burn would refuse `scheme` whichever backend loads it (burn-std 0.22.1 `quantizable`,
    the stores' own checks), each with what would work instead; empty when it is accepted. What one
    backend loads is `qcli.burn_backends`'.

    `quantizer` False leaves out the rules only Burn's own quantizer applies: Burn loads such a payload,
    and its bytes are still well defined (the spec's worked example packs Q4S in blocks of 4), but Burn
    would not have produced it.
    """
    problems: list[Problem] = []
    value, store = scheme.value, scheme.store
    bits = value.size_bits()
    if scheme.mode is QuantMode.Lookup:
        problems.append(Problem(Kind.lookup, f"mode Lookup: {LOOKUP_WHY}", same_width_instead(bits)))
    # Every scale dtype has a round-up rule at Burn 0.22.1 (cubecl 0.11.3), UE8M0 included, so none is
    # refused for its own sake; UE8M0 block scales under a global are refused by the f16 rule below.
    if scheme.is_two_level():
        assert scheme.block is not None and scheme.tensor is not None
        if scheme.block.dtype.max_representable() > F16.max:
            problems.append(
                Problem(
                    Kind.scheme,
                    f"a two-level scheme stores its block scales relative to the global scale, so they must be no "
                    f"wider than f16; got {scheme.block.dtype.value}",
                    "use F16 or UE4M3 block scales under an F32 global, or drop tensor_scale for one level",
                )
            )
        if scheme.tensor is not ScaleDtype.F32:
            problems.append(
                Problem(
                    Kind.scheme,
                    f"a two-level scheme stores its per-tensor scale as f32, got {scheme.tensor.value}",
                    "set tensor_scale = \"F32\"",
                )
            )
        if calibration is Calibration.AbsMean:
            problems.append(
                Problem(
                    Kind.scheme,
                    "AbsMean calibration has no two-level form",
                    "use MinMax calibration, or drop tensor_scale for a one-level AbsMean scheme",
                )
            )
    if isinstance(store, Native) and bits < 8:
        problems.append(
            Problem(
                Kind.scheme,
                f"Can't store native sub-byte values: {value.value} is {bits} bits",
                "use store PackedU32" + (f" (or PackedNative for {value.value})" if value.native_packing() > 1 else ""),
            )
        )
    if isinstance(store, PackedNative) and value.native_packing() == 1:
        packing = ", ".join(f"{v.value} packs natively, as {v.value.lower()}x{v.native_packing()}"
                            for v in QuantValue if v.native_packing() > 1)
        problems.append(
            Problem(
                Kind.scheme,
                f"{value.value} doesn't support native packing (only {packing})",
                "use store PackedU32" + (" or Native" if bits == 8 else ""),
            )
        )
    # PackedU32(1): which Burn release reads it is `qcli.burn_backends.hold_problem`'s to say
    if isinstance(store, (PackedU32, PackedNative)) and store.dim != 0 and not packs_outer(scheme):
        problems.append(
            Problem(
                Kind.scheme,
                f"{store} packs along an outer axis, which Burn's CPU backends cannot split back into values",
                f"use {type(store).__name__}(0), or PackedU32(1) for Burn 0.23; to pack along another axis, "
                "transpose the tensor (transpose = true)",
            )
        )
    if quantizer and isinstance(store, PackedU32) and scheme.block is not None:
        packed = scheme.block.size.to_dim_vec(store.dim + 1)[0]  # the block's extent along the packed axis
        per_word = 32 // bits
        if packed % per_word:
            axis, example = ("innermost", f"[{max(32, per_word)}]") if store.dim == 0 else \
                ("outer-axis", f"[{max(32, per_word)}, 1]")
            problems.append(
                Problem(
                    Kind.scheme,
                    f"{store} holds {per_word} {value.value} values per word, so a block's {axis} extent must "
                    f"be a multiple of {per_word}; got {scheme.block.size}",
                    f"use an {axis} block extent that is a multiple of {per_word}, e.g. {example}",
                )
            )
    return problems


def packs_outer(scheme: QuantScheme) -> bool:
    """Whether `scheme` packs a 2-D tensor's values along its first axis (PackedU32(1)), as Burn 0.23's
    packed-weight matmul reads a Row-layout Linear's weight when its blocks run along that axis too."""
    return isinstance(scheme.store, PackedU32) and scheme.store.dim == 1


def inner_packed(scheme: QuantScheme) -> QuantScheme:
    """The scheme whose payload on a 2-D tensor's transpose is, byte for byte, `scheme`'s PackedU32(1)
    payload on the tensor: Burn 0.23 stores such a tensor with its two axes swapped, packed along the new
    last axis, its block scales in that order too (burn-std 0.23.0-pre.1
    `src/tensor/quantization/packing.rs`, `PackedOrder`), so the store becomes PackedU32(0) and a block
    `[rows, columns]` becomes `[columns, rows]`."""
    assert packs_outer(scheme), scheme
    inner = scheme.with_store(PackedU32(0))
    if scheme.block is None:
        return inner
    dims = scheme.block.size.to_dim_vec(max(2, scheme.block.size.len))
    dims[-2], dims[-1] = dims[-1], dims[-2]
    return replace(inner, block=replace(scheme.block, size=BlockSize.new(dims)))


def symmetric_integer(bits: int) -> QuantValue:
    """The integer value type of `bits` whose range is symmetric around 0 (Q8S, Q4S, Q2S)."""
    return next(v for v in QuantValue
                if not v.is_minifloat() and v.size_bits() == bits and -v.range()[0] == v.range()[1])


def same_width_instead(bits: int) -> str:
    """What to use instead of a mode Burn refuses (Lookup, a zero point): a Symmetric scheme of `bits`."""
    return (f"use a Symmetric scheme of the same width (e.g. {symmetric_integer(bits)} with block [32] and F16 "
            "scales), or keep the tensor unquantized (keep = true)")


def check_accepted(scheme: QuantScheme, calibration: Calibration = Calibration.MinMax) -> None:
    """Raise `SchemeError` for a scheme Burn cannot load, or the encoders do not make (PackedU32(1), made
    as its inner-packed form), with the first reason and the alternative.

    Rules only Burn's own quantizer applies are left to the plan, which reports every problem of
    `accept_problems`.
    """
    problems = accept_problems(scheme, calibration, quantizer=False)
    if problems:
        raise SchemeError(f"{scheme}: {problems[0].message}", hint=problems[0].hint)
    if packs_outer(scheme):  # the plan's encoding of such an entry is its inner-packed form (plan.entries)
        raise SchemeError(f"{scheme}: the encoders pack along the last axis",
                          hint="encode the transposed tensor with `inner_packed(scheme)`: the same bytes")
