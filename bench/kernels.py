"""Kernel throughput per scheme against the device-to-device copy and a torch.compile'd implementation.

Run on a CUDA machine from the repository root: `python3 -m bench.kernels --out DIR`. For each scheme
and size it times the Triton path (`qcli.kernels.enqueue`, every launch included) over a stream of
launches on distinct inputs, together larger than the L2 cache, issued back to back: once as Python
launches them, once replayed from a CUDA graph of the same stream (the device's time alone), so the two
differ only by the host's cost of launching. It also times the codec's own torch arithmetic run eagerly
on the GPU, and the same function through torch.compile (those with Triton's `do_bench`, which empties
the L2 cache before each call, as it times one launch of the Triton path too, against a copy timed alike);
it counts bytes in (the bf16 tensor) plus bytes out (the payload) over
the median time, and checks the Triton payload, written into a poisoned buffer, against the eager one
byte for byte. Writes kernels.json and prints a table.

For per-tensor and two-level schemes it also times the quantize launch given the tensor's range
(`enqueue(..., whole=...)`), which is what the GPU pipeline launches once it has taken the range piece
by piece as the tensor landed (`qcli.pipeline.gpu`); and, once per such scheme at the largest size, the
upload of the tensor from pinned memory in four pieces alone and with each piece's range taken on a
second stream as it lands (`streamed`): what that range costs the pipeline.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import triton

from qcli import layout
from qcli.codec import QuantizedParts, pack
from qcli.codec import encode as codec_encode
from qcli.codec.blocks import counts
from qcli.codec.scales import block_alpha, block_reduce, scales_from_alpha
from qcli.codec.values import to_fields
from qcli.kernels import enqueue, tensor_range
from qcli.scheme import Calibration, Native, PackedU32, QuantScheme, QuantValue, ScaleDtype

MinMax, AbsMean = Calibration.MinMax, Calibration.AbsMean


def _blocked(value: QuantValue, dtype: ScaleDtype = ScaleDtype.F16, block=32, store=None) -> QuantScheme:
    scheme = QuantScheme().with_value(value).per_block(block, dtype)
    return scheme.with_store(store) if store is not None else scheme


SCHEMES = [  # (label, scheme, calibration, compare with torch.compile)
    ("Q8S tensor F32", QuantScheme().with_value(QuantValue.Q8S), MinMax, True),
    ("Q8S b32 F16", _blocked(QuantValue.Q8S), MinMax, False),
    ("Q8F b32 F16 Native", _blocked(QuantValue.Q8F, store=Native()), MinMax, False),
    ("Q4S b32 F16", _blocked(QuantValue.Q4S), MinMax, True),
    ("Q4F b32 BF16", _blocked(QuantValue.Q4F, ScaleDtype.BF16), MinMax, False),
    ("Q4S b32 F16 AbsMean", _blocked(QuantValue.Q4S), AbsMean, False),
    ("Q4S b[4,32] BF16", _blocked(QuantValue.Q4S, ScaleDtype.BF16, [4, 32]), MinMax, False),
    ("Q2S b32 F16", _blocked(QuantValue.Q2S), MinMax, False),
    ("Q2F b32 F16", _blocked(QuantValue.Q2F), MinMax, False),
    ("E4M3 b32 UE4M3 Native", _blocked(QuantValue.E4M3, ScaleDtype.UE4M3, store=Native()), MinMax, False),
    ("E5M2 tensor F16 Native", QuantScheme().with_value(QuantValue.E5M2).with_store(Native())
     .per_tensor(ScaleDtype.F16), MinMax, False),
    ("E2M1 b32 UE4M3 PackedU32", _blocked(QuantValue.E2M1, ScaleDtype.UE4M3, store=PackedU32(0)), MinMax,
     False),
    ("nvfp4 (E2M1 b16 UE4M3 + F32)", QuantScheme.nvfp4(), MinMax, True),
]


def codec_on_device(x: torch.Tensor, scheme: QuantScheme, calibration: Calibration) -> torch.Tensor:
    """The codec's arithmetic (qcli.codec) on x's device: the eager baseline and torch.compile's input."""
    xf = x.float()
    grid = layout.BlockGrid.of(scheme, x.shape)
    reduced = block_reduce(xf, grid, calibration)
    if calibration is MinMax:
        alpha = block_alpha(reduced, grid, calibration)
    else:  # the codec's counts live on the CPU
        alpha = (reduced / counts(grid).to(x.device)).to(torch.float32)
    scales = scales_from_alpha(alpha, scheme)
    q = to_fields(xf, scales.effective, grid, scheme.value).reshape(x.shape)
    # Inductor (torch 2.11) fails to lower the byte view of a one-element scale made in the same graph
    torch._dynamo.graph_break()
    return pack(QuantizedParts(q, scales.stored, scales.global_scale), scheme, x.shape)


