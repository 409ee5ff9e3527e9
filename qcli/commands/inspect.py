"""`inspect_file`: what a checkpoint or a burnpack file holds, and for a checkpoint what quantize's default plan
does with each tensor. It also gives one tensor's statistics, or checks a burnpack file against its source."""

from __future__ import annotations

import difflib
import math
import struct
from pathlib import Path
from typing import TYPE_CHECKING

from qcli import layout
from qcli.commands import collector_paused
from qcli.error_stats import ErrorStats, ValueStats
from qcli.errors import InputError, UsageError
from qcli.formats import detect, verdict
from qcli.formats.found import Encoded, Found, Transcode
from qcli.io.burnpack import TensorEntry
from qcli.io.burnpack_index import BurnpackSet, is_container
from qcli.io.dtypes import FLOAT_DTYPES, TORCH_DTYPE_NAMES, Bool, BoolStore, DType, Plain, QFloat, torch_dtype
from qcli.io.readers import locate, open_source
from qcli.io.source import Source, TensorInfo
from qcli.output.metadata import written_transposed
from qcli.plan.decisions import plan_by_name
from qcli.plan.entries import PlanEntry
from qcli.report.documents import SourceFile
from qcli.report.inspect import (
    CompareReport,
    CompareRow,
    InspectReport,
    ListedTensor,
    PlannedTensor,
    SourcePlan,
    TensorStats,
)
from qcli.report.quantize import TensorRow
from qcli.scheme import Calibration, QuantScheme

if TYPE_CHECKING:
    import torch


def _dtype_key(dtype: Plain | Bool) -> str:
    """The safetensors spelling of a dtype that is not QFloat (`Bool(…)` -> BOOL)."""
    return "BOOL" if isinstance(dtype, Bool) else dtype.value


def _tensor_from_bytes(data: memoryview, dtype: Plain | Bool, shape: tuple[int, ...]) -> torch.Tensor:
    import torch

    key = _dtype_key(dtype)
    if key not in TORCH_DTYPE_NAMES:
        raise UsageError(f"qcli cannot decode dtype {dtype}", hint="inspect lists it without --tensor")
    if key == "BOOL":
        # Burn's Bool(U32) holds a u32 per element, Bool(Native|U8) a byte; any nonzero element is true
        # (a torch bool read from a byte other than 0 or 1 is undefined).
        if math.prod(shape) == 0:
            return torch.empty(shape, dtype=torch.bool)
        raw = torch.int32 if dtype == Bool(BoolStore.U32) else torch.uint8
        return torch.frombuffer(bytearray(data), dtype=raw).reshape(shape).ne(0)
    t = torch_dtype(key)
    if math.prod(shape) == 0:
        return torch.empty(shape, dtype=t)
    return torch.frombuffer(bytearray(data), dtype=t).reshape(shape)


def _decoded(data: memoryview, dtype: DType, shape: tuple[int, ...]) -> torch.Tensor:
    """A burnpack tensor's values: a QFloat decoded to f32, anything else reinterpreted."""
    if not isinstance(dtype, QFloat):
        return _tensor_from_bytes(data, dtype, shape)
    from qcli.codec import decode

    return decode(data, dtype.scheme, shape)


def _scale_stats(data: memoryview, scheme: QuantScheme, shape: tuple[int, ...]) -> tuple[ValueStats, float | None]:
    """Statistics of the stored (innermost) scales and the f32 global of a two-level scheme; called after
    `decode` accepted the scheme, so its scales are ones the codec unpacks."""
    from qcli.codec.decode import as_bytes
    from qcli.codec.pack import unpack_scales
    from qcli.codec.stats import value_stats

    start = layout.value_bytes(scheme, shape)
    end = start + layout.scale_bytes(scheme, shape)
    scales = unpack_scales(as_bytes(data[start:end]), scheme.scale_dtype())
    global_scale = struct.unpack_from("<f", data, end)[0] if scheme.is_two_level() else None
    return value_stats(scales), global_scale


def _suggest_tensor(name: str, names: list[str]) -> UsageError:
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    return UsageError(
        f"no tensor named {name!r}" + (f"; did you mean {close[0]!r}?" if close else ""),
        hint="`qcli inspect FILE` lists the tensor names",
    )


def inspect_file(
    path: str | Path, *, tensor: str | None = None, compare: str | Path | None = None, names: str = "file"
) -> InspectReport:
    """List a checkpoint (any format `qcli.io.readers.READERS` reads) with its default plan, or a burnpack file.

    `tensor` adds one tensor's statistics; `compare` checks a burnpack file against its source. `names` picks a
    GGUF source's tensor names (`qcli.io.source.Names`). A checkpoint may be a model `ORG/NAME` in the local
    Hugging Face cache (`qcli.io.readers.locate`)."""

    given, path = str(path), Path(path)
    if is_container(path):
        return _inspect_burnpack(path, tensor, compare, names)
    if compare is not None:
        raise UsageError(
            "--compare checks a .bpk against its source", hint="run `qcli inspect OUTPUT.bpk --compare INPUT`"
        )
    path, _ = locate(path)
    with collector_paused() as resume, open_source(path, names) as source:
        infos = source.infos()
        report = InspectReport(
            path=given,
            format=source.format,
            files=[SourceFile(f.name, f.stat().st_size) for f in source.files],
            tensors=[ListedTensor(i.name, i.dtype, i.dtype, tuple(i.shape), i.nbytes) for i in infos],
            plan=_default_plan(infos),
        )
        resume()
        if tensor is not None:
            if tensor not in {i.name for i in infos}:
                raise _suggest_tensor(tensor, [i.name for i in infos])
            from qcli.codec.stats import value_stats

            found = detect(infos).get(tensor)
            report.tensor_stats = TensorStats(tensor, value_stats(_values(source, tensor, found)), None, None)
    return report


