"""What the scale search (`--calibration mse`) costs: one seeded standard-normal f32 matrix encoded under
MinMax and under Mse, per preset, median of `--runs` runs. On the CPU (`--device cpu`, 4096x4096) the
codec's `encode` with torch's default thread count (OpenMP's passive wait, as the qcli command sets it);
on a GPU (`--device cuda`, 8192x8192 bf16) the kernels' `encode`, synchronized, with a check that its
bytes are the CPU codec's. On the CPU the Mse encode's time inside the compiled search loop
(`qcli.codec.search_loop`) is also given, as the rate it alone would reach, and its rate by the process's
CPU time (weights × threads / CPU seconds): what the threads would reach with the cores to themselves,
never waiting, a figure other processes on a loaded machine disturb less than the wall clock.

    python3 -m bench.search [--device cpu|cuda] [--runs 5] [--presets q4s-b32 q4f-b32 ...]

Other processes share small machines: the load average is printed before and after; re-run when quiet.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402  (after the OpenMP setting, which torch reads when it loads)

from qcli import codec  # noqa: E402
from qcli.codec import search_loop  # noqa: E402
from qcli.presets import PRESETS  # noqa: E402
from qcli.scheme import Calibration  # noqa: E402

SHAPE = (4096, 4096)
GPU_SHAPE = (8192, 8192)
DEFAULT_PRESETS = ["q4s-b32", "q4f-b32", "q8s-b32", "q2s-b32", "fp4-b32", "e4m3-b32", "q8s"]


def seconds(x: torch.Tensor, preset: str, calibration: Calibration, runs: int) -> tuple[float, float, float]:
    """The median seconds of an encode, of the time inside the CPU's compiled search loop in it, and of the
    process's CPU time in it."""
    scheme = PRESETS[preset].scheme
    encode = _encoder(x.device)
    first = encode(x, scheme, calibration)  # warm: compiles, allocator, minifloat tables
    if x.is_cuda:
        assert torch.equal(first.cpu(), codec.encode(x.cpu(), scheme, calibration)), (preset, calibration)
    times, looped, cpu = [], [], []
    for _ in range(runs):
        with LoopClock() as loop:
            start, cpu_start = time.perf_counter(), time.process_time()
            encode(x, scheme, calibration)
            if x.is_cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - cpu_start)
        looped.append(loop.seconds)
    return statistics.median(times), statistics.median(looped), statistics.median(cpu)


class LoopClock:
    """The seconds spent in the compiled loop's entries (`search_loop.choose`, which block schemes call,
    and `errors`, which a per-tensor scale's search calls) while the block runs; they are restored after."""

    ENTRIES = ("choose", "errors")

    def __enter__(self) -> LoopClock:
        self.seconds = 0.0
        self._entries = {name: getattr(search_loop, name) for name in self.ENTRIES}
        for name, entry in self._entries.items():
            setattr(search_loop, name, self._timed(entry))
        return self

    def _timed(self, entry):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return entry(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed

    def __exit__(self, *exc) -> None:
        for name, entry in self._entries.items():
            setattr(search_loop, name, entry)


def _encoder(device: torch.device):
    if device.type == "cuda":
        from qcli.kernels import encode

        return encode
    return codec.encode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--presets", nargs="+", default=DEFAULT_PRESETS)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    if args.device == "cuda":
        x = torch.randn(GPU_SHAPE, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16).cuda()
        where = torch.cuda.get_device_name()
    else:
        x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0))
        where = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    print(f"{where}, torch {torch.__version__}, {torch.get_num_threads()} threads; load {os.getloadavg()[0]:.2f}")
    print("| preset | MinMax M weights/s | Mse M weights/s | its compiled loop alone | Mse by CPU time "
          "| Mse / MinMax time |")
    print("|---|---|---|---|---|---|")
    threads = torch.get_num_threads()
    for preset in args.presets:
        fast, _, _ = seconds(x, preset, Calibration.MinMax, args.runs)
        searched, loop, cpu = seconds(x, preset, Calibration.Mse, args.runs)
        alone = f"{x.numel() / loop / 1e6:.0f}" if loop else "-"
        by_cpu = f"{x.numel() * threads / cpu / 1e6:.0f}" if args.device == "cpu" else "-"
        print(f"| {preset} | {x.numel() / fast / 1e6:.0f} | {x.numel() / searched / 1e6:.1f} | {alone} | {by_cpu} |"
              f" {searched / fast:.1f}x |", flush=True)
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
