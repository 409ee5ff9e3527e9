"""The GPU pipeline: safetensors bytes to QFloat payloads through the Triton kernels, overlapped.

A reader thread hands each tensor, in row pieces, to threads that read it in slices straight from the
file into one of two pinned staging buffers; it starts a piece's reads without waiting for the previous
piece's to finish, so small tensors keep many reads in flight, and a cached file reads at memory speed.
The main thread copies each piece to the device on a copy stream, runs the kernels on a compute stream
once a tensor (or a row chunk of it) is whole, and copies the payload back into one of two pinned output
buffers on a third stream. A payload is yielded only once the next tensor's work is queued, so the
writer (the caller) writes tensor k while the reader reads and the GPU quantizes tensor k + 1.

Bounds (`GpuSettings`): pinned host memory is two staging pieces (`piece_bytes`, 256 MiB by default) plus
two output buffers of the largest payload, each of exactly its size (`_Stage._buffer`), within 2 × the
largest tensor + 1 GiB. Device memory stays within `budget` (8 GiB by default): a tensor whose row chunk
footprint exceeds a quarter of it is quantized in chunks of whole blocks along its first axis, and a
per-tensor or two-level scheme then takes a first pass over all chunks for the range its scales need.

With `measure`, each quantized chunk is also decoded and measured against its source on the compute
stream right after its payload is enqueued (`qcli.measure.Measurement`), while the payload goes back
to the host; the first pass then also takes what the bound of a per-tensor or two-level scheme needs
(`qcli.measure.whole_range`). Measuring works a slice of at most `SLICE_VALUES` values at a time, whose
temporaries (`BYTES_PER_VALUE` each) are reserved out of the quarter of the budget a chunk may take.

A per-tensor or two-level MinMax scheme takes its range (the largest |x|) piece by piece as each piece
lands on the device, on the compute stream while the next piece is copied, so its quantize launch is one
pass over the tensor (`_streams_range`); a max is the same in any order, so the bytes are too.

A fresh process's first launches would compile the kernels: `compile_ahead` runs what a plan launches on
uninitialised tensors of each distinct shape, on a thread of its own while the first pieces are read
(`qcli.pipeline.device.Runtime`), and `run` waits for it (`ahead`) before its first launch.

`QCLI_KERNELS=triton` with `TRITON_INTERPRET=1` runs the same pipeline on CPU tensors, without a GPU.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import triton

from qcli import layout
from qcli.codec.scales import Scales
from qcli.codec.search import Search
from qcli.errors import InputError, NonFiniteTensor, NotKernelFloat, UsageError
from qcli.io.dtypes import KERNEL_DTYPES, SAFETENSORS_BITS, ElementKind, spellings, torch_dtype
from qcli.io.files import FileEnded, read_into
from qcli.io.source import in_row_order
from qcli.kernels import enqueue, interpreted, searches_in_kernel, tensor_range
from qcli.layout import BlockGrid
from qcli.measure import BYTES_PER_VALUE, SLICE_VALUES, Measurement, whole_range
from qcli.pipeline import GpuSettings, Payload
from qcli.pipeline.cpu import cast_kept, entry_importance, transcoded
from qcli.scheme import Calibration, check_accepted
from qcli.tensor_range import TensorRange, taken

if TYPE_CHECKING:
    from qcli.io.source import Source
    from qcli.plan.entries import Plan, PlanEntry
    from qcli.scheme import QuantScheme

log = logging.getLogger(__name__)
_SLOTS = 2  # staging buffers: pieces read ahead of the device


class Pass(Enum):
    """What a read is for. A chunked per-tensor or two-level scheme is read first for its range; under
    `Calibration.Mse` a chunked per-tensor scheme is then read again for its one scale's search."""

    range = "range"
    search = "search"
    quantize = "quantize"