def _default_plan(infos: list[TensorInfo]) -> SourcePlan:
    """What `qcli quantize --dry-run` decides for each tensor with the default preset (its plan, in name
    order as quantize makes it), without raising its errors: they are reported, with the tensors they name."""
    found = detect(infos)
    plan = plan_by_name(infos, found=found)
    refused = {name for p in plan.errors() for name in p.tensors}
    rows = {e.info.name: TensorRow.of(e) for e in plan.entries}  # quantize's rows: its decision words
    tensors = {e.info.name: PlannedTensor(_format(e, found.get(e.info.name)), rows[e.info.name].decision,
                                          e.decision.reason, e.decision.scheme, e.info.name in refused)
               for e in plan.entries}
    for e in plan.entries:
        transcode = e.decision.transcode
        if transcode is None:
            continue
        for companion in transcode.companions:
            tensors[companion.name] = PlannedTensor(
                transcode.format, "consumed", f"companion of {e.info.name}, written inside its transcode", None)
    assert plan.preset is not None
    return SourcePlan(plan.preset.name, tensors, plan.problems, verdict(infos, found))


def _format(entry: PlanEntry, found: Found | None) -> str:
    """The source's format: its dtype, or the already-quantized format the weight is in
    (`F8_E4M3 with per-channel scales`, `bitsandbytes NF4`)."""
    return found.format if isinstance(found, Transcode | Encoded) else entry.info.dtype


def _values(source: Source, name: str, found: Found | None) -> torch.Tensor:
    """A source tensor's values: its own, or what its already-quantized format dequantizes it to."""
    x = source.load(name)
    if isinstance(found, Transcode):
        return found.dequantize(x, source.load)
    if isinstance(found, Encoded) and found.requantizable:
        return found.with_state(source.load).dequantize(source.load)
    return x


def _inspect_burnpack(path: Path, tensor: str | None, compare: str | Path | None, names: str) -> InspectReport:
    """One burnpack file, or through its index (`qcli.io.burnpack_index`) every shard of sharded output."""
    reader = BurnpackSet.open(path)
    entries = reader.entries()
    report = InspectReport(
        path=str(path),
        format="burnpack",
        files=[SourceFile(r.path.name, r.path.stat().st_size) for r in reader.readers],
        tensors=[
            ListedTensor(e.name, str(e.dtype), e.dtype, tuple(e.shape), e.nbytes)
            for e in entries
        ],
        version=reader.version,
        metadata=dict(reader.metadata),
    )
    if tensor is not None:
        by_name = {e.name: e for e in entries}
        if tensor not in by_name:
            raise _suggest_tensor(tensor, list(by_name))
        from qcli.codec.stats import value_stats

        entry = by_name[tensor]
        data = reader.read(tensor)
        values = value_stats(_decoded(data, entry.dtype, tuple(entry.shape)))
        scales, global_scale = (_scale_stats(data, entry.dtype.scheme, tuple(entry.shape))
                                if isinstance(entry.dtype, QFloat) else (None, None))
        report.tensor_stats = TensorStats(tensor, values, scales, global_scale)
    if compare is not None:
        report.compare = _compare(reader, entries, compare, names)
    return report


