"""The plan's data: one `Decision` per tensor, the `PlanEntry` it makes with what it writes (dtype, shape,
bytes, host memory), the `Totals` over a plan, and the `Plan` with every problem found.

What decides each tensor is `qcli.plan.decisions`; what finds the problems, `qcli.plan.checks`.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from typing import cast

from qcli import BURN_VERSION, layout
from qcli.burn_backends import qfloat
from qcli.errors import PlanError
from qcli.formats.found import Encoded, Transcode
from qcli.io.burnpack import TensorEntry
from qcli.io.dtypes import DType, Plain, burn_dtype
from qcli.io.source import TensorInfo
from qcli.presets import Preset
from qcli.problem import Problem, Severity
from qcli.recipe import Rule
from qcli.scheme import Calibration, QuantScheme

# What quantizing holds beside a tensor's source and payload (`PlanEntry.peak_bytes`): six f32 grids of
# a value per block at most, and a chunk's temporaries, about 24 bytes per value of a chunk of 2^18
# values per core (`qcli.codec.quantize.CHUNK_ELEMENTS`).
GRID_BYTES_PER_BLOCK = 24
CHUNK_WORKING_BYTES = 24 * (1 << 18) * (os.cpu_count() or 1)


@dataclass(frozen=True)
class Decision:
    """What happens to one tensor: quantized with `scheme`, or kept (`scheme is None`), and why."""

    scheme: QuantScheme | None
    calibration: Calibration
    transpose: bool
    reason: str
    rule: Rule | None
    cast: str | None = None  # a kept floating tensor written in this dtype (F32, F16, BF16) instead of its own
    transcode: Transcode | None = None  # an already-quantized tensor written as `scheme`, its codes unchanged
    requantize: Encoded | None = None  # one no Burn scheme holds, dequantized by its format's decoder, then quantized

    @property
    def found(self) -> Transcode | Encoded | None:
        """The already-quantized weight it writes (transcoded or requantized), whose format gives its name,
        shape and companions; None for an ordinary tensor."""
        return self.transcode or self.requantize


@dataclass(frozen=True)
class Encoding:
    """How the pipelines make an entry's payload: `scheme` (None: kept) on the source, `transpose`d or not,
    of `shape`. It is the decision's own, except for a scheme packed along the outer axis (PackedU32(1)),
    whose bytes are its inner-packed form's on the tensor's other orientation (`qcli.scheme.inner_packed`)."""

    scheme: QuantScheme | None
    transpose: bool
    shape: tuple[int, ...]


@dataclass(frozen=True)
class PlanEntry:
    info: TensorInfo
    decision: Decision
    burn_version: str = BURN_VERSION

    @property
    def name(self) -> str:
        """The name it is written under: the source tensor's, or the one its format gives the weight its
        codes stand for (GPTQ's `m.qweight` is written as `m.weight`)."""
        found = self.decision.found
        return found.name if found is not None else self.info.name

    @functools.cached_property  # each property below is asked many times of every entry
    def shape(self) -> tuple[int, ...]:
        """The source tensor's shape as its format dequantizes it, not its codes' shape."""
        found = self.decision.found
        return found.shape if found is not None else tuple(self.info.shape)

    @functools.cached_property
    def out_shape(self) -> tuple[int, ...]:
        """The shape written: the source shape, reversed when the tensor is transposed."""
        shape = self.shape
        return shape[::-1] if self.decision.transpose and len(shape) == 2 else shape

    @functools.cached_property
    def encoding(self) -> Encoding:
        """How its payload is made."""
        scheme, transpose = self.decision.scheme, self.decision.transpose
        if scheme is None:
            return Encoding(None, transpose, self.out_shape)
        stored, shape = layout.stored_as(scheme, self.out_shape)
        return Encoding(stored, transpose != (stored is not scheme), shape)  # the other orientation where it differs

    @functools.cached_property
    def out_dtype(self) -> DType | None:
        """Burn's DType written: the source dtype (or the cast's) for a kept tensor, None where Burn has
        none; else the scheme's QFloat."""
        if self.decision.scheme is None:
            return burn_dtype(self.decision.cast or self.info.dtype)
        return qfloat(self.decision.scheme, self.burn_version)

    @functools.cached_property
    def out_nbytes(self) -> int:
        if self.decision.scheme is None:
            if self.decision.cast is not None:
                return Plain(self.decision.cast).nbytes(self.info.shape)
            return self.info.nbytes
        scheme = self.encoding.scheme
        assert scheme is not None, "a quantized entry's encoding has its scheme"
        return layout.quantized_data_len(scheme, self.encoding.shape)

    @property
    def in_nbytes(self) -> int:
        """The source bytes it is written from: a transcoded or requantized tensor's companions', too."""
        return self.info.nbytes + sum(c.nbytes for c in self.consumed)

    @property
    def consumed(self) -> tuple[TensorInfo, ...]:
        """The source tensors written inside this entry's payload."""
        found = self.decision.found
        return found.companions if found is not None else ()

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def bits_per_weight(self) -> float:
        return layout.bits_per_weight(self.out_nbytes, self.numel)

    @property
    def peak_bytes(self) -> int:
        """Host memory while the CPU path processes this tensor, beside the runtime's: a kept tensor holds
        its source bytes, twice when transposed, and its cast beside them; a quantized one its source, its
        payload, a few f32 grids of one value per block (the codec's ranges and scales, the measure's
        errors and decoded scales) and one chunk's temporaries (`qcli.codec.quantize`)."""
        if self.decision.scheme is None:
            cast = self.out_nbytes if self.decision.cast is not None else 0
            return self.info.nbytes * (2 if self.decision.transpose else 1) + cast
        scheme = self.encoding.scheme
        assert scheme is not None, "a quantized entry's encoding has its scheme"
        blocks = layout.num_scales(scheme, self.encoding.shape)
        return self.info.nbytes + self.out_nbytes + GRID_BYTES_PER_BLOCK * blocks + CHUNK_WORKING_BYTES


@dataclass(frozen=True)
class Totals:
    """Sums over a plan; `peak_bytes` is the largest entry's `PlanEntry.peak_bytes`: tensors are processed
    one at a time, so that is the expected peak host memory of a run, whatever the model's size."""

    tensors: int
    quantized: int
    kept: int
    transposed: int
    params: int
    bytes_in: int
    bytes_out: int
    peak_bytes: int

    @property
    def ratio(self) -> float:
        """Input bytes per output byte: how many times smaller the output is."""
        return self.bytes_in / self.bytes_out if self.bytes_out else 0.0

    @property
    def bits_per_weight(self) -> float:
        return layout.bits_per_weight(self.bytes_out, self.params)


@dataclass
class Plan:
    entries: list[PlanEntry]
    problems: list[Problem]
    preset: Preset | None = None

    def totals(self) -> Totals:
        quantized = [e for e in self.entries if e.decision.scheme is not None]
        return Totals(
            tensors=len(self.entries),
            quantized=len(quantized),
            kept=len(self.entries) - len(quantized),
            transposed=sum(e.decision.transpose for e in self.entries),
            params=sum(e.numel for e in self.entries),
            bytes_in=sum(e.in_nbytes for e in self.entries),
            bytes_out=sum(e.out_nbytes for e in self.entries),
            peak_bytes=max((e.peak_bytes for e in self.entries), default=0),
        )

    def container_entries(self) -> list[TensorEntry]:
        """Each tensor as the container lists it (name, written dtype and shape, bytes), in plan order: what
        its size bounds and the shards are worked out from. A tensor Burn has no dtype for (`out_dtype` None)
        is refused by the plan's checks before a plan is written."""
        return [TensorEntry(e.name, cast(DType, e.out_dtype), tuple(e.out_shape), e.out_nbytes) for e in self.entries]

    def calibrated_by(self, calibration: Calibration) -> list[PlanEntry]:
        """The entries quantized from their own float values whose scales `calibration` chooses (a
        transcoded or requantized tensor's come from its format)."""
        return [e for e in self.entries if e.decision.scheme is not None and e.decision.calibration is calibration
                and e.decision.transcode is None and e.decision.requantize is None]

    def codec_calibrated(self) -> list[PlanEntry]:
        """The entries quantized from their own float values whose scales the codec chooses from the
        weights alone (MinMax, AbsMean): a run on calibration text only measures their output error."""
        return [e for e in self.entries if e.decision.scheme is not None and e.decision.transcode is None
                and e.decision.requantize is None
                and e.decision.calibration in (Calibration.MinMax, Calibration.AbsMean)]

    def consumed(self) -> set[str]:
        """The source tensors written inside another's payload, not as entries: transcoded tensors' scales,
        requantized codebook tensors' companions."""
        return {c.name for e in self.entries for c in e.consumed}

    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity is Severity.error]

    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity is Severity.warning]

    def raise_if_errors(self) -> None:
        """`PlanError` listing every error-severity problem, each with its hint (a single one's is the
        error's hint)."""
        errors = self.errors()
        if not errors:
            return
        noun = "problem" if len(errors) == 1 else "problems"
        raise PlanError(
            f"the plan has {len(errors)} {noun}; no weight was read and nothing was written",
            hint=errors[0].hint if len(errors) == 1 else "each problem above says what to do",
            problems=errors,
        )