@dataclass(frozen=True)
class _Piece:
    """One read: rows [start, stop) along the first axis of one entry, within GPU chunk [chunk_start,
    chunk_stop), read for `purpose`."""

    index: int            # the entry's position in the plan
    entry: PlanEntry
    file: Path
    offset: int           # of the piece in the file
    nbytes: int
    start: int
    stop: int
    chunk_start: int
    chunk_stop: int
    purpose: Pass
    last: bool            # the entry's last piece


def run(plan: Plan, source: Source, measure: bool = False, *,
        settings: GpuSettings, ahead: threading.Event | None = None,
        importance: Mapping[str, torch.Tensor] | None = None) -> Iterator[Payload]:
    """Every plan entry once, in order, as a `Payload` (`qcli.pipeline`): the same bytes and measures as
    the CPU pipeline. A payload is pinned host memory, valid until the generator is resumed twice more; a
    measurement is on the device. Its `read_seconds` is 0: the reads here overlap the kernels, so they
    take no time of their own. `ahead`, when given, is set once `compile_ahead` is done: the first launch
    waits for it, the reads do not. `importance` weighs the scale searches as the CPU pipeline's does."""
    device = _device()
    for entry in plan.entries:
        if entry.decision.requantize is not None:  # its source is decoded from several tensors, on the host
            raise UsageError(f"{entry.info.name} is requantized ({entry.decision.reason}), which the CPU pipeline "
                             "does", hint="use --device cpu (or auto), without QCLI_KERNELS=triton")
        if entry.encoding.scheme is not None:
            check_accepted(entry.encoding.scheme, entry.decision.calibration)
    weights = {i: w for i, entry in enumerate(plan.entries) if (w := entry_importance(entry, importance)) is not None}
    pieces = [piece for i, entry in enumerate(plan.entries) for piece in _pieces(i, entry, settings, measure)]
    if not pieces:
        return
    stage = _Stage(device, max(p.nbytes for p in pieces), max(e.out_nbytes for e in plan.entries))
    try:
        reader = _Reader(pieces, stage, settings.read_slice)
        try:
            yield from _quantize(pieces, reader, stage, measure, source, ahead, weights)
        finally:
            reader.stop()
    finally:
        stage.close()


def prepare() -> None:
    """Create the CUDA context and load Triton's driver (which builds its launcher helpers into Triton's
    cache on a fresh machine), so that neither waits for the first tensor."""
    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")
        triton.runtime.driver.active.get_current_target()


def compile_ahead(plan: Plan, measure: bool, settings: GpuSettings) -> int:
    """Make, once per distinct shape, dtype and decision of the plan's quantized tensors, the launches the
    pipeline makes for it (`_upload`'s range, `_process`), on uninitialised device tensors and a stream of
    their own, so that Triton compiles the kernels (or loads them from its cache) and torch loads its own
    before the first tensor arrives; return how many tensors' launches were made. Searched scales (Mse)
    that the torch search takes (`searches_in_kernel`) are left to their first tensor; the interpreter
    compiles nothing."""
    device = _device()
    if interpreted():
        return 0
    bare = _Stage(device, 0, 0, streams=False)
    made = set()
    stream = torch.cuda.Stream() if device.type == "cuda" else None
    with _on(stream):
        for i, entry in enumerate(plan.entries):
            decision, encoding = entry.decision, entry.encoding
            key = (tuple(entry.info.shape), entry.info.dtype, encoding.scheme, decision.calibration,
                   encoding.transpose)
            torch_search = (encoding.scheme is not None and decision.calibration is Calibration.Mse
                            and not searches_in_kernel(encoding.scheme, tuple(entry.info.shape)))
            if (encoding.scheme is None or decision.found is not None or torch_search
                    or entry.info.dtype not in KERNEL_DTYPES or key in made):
                continue
            made.add(key)
            check_accepted(encoding.scheme, decision.calibration)
            out = torch.empty(entry.out_nbytes, dtype=torch.uint8, device=device)
            tensor = None
            for piece in _pieces(i, entry, settings, measure):
                if tensor is None:
                    bad = torch.zeros(1, dtype=torch.int32, device=device)
                    tensor = _Tensor(piece, out, bad, Measurement.on(device) if measure else None)
                if piece.start == piece.chunk_start:
                    tensor.chunk = torch.empty(_chunk_shape(piece, piece.chunk_start, piece.chunk_stop),
                                               dtype=torch_dtype(entry.info.dtype), device=device)
                _stream_range(tensor, piece, bare)
                if piece.stop == piece.chunk_stop:
                    _process(tensor, piece, bare)
    if stream is not None:
        stream.synchronize()
    return len(made)