def _compare(reader: BurnpackSet, entries: list[TensorEntry], compare: str | Path, names: str) -> CompareReport:
    """Each written tensor against its source: kept ones must be byte-identical (to the source cast to the
    written dtype, for a kept tensor a recipe's cast wrote in another floating dtype), quantized ones
    measured."""
    transposed = written_transposed(reader.path, reader.metadata)
    rows: list[CompareRow] = []
    source_path, _ = locate(compare)
    with open_source(source_path, names) as source:
        import torch  # after the refusals a header gives

        from qcli.codec import error_stats
        from qcli.pipeline.cpu import cast_kept

        infos = {i.name: i for i in source.infos()}
        # an already-quantized weight's values are what its format dequantizes it to, from its companions
        found = {n: f for n, f in detect(source.infos()).items() if isinstance(f, Transcode | Encoded)}
        sources = {f.name: n for n, f in found.items()}  # a weight's name as written -> its source's (GPTQ's qweight)
        written = ({sources.get(e.name, e.name) for e in entries}
                   | {c.name for f in found.values() for c in f.companions})
        for e in entries:
            name = sources.get(e.name, e.name)
            if name not in infos:
                continue
            x = _values(source, name, found.get(name))
            flip = e.name in transposed
            if flip:
                x = x.t()
            text = str(e.dtype)
            if tuple(x.shape) != tuple(e.shape):
                src = "the transposed source" if flip else "the source"
                problem: str | None = f"shape {list(e.shape)} but {src} is {list(x.shape)}"
                rows.append(CompareRow(e.name, text, flip, False, None, problem))
                continue
            data = reader.read(e.name)
            if not isinstance(e.dtype, QFloat):
                written_as, source_dtype = _dtype_key(e.dtype), infos[name].dtype
                cast = written_as != source_dtype and {written_as, source_dtype} <= set(FLOAT_DTYPES)
                if cast:
                    try:
                        x = cast_kept(x, written_as, e.name)
                    except InputError:
                        x = x.to(torch_dtype(written_as))  # the difference shows below
                exact = bytes(data) == x.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
                problem = None if exact else (f"a kept tensor differs from its source cast to {written_as}" if cast
                                              else "a kept tensor differs from its source")
                error = ErrorStats(0.0, math.inf, 0.0) if exact else None
                rows.append(CompareRow(e.name, text, flip, exact, error, problem))
                continue
            x = x.contiguous()
            decoded = _decoded(data, e.dtype, tuple(e.shape))
            unfinite = _unfinite(data, e.dtype.scheme, decoded, x)
            if unfinite is not None:
                rows.append(CompareRow(e.name, text, flip, False, None, unfinite))
                continue
            if not bool(torch.isfinite(x).all()):  # a transcoded format's own inf or NaN codes
                exact = _same_values(x.to(torch.float32), decoded)
                rows.append(CompareRow(e.name, text, flip, exact, ErrorStats(0.0, math.inf, 0.0) if exact else None,
                                       None if exact else "its values differ from the source's, which hold inf or NaN"))
                continue
            error = error_stats(x, decoded)
            block, block_error, bound, mean_ratio = _judged(x, decoded, data, e.dtype.scheme)
            problem = None if block is None or block_error <= bound else (
                f"block {block} is {block_error:.3g} off, over its bound {bound:.3g}")
            rows.append(CompareRow(e.name, text, flip, error.max_abs == 0.0, error, problem,
                                   block, block_error, bound, mean_ratio))
    return CompareReport(
        source=str(compare),
        rows=rows,
        missing=sorted(set(infos) - written),
        extra=sorted(written - set(infos)),
    )


def _unfinite(data: memoryview, scheme: QuantScheme, decoded: torch.Tensor, x: torch.Tensor) -> str | None:
    """Why a quantized tensor's decode holds NaN or Inf where it must not: scales that are not finite
    (whatever its source holds, as a damaged checkpoint's transcode would carry them), or values that are
    not where its source's are finite; None where neither."""
    import torch

    from qcli.codec.decode import unfinite_blocks

    bad, blocks = unfinite_blocks(data, scheme, decoded.shape)
    if bad:
        return f"its scales are NaN or infinite in {bad} of its {blocks} blocks, so it decodes to NaN or Inf"
    wrong = int((~torch.isfinite(decoded) & torch.isfinite(x)).sum())
    if wrong:
        return f"it decodes to NaN or Inf in {wrong} values where its source is finite"
    return None


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same f32 values bit for bit, NaN for NaN whatever its payload (which no format gives a meaning)."""
    import torch

    nan = a.isnan()
    return torch.equal(nan, b.isnan()) and torch.equal(a[~nan].view(torch.int32), b[~nan].view(torch.int32))


def _judged(x: torch.Tensor, decoded: torch.Tensor, data: memoryview, scheme: QuantScheme
            ) -> tuple[int | None, float, float, float | None]:
    """A quantized tensor's worst block against its scheme's bound.

    It gives (flat block index, its max |error|, its bound, the mean over all blocks of max |error| over bound):
    the first block over its bound if any is (NaN counts as over), and (None, 0, 0, None) without a block.

    A block's bound is the smaller of two. One is what the payload's stored scales give (`stored_bound`); the
    other is what the source alone gives (`error_bound` under the loosest calibration, as the file does not
    record which one was used). So neither other data under the right scales nor inflated scales pass."""
    import torch

    from qcli.measure import block_errors, error_bound, stored_bound

    errors = block_errors(x, decoded, scheme).reshape(-1)
    if not errors.numel():
        return None, 0.0, 0.0, None
    loosest = torch.maximum(error_bound(x, scheme, Calibration.AbsMean), error_bound(x, scheme, Calibration.Mse))
    bounds = torch.minimum(stored_bound(x, data, scheme), loosest).reshape(-1)
    over = ~(errors <= bounds)
    ratio = torch.where(over, math.inf, torch.nan_to_num(errors / bounds, nan=0.0, posinf=math.inf))
    worst = int(ratio.argmax())
    return worst, float(errors[worst]), float(bounds[worst]), float(ratio.mean())