def median_ms(fn, rep: int = 200) -> float:
    return triton.testing.do_bench(fn, warmup=50, rep=rep, return_mode="median")


_UNCACHED_BYTES = 256 << 20  # what the inputs of a timed stream add up to at least: five times an H200's L2
_STREAM_LAUNCHES = 16


def stream_ms(launches: list, graph: bool, rep: int = 20) -> tuple[float, float]:
    """Median milliseconds per launch of `launches` (one call each) issued back to back, as Python issues
    them or replayed from a CUDA graph captured of the same calls; and the median milliseconds per launch
    that the host took to issue them."""
    def issue() -> None:
        for launch in launches:
            launch()

    issue()
    torch.cuda.synchronize()
    run = issue
    if graph:
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            issue()
        run = captured.replay
    times, host = [], []
    for _ in range(rep):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        issued = time.perf_counter()
        run()
        host.append((time.perf_counter() - issued) * 1e3 / len(launches))
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / len(launches))
    return sorted(times)[len(times) // 2], sorted(host)[len(host) // 2]


def copy_bandwidth(nbytes: int, stream: bool = False) -> float:
    """Device-to-device copy, bytes read plus written per second: one copy at a time after the L2 cache
    is emptied (`median_ms`), or with `stream` copies between distinct buffers back to back (`stream_ms`)."""
    pairs = [(torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda"),
              torch.empty(nbytes, dtype=torch.uint8, device="cuda")) for _ in range(2 if stream else 1)]
    copies = [lambda src=src, dst=dst: dst.copy_(src) for src, dst in pairs]
    ms = stream_ms(copies * (_STREAM_LAUNCHES // 2), graph=False)[0] if stream else median_ms(copies[0])
    return 2 * nbytes / (ms * 1e-3)


def two_pass(scheme: QuantScheme) -> bool:
    """Whether the scheme's scales depend on the whole tensor (per-tensor or two-level)."""
    return scheme.block is None or scheme.is_two_level()


def streamed(x: torch.Tensor, scheme: QuantScheme, calibration: Calibration, pieces: int = 4) -> dict:
    """Median seconds to upload `x` from pinned memory in `pieces` row pieces on a copy stream, alone and
    with each piece's range taken on a compute stream once it lands, as the pipeline does."""
    host = x.cpu().pin_memory()
    dev = torch.empty_like(x)
    bad = torch.zeros(1, dtype=torch.int32, device="cuda")
    copy, compute = torch.cuda.Stream(), torch.cuda.Stream()
    rows = x.shape[0] // pieces

    def upload(with_range: bool) -> None:
        for k in range(pieces):
            with torch.cuda.stream(copy):
                dev[k * rows : (k + 1) * rows].copy_(host[k * rows : (k + 1) * rows], non_blocking=True)
            if with_range:
                compute.wait_stream(copy)
                with torch.cuda.stream(compute):
                    tensor_range(dev[k * rows : (k + 1) * rows], scheme, calibration, bad)
        torch.cuda.synchronize()

    result = {}
    for name, with_range in (("upload_s", False), ("upload_with_range_s", True)):
        times = []
        for _ in range(7):
            started = time.perf_counter()
            upload(with_range)
            times.append(time.perf_counter() - started)
        result[name] = sorted(times)[len(times) // 2]
    return result


def random_input(shape: tuple[int, int]) -> torch.Tensor:
    x = (torch.randn(shape, device="cuda") * torch.exp(torch.randn(shape, device="cuda"))).to(torch.bfloat16)
    return torch.where(x == 0, torch.ones_like(x), x)


def bench(shape: tuple[int, int], label: str, scheme: QuantScheme, calibration: Calibration, compiled: bool,
          copy_bps: float, flushed_copy_bps: float, eager: bool = True) -> dict:
    x = random_input(shape)
    n = layout.quantized_data_len(scheme, shape)
    out = torch.full((n,), 0xA5, dtype=torch.uint8, device="cuda")
    bad = torch.zeros(1, dtype=torch.int32, device="cuda")
    enqueue(x, scheme, calibration, out, bad)
    eager_out = codec_on_device(x, scheme, calibration) if eager else None
    torch.cuda.synchronize()
    # the CPU codec on the first rows: the reference the tests use
    rows = max(1, (1 << 21) // shape[1])
    part = x[:rows].contiguous()
    cpu = codec_encode(part.cpu(), scheme, calibration)
    part_out = torch.empty(cpu.numel(), dtype=torch.uint8, device="cuda")
    enqueue(part, scheme, calibration, part_out, bad)
    row = {"label": label, "scheme": str(scheme), "calibration": calibration.value, "shape": list(shape),
           "bytes_in": x.nbytes, "bytes_out": n, "bad_flag": int(bad.item()),
           "rows_checked_on_cpu": rows,
           "triton_identical_to_cpu_codec": bool(torch.equal(part_out.cpu(), cpu))}
    if eager:
        eager_part = codec_on_device(part, scheme, calibration).cpu()
        row.update(identical_to_eager_codec=bool(torch.equal(out, eager_out)),
                   eager_gpu_differing_bytes_vs_cpu_codec=int((eager_part != cpu).sum()),
                   differing_bytes_vs_eager=int((out != eager_out).sum()))
    moved = x.nbytes + n
    # distinct inputs and outputs, so that no launch of the stream reads what an earlier one left in cache
    inputs = [x] + [random_input(shape) for _ in range(max(1, -(-_UNCACHED_BYTES // x.nbytes)))]
    outs = [out] + [torch.empty_like(out) for _ in inputs[1:]]
    pairs = [(inputs[i % len(inputs)], outs[i % len(inputs)]) for i in range(_STREAM_LAUNCHES)]
    launches = [lambda x=x, out=out: enqueue(x, scheme, calibration, out, bad) for x, out in pairs]
    (triton_ms, host_ms), (graph_ms, _) = stream_ms(launches, graph=False), stream_ms(launches, graph=True)
    row.update(stream_inputs=len(inputs), stream_launches=len(launches), triton_ms=triton_ms, host_ms=host_ms,
               triton_gbps=moved / triton_ms / 1e6, copy_fraction=moved / (triton_ms * 1e-3) / copy_bps,
               graph_ms=graph_ms, graph_copy_fraction=moved / (graph_ms * 1e-3) / copy_bps,
               launched_of_graph=graph_ms / triton_ms)
    # one launch at a time after the L2 cache is emptied, against the copy timed alike
    flushed_ms = median_ms(lambda: enqueue(x, scheme, calibration, out, bad))
    row.update(flushed_ms=flushed_ms, flushed_copy_fraction=moved / (flushed_ms * 1e-3) / flushed_copy_bps)
    if two_pass(scheme) and calibration is MinMax:
        wholes = {id(x): tensor_range(x, scheme, calibration, bad) for x in inputs}
        given = torch.full((n,), 0xA5, dtype=torch.uint8, device="cuda")
        enqueue(x, scheme, calibration, given, bad, whole=wholes[id(x)])
        given_launches = [lambda x=x, out=out: enqueue(x, scheme, calibration, out, bad, whole=wholes[id(x)])
                          for x, out in pairs]
        given_ms, given_host_ms = stream_ms(given_launches, graph=False)
        given_graph_ms = stream_ms(given_launches, graph=True)[0]
        given_flushed_ms = median_ms(given_launches[0])
        row.update(given_range_identical=bool(torch.equal(given, out)), given_range_ms=given_ms,
                   given_range_host_ms=given_host_ms,
                   given_range_copy_fraction=moved / (given_ms * 1e-3) / copy_bps,
                   given_range_graph_copy_fraction=moved / (given_graph_ms * 1e-3) / copy_bps,
                   given_range_flushed_copy_fraction=moved / (given_flushed_ms * 1e-3) / flushed_copy_bps)
    if eager:
        eager_ms = median_ms(lambda: codec_on_device(x, scheme, calibration), rep=50)
        row.update(eager_ms=eager_ms, eager_gbps=moved / eager_ms / 1e6)
    if compiled:
        torch._dynamo.reset()  # a fresh graph per scheme: its constants stay constants
        fn = torch.compile(codec_on_device, dynamic=False)
        started = time.perf_counter()
        try:
            got = fn(x, scheme, calibration)
        except Exception as exc:  # a compiler failure is a result to record, not a reason to stop
            row["compile_error"] = str(exc).splitlines()[0]
            return row
        torch.cuda.synchronize()
        row["compile_seconds"] = time.perf_counter() - started
        row["compiled_differing_bytes_vs_eager"] = int((got != eager_out).sum()) if eager else None
        compiled_ms = median_ms(lambda: fn(x, scheme, calibration), rep=100)
        row.update(compiled_ms=compiled_ms, compiled_gbps=moved / compiled_ms / 1e6,
                   speedup_vs_compiled=compiled_ms / triton_ms)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sizes", default="4096x4096,8192x8192,16384x16384")
    parser.add_argument("--compile-size", default="16384x16384", help="the size torch.compile is timed at")
    parser.add_argument("--no-eager", action="store_true", help="skip the eager torch baseline")
    parser.add_argument("--schemes", help="comma-separated labels (default: all)")
    args = parser.parse_args()
    torch.manual_seed(0)
    copy_bps, flushed_copy_bps = copy_bandwidth(1 << 30, stream=True), copy_bandwidth(1 << 30)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "copy_bytes_per_s": copy_bps, "flushed_copy_bytes_per_s": flushed_copy_bps, "rows": []}
    print(f"{result['device']} torch {torch.__version__} triton {triton.__version__}: copy "
          f"{copy_bps / 1e12:.2f} TB/s back to back, {flushed_copy_bps / 1e12:.2f} TB/s flushed (read + write)",
          flush=True)
    chosen = [s for s in SCHEMES if args.schemes is None or s[0] in args.schemes.split(",")]
    sizes = args.sizes.split(",")
    for size in sizes:
        shape = tuple(int(d) for d in size.split("x"))
        for label, scheme, calibration, compiled in chosen:
            row = bench(shape, label, scheme, calibration, compiled and size == args.compile_size, copy_bps,
                        flushed_copy_bps, eager=not args.no_eager)
            if size == sizes[-1] and two_pass(scheme) and calibration is MinMax:
                x = torch.randn(shape, device="cuda").to(torch.bfloat16)
                row["streamed"] = streamed(x, scheme, calibration)
                del x
            torch.cuda.empty_cache()
            result["rows"].append(row)
            (args.out / "kernels.json").write_text(json.dumps(result, indent=1))
            extra = ""
            if "compiled_ms" in row:
                extra = (f" compiled {row['compiled_gbps']:7.1f} GB/s ({row['speedup_vs_compiled']:.1f}x)"
                         f" compiled-diff {row['compiled_differing_bytes_vs_eager']}")
            if "given_range_ms" in row:
                extra += (f" given range {100 * row['given_range_copy_fraction']:5.1f}%"
                          f" (graph {100 * row['given_range_graph_copy_fraction']:5.1f}%)"
                          f" ={row['given_range_identical']}")
            if "streamed" in row:
                extra += " upload {upload_s:.4f} s, with range {upload_with_range_s:.4f} s".format(**row["streamed"])
            extra += f" flushed {100 * row['flushed_copy_fraction']:5.1f}%, host {1e3 * row['host_ms']:.1f} us/launch"
            if "given_range_flushed_copy_fraction" in row:
                extra += f" given range flushed {100 * row['given_range_flushed_copy_fraction']:5.1f}%"
            print(f"{size:>11} {label:30s} {row['triton_gbps']:7.1f} GB/s {100 * row['copy_fraction']:5.1f}% "
                  f"of copy (graph {100 * row['graph_copy_fraction']:5.1f}%, launched/graph "
                  f"{row['launched_of_graph']:.2f})  =cpu {row['triton_identical_to_cpu_codec']}"
                  f"{extra}", flush=True)


if __name__ == "__main__":
    main()