def _device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    if interpreted():
        return torch.device("cpu")
    raise UsageError("the Triton kernels need a CUDA device, and torch sees none",
                     hint="use --device cpu, or set TRITON_INTERPRET=1 to run the kernels on the CPU (slow)")


def _pieces(index: int, entry: PlanEntry, settings: GpuSettings, measure: bool) -> Iterator[_Piece]:
    """The reads of one entry: GPU chunks of whole blocks along the first axis (the whole tensor when it
    fits a quarter of the budget, or must be transposed), each split into pieces of at most `piece_bytes`.
    With `measure`, the quarter holds the measuring temporaries of one slice too."""
    info, decision = entry.info, entry.decision
    rows = info.shape[0] if len(info.shape) >= 2 else 1
    row_bytes = info.nbytes // rows if rows else 0
    scheme = entry.encoding.scheme if decision.transcode is None else None  # a transcode's bytes stay on the host
    footprint = info.nbytes + entry.out_nbytes  # input and payload on the device at once
    measuring = BYTES_PER_VALUE * min(math.prod(info.shape), SLICE_VALUES) if measure and scheme is not None else 0
    room = settings.budget / 4 - measuring
    reordered = info.rows is not None  # read whole, its rows put in order on the host
    if scheme is None or entry.encoding.transpose or reordered or rows <= 1 or footprint <= room:
        chunk_rows = max(rows, 1)
    else:
        step = scheme.block.size.to_dim_vec(len(info.shape))[0] if scheme.block else 1
        per_row = footprint / rows
        chunk_rows = max(step, int(max(room, 0) / per_row) // step * step)
    passes: tuple[Pass, ...] = (Pass.quantize,)
    if scheme is not None and chunk_rows < rows and (scheme.block is None or scheme.is_two_level()):  # two passes
        search = scheme.block is None and decision.calibration is Calibration.Mse
        passes = (Pass.range, Pass.search, Pass.quantize) if search else (Pass.range, Pass.quantize)
    piece_rows = max(1, settings.piece_bytes // row_bytes) if row_bytes else 1
    if scheme is None and (decision.transpose or decision.transcode) or reordered:  # on the CPU, whole
        piece_rows = rows
    for purpose in passes:
        for chunk_start in range(0, max(rows, 1), chunk_rows):
            chunk_stop = min(chunk_start + chunk_rows, max(rows, 1))
            for start in range(chunk_start, chunk_stop, piece_rows):
                stop = min(start + piece_rows, chunk_stop)
                yield _Piece(index, entry, info.file, info.offset + start * row_bytes, (stop - start) * row_bytes,
                             start, stop, chunk_start, chunk_stop, purpose,
                             purpose is Pass.quantize and stop == max(rows, 1))


class _Stage:
    """Staging buffers for reads and two output buffers for payloads, pinned when on a GPU, and the
    streams that move data between them and the device."""

    def __init__(self, device: torch.device, piece_bytes: int, out_bytes: int, streams: bool = True) -> None:
        self.device = device
        cuda = device.type == "cuda" and streams
        self.registered: list[torch.Tensor] = []
        self.staging = [self._buffer(piece_bytes, cuda) for _ in range(_SLOTS)]
        self.outputs = [self._buffer(out_bytes, cuda) for _ in range(2)]
        self.h2d = torch.cuda.Stream() if cuda else None
        self.compute = torch.cuda.Stream() if cuda else None
        self.d2h = torch.cuda.Stream() if cuda else None

    def _buffer(self, nbytes: int, pinned: bool) -> torch.Tensor:
        """A host buffer of exactly `nbytes`, page-locked where `pinned` so that copies to and from the device
        run asynchronously. torch's pinned allocator (`pin_memory=True`) rounds each buffer up to a power of
        two (the two 558 MB payload buffers of a Llama-3-8B-shaped model's q8s-b32 embedding took 1 GiB
        each), so the buffer is ordinary memory registered with CUDA (`cudaHostRegister`, unregistered by
        `close`); where registering fails, torch's pinned allocator gives it."""
        buffer = torch.empty(nbytes, dtype=torch.uint8)
        if not pinned:
            return buffer
        if nbytes and _registered(buffer):
            self.registered.append(buffer)
            return buffer
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def close(self) -> None:
        """Unregister the buffers `_buffer` registered; they stay valid as ordinary memory."""
        while self.registered:
            _unregistered(self.registered.pop())

    def event(self, stream: torch.cuda.Stream | None) -> torch.cuda.Event | None:
        if stream is None:
            return None
        event = torch.cuda.Event()
        event.record(stream)
        return event


def _registered(buffer: torch.Tensor) -> bool:
    """Whether CUDA page-locked the host `buffer` for every context (`cudaHostRegister`, portable, through
    torch's binding of the CUDA runtime): a runtime without the call, or one that refuses, leaves it as it
    was. The call runs on a thread of its own, whose last-error state a refusal is left in: torch checks
    the last error after its launches, and this thread's must stay clean."""
    return _on_own_thread(lambda: torch.cuda.cudart().cudaHostRegister(buffer.data_ptr(), buffer.numel(), 1))


def _unregistered(buffer: torch.Tensor) -> bool:
    """`cudaHostUnregister` of a buffer `_registered` page-locked, on a thread of its own as that is."""
    return _on_own_thread(lambda: torch.cuda.cudart().cudaHostUnregister(buffer.data_ptr()))


def _on_own_thread(call: Callable[[], int]) -> bool:
    """Whether the CUDA runtime `call`, made on a new thread, returned success."""
    done: list[bool] = []

    def run() -> None:
        try:
            done.append(int(call()) == 0)
        except (AttributeError, AssertionError, RuntimeError, TypeError):
            done.append(False)

    thread = threading.Thread(target=run, name="qcli-host-register")
    thread.start()
    thread.join()
    return bool(done and done[0])


class _Reader:
    """A thread that starts the reads of the pieces, in order, into the staging buffers in turn; a buffer
    is reused once the copy that emptied it has finished. `ready` yields (piece, slot, reads): the piece
    is in its buffer once every read is done (`wait`)."""

    def __init__(self, pieces: list[_Piece], stage: _Stage, read_slice: int) -> None:
        # each piece with its slot and reads, or what stopped the reader
        self.ready: queue.Queue[tuple[_Piece, int, list[Future[None]]] | BaseException] = queue.Queue()
        # per slot: None, or the event after which its buffer is free
        self.free: list[queue.Queue[torch.cuda.Event | None]] = [queue.Queue() for _ in stage.staging]
        for free in self.free:
            free.put(None)
        self._stage, self._pieces, self._read_slice = stage, pieces, read_slice
        self._stopped = threading.Event()
        self._pool = ThreadPoolExecutor(max(1, min(16, os.cpu_count() or 1)))
        self._fds: dict[Path, int] = {}
        self._thread = threading.Thread(target=self._run, name="qcli-reader", daemon=True)
        self._thread.start()

    def release(self, slot: int, event: torch.cuda.Event | None) -> None:
        self.free[slot].put(event)

    def stop(self) -> None:
        self._stopped.set()
        for free in self.free:
            free.put(None)
        self._thread.join()
        self._pool.shutdown(cancel_futures=True)
        for fd in self._fds.values():
            os.close(fd)

    def _run(self) -> None:
        try:
            for i, piece in enumerate(self._pieces):
                slot = i % len(self.free)
                event = self.free[slot].get()
                if self._stopped.is_set():
                    return
                if event is not None:
                    event.synchronize()
                self.ready.put((piece, slot, self._start(piece, self._stage.staging[slot].numpy().data)))
        except BaseException as exc:  # handed to the consumer, which raises it
            self.ready.put(exc)

    def _start(self, piece: _Piece, view: memoryview) -> list[Future[None]]:
        fd = self._fds.get(piece.file)
        if fd is None:
            fd = self._fds[piece.file] = os.open(piece.file, os.O_RDONLY)
        step = self._read_slice
        return [self._pool.submit(read_into, fd, view[s : min(s + step, piece.nbytes)], piece.offset + s)
                for s in range(0, piece.nbytes, step)]

    @staticmethod
    def wait(piece: _Piece, reads: list[Future[None]]) -> None:
        for read in reads:
            try:
                read.result()
            except FileEnded:
                raise InputError(
                    f"{piece.file}: cut short while reading tensor '{piece.entry.info.name}'",
                    hint="the file changed since it was opened; run again on a complete file",
                ) from None


@dataclass
class _Tensor:
    """The device-side state of the entry being quantized."""

    piece: _Piece
    out: torch.Tensor           # pinned output buffer (slice of the payload length)
    bad: torch.Tensor
    measured: Measurement | None
    chunk: torch.Tensor | None = None
    whole: TensorRange | None = None
    measure_whole: TensorRange | None = None  # the bound's, from the first pass of a chunked tensor
    importance: torch.Tensor | None = None  # what weighs its Mse search (`entry_importance`), on the host
    search: Search | None = None  # a chunked per-tensor Mse scheme's, fed in the search pass
    searched: Scales | None = None  # what it picked
    done: torch.cuda.Event | None = None  # event after the last copy into `out`
    measure_done: torch.cuda.Event | None = None  # event after the last measuring work


def _quantize(pieces: list[_Piece], reader: _Reader, stage: _Stage, measure: bool, source: Source,
              ahead: threading.Event | None, importance: dict[int, torch.Tensor]) -> Iterator[Payload]:
    pending: list[_Tensor] = []
    current: _Tensor | None = None
    for _ in pieces:
        ready = reader.ready.get()
        if isinstance(ready, BaseException):
            raise ready
        piece, slot, reads = ready
        reader.wait(piece, reads)
        if ahead is not None:  # the first launch: after the kernels compiled ahead, while the reads go on
            tick = time.perf_counter()
            ahead.wait()
            log.debug("first piece read; waited %.3f s for the kernels compiled ahead", time.perf_counter() - tick)
            ahead = None
        entry = piece.entry
        if current is None or current.piece.index != piece.index:
            out = stage.outputs[piece.index % 2][: entry.out_nbytes]
            quantized = entry.encoding.scheme is not None and entry.decision.transcode is None
            with _on(stage.compute):  # zeroed on the stream whose kernels raise it (and measure into it)
                bad = torch.zeros(1, dtype=torch.int32, device=stage.device)
                measured = Measurement.on(stage.device) if measure and quantized else None
            current = _Tensor(piece, out, bad, measured, importance=importance.get(piece.index))
        host = in_row_order(stage.staging[slot][: piece.nbytes], entry.info)
        if entry.decision.transcode is not None:
            current.out.copy_(transcoded(entry, host, source))
            reader.release(slot, None)
        elif entry.decision.scheme is None:
            _keep(current, piece, host)
            reader.release(slot, None)
        else:
            _upload(current, piece, host, stage)
            reader.release(slot, stage.event(stage.h2d))
            _stream_range(current, piece, stage)
            if piece.stop == piece.chunk_stop:
                _process(current, piece, stage)
        if piece.last:
            current.done = stage.event(stage.d2h)
            current.measure_done = stage.event(stage.compute)
            pending.append(current)
            current = None
            if len(pending) == 2:
                yield _finish(pending.pop(0))
    for tensor in pending:
        yield _finish(tensor)


# An integer type of each element size, to move any element whole: the first of each width in the rows (the
# last one written wins), U8, I16, I32 and I64.
_INT_OF_SIZE = {SAFETENSORS_BITS[d] // 8: torch_dtype(d)
                for d in reversed(spellings(lambda row: row.kind is ElementKind.int))}


def _keep(tensor: _Tensor, piece: _Piece, host: torch.Tensor) -> None:
    """A kept tensor's source bytes into its payload, transposed (as whole elements) if decided, and cast
    piece by piece (`cast_kept`, as the CPU pipeline casts) when the decision says so."""
    info, decision = piece.entry.info, piece.entry.decision
    cast = decision.cast
    if cast is not None:
        host = host.view(torch_dtype(info.dtype))
    if not decision.transpose:
        rows = max(piece.stop - piece.start, 1)
        data = host if cast is None else cast_kept(host, cast, info.name).view(torch.uint8)
        row_bytes = data.numel() // rows
        tensor.out[piece.start * row_bytes :][: data.numel()].copy_(data)
        return
    if cast is not None:  # transposed kept tensors come whole, in one piece
        values = cast_kept(host.reshape(info.shape).t(), cast, info.name)
        tensor.out.view(values.dtype).reshape(tuple(piece.entry.out_shape)).copy_(values)
        return
    element = _INT_OF_SIZE[info.nbytes // math.prod(info.shape)]
    tensor.out.view(element).reshape(tuple(piece.entry.out_shape)).copy_(host.view(element).reshape(info.shape).t())


def _chunk_shape(piece: _Piece, start: int, stop: int) -> tuple[int, ...]:
    shape = piece.entry.info.shape
    return (stop - start, *shape[1:]) if len(shape) >= 2 else tuple(shape)


def _upload(tensor: _Tensor, piece: _Piece, host: torch.Tensor, stage: _Stage) -> None:
    """Copy a piece to its rows of the device chunk, allocating the chunk at its first piece."""
    info = piece.entry.info
    if info.dtype not in KERNEL_DTYPES:
        raise NotKernelFloat(info.name, info.dtype)
    with _on(stage.h2d):
        if piece.start == piece.chunk_start:
            tensor.chunk = torch.empty(_chunk_shape(piece, piece.chunk_start, piece.chunk_stop),
                                       dtype=torch_dtype(info.dtype), device=stage.device)
        rows = _chunk(tensor).reshape(max(piece.chunk_stop - piece.chunk_start, 1), -1)
        rows = rows[piece.start - piece.chunk_start : piece.stop - piece.chunk_start]
        rows.view(torch.uint8).reshape(-1).copy_(host, non_blocking=True)


def _streams_range(piece: _Piece) -> bool:
    """Whether the range of this piece's tensor is taken piece by piece as it lands: a per-tensor or
    two-level MinMax scheme (its range is the largest |x|, the same in any order of pieces) on a tensor
    held whole on the device (a chunked one takes a pass of its own, `Pass.range`)."""
    decision = piece.entry.decision
    scheme = piece.entry.encoding.scheme
    rows = piece.entry.info.shape[0] if len(piece.entry.info.shape) >= 2 else 1
    return (scheme is not None and decision.transcode is None and decision.calibration is Calibration.MinMax
            and (scheme.block is None or scheme.is_two_level()) and piece.chunk_start == 0
            and piece.chunk_stop == max(rows, 1))


def _stream_range(tensor: _Tensor, piece: _Piece, stage: _Stage) -> None:
    """The range of the piece just copied to the device, on the compute stream once the copy is done,
    added into the tensor's (`_streams_range`)."""
    if not _streams_range(piece):
        return
    if stage.compute is not None and stage.h2d is not None:
        stage.compute.wait_stream(stage.h2d)
    rows = _chunk(tensor).reshape(max(piece.chunk_stop - piece.chunk_start, 1), -1)
    part = rows[piece.start - piece.chunk_start : piece.stop - piece.chunk_start]
    with _on(stage.compute):
        got = tensor_range(part.reshape(_chunk_shape(piece, piece.start, piece.stop)), _scheme(piece),
                           Calibration.MinMax, tensor.bad)
        tensor.whole = got if tensor.whole is None else tensor.whole.add(got)


def _process(tensor: _Tensor, piece: _Piece, stage: _Stage) -> None:
    """Quantize a whole device chunk (or collect its range, or feed its scale's search, in a pass before),
    copy its payload back and, when measuring, measure it."""
    entry, decision, encoding = piece.entry, piece.entry.decision, piece.entry.encoding
    scheme, chunk = _scheme(piece), _chunk(tensor)
    if stage.compute is not None and stage.h2d is not None:
        stage.compute.wait_stream(stage.h2d)
        chunk.record_stream(stage.compute)
    with _on(stage.compute):
        x = chunk.t().contiguous() if encoding.transpose else chunk
        if piece.purpose is Pass.search:
            if tensor.search is None:
                shape = encoding.shape
                assert tensor.whole is not None, "the range pass comes before the search pass"
                peak = taken(tensor.whole.peak).reshape(BlockGrid.of(scheme, shape).grid)
                tensor.search = Search(peak, scheme, shape, importance=tensor.importance, name=entry.info.name)
            tensor.search.add(x.to(torch.float32), slice(None), piece.chunk_start)
            return
        if piece.purpose is Pass.range:
            part = tensor_range(x, scheme, decision.calibration, tensor.bad)
            whole = tensor.whole
            tensor.whole = part if whole is None else whole.add(part)
            if tensor.measured is not None:
                seen = whole_range(x)
                tensor.measure_whole = seen if tensor.measure_whole is None else tensor.measure_whole.add(seen)
            return
        else:
            payload = torch.empty(layout.quantized_data_len(scheme, tuple(x.shape)), dtype=torch.uint8,
                                  device=stage.device)
            if tensor.search is not None and tensor.searched is None:
                tensor.searched = tensor.search.scales()
            enqueue(x, scheme, decision.calibration, payload, tensor.bad, whole=tensor.whole,
                    searched=tensor.searched, importance=tensor.importance, name=entry.info.name)
    if stage.d2h is not None and stage.compute is not None:
        stage.d2h.wait_stream(stage.compute)
        payload.record_stream(stage.d2h)
    with _on(stage.d2h):
        full = encoding.shape
        stop = piece.chunk_start + (x.shape[0] if x.dim() else 1)
        for dst, src, n in layout.row_regions(scheme, full, piece.chunk_start, stop):
            tensor.out[dst : dst + n].copy_(payload[src : src + n], non_blocking=True)
    if tensor.measured is not None:  # after the copy back is queued, so it need not wait for the measuring
        with _on(stage.compute):
            tensor.measured.add(x, payload, scheme, decision.calibration, whole=tensor.measure_whole,
                                first_row=piece.chunk_start)


def _scheme(piece: _Piece) -> QuantScheme:
    """The scheme of a piece whose tensor is quantized on the device (`_streams_range`, `_process`)."""
    scheme = piece.entry.encoding.scheme
    assert scheme is not None, "only a quantized tensor's pieces reach the device"
    return scheme


def _chunk(tensor: _Tensor) -> torch.Tensor:
    """The device chunk `_upload` allocated at the chunk's first piece."""
    assert tensor.chunk is not None, "the chunk's first piece allocates it"
    return tensor.chunk


def _finish(tensor: _Tensor) -> Payload:
    for event in (tensor.done, tensor.measure_done):
        if event is not None:
            event.synchronize()
    if int(tensor.bad.item()):
        raise NonFiniteTensor(tensor.piece.entry.info.name, beyond_float32=False)  # `_upload` refuses F64
    return Payload(tensor.piece.entry, tensor.out, tensor.measured, 0.0)


class _on:
    """`torch.cuda.stream(s)`, or nothing on the CPU."""

    def __init__(self, stream: torch.cuda.Stream | None) -> None:
        self._context = torch.cuda.stream(stream) if stream is not None else None

    def __enter__(self) -> None:
        if self._context is not None:
            self._context.__enter__()

    def __exit__(self, *exc: object) -> None:
        if self._context is not None:
            self._context.__exit__(*exc)
