"""The CPU path against gguf-py's numpy quantizer, and the CPU path's peak memory.

Run from the repository root: `python3 -m bench.cpu_vs_gguf [--runs N] [--doc docs/benchmarks.md]`
(needs `pip install gguf`). One seeded 4096x4096 standard-normal f32 matrix; qcli's `encode` with Q8S
and Q4S, block [32], F16 scales, PackedU32, against gguf's `quants.quantize` with Q8_0 and Q4_0 (the
same value width, block of 32 and f16 scale). Median wall time of `--runs` runs each, with torch's
default thread count (with OpenMP's passive wait, which the qcli command sets, and with its default
spin-wait) and with one thread, each in a fresh process where qcli and gguf runs alternate; gguf is
numpy, single-threaded. Peak memory:
each of a few inputs is encoded in a fresh subprocess, reading the peak RSS (ru_maxrss) before and
after. Prints a markdown section; `--doc` also replaces that section in the given file.

Other processes share small machines: the load average is printed before and after; re-run when quiet.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch

from bench.markdown import replace_section
from qcli.codec import encode
from qcli.scheme import QuantScheme, QuantValue, ScaleDtype

SECTION = "## CPU path against gguf-py (this 2-core machine)"
SHAPE = (4096, 4096)
MEMORY_CASES = [  # (shape, source dtype)
    ((8192, 8192), "float32"),
    ((8192, 8192), "bfloat16"),
]
ROOT = Path(__file__).resolve().parents[1]


def _scheme(value: QuantValue) -> QuantScheme:
    return QuantScheme().with_value(value).per_block([32], ScaleDtype.F16)


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


CONFIGS = [  # (label of the threads column, torch threads or None for the default, OMP_WAIT_POLICY)
    ("default, passive wait (the qcli command's setting)", None, "PASSIVE"),
    ("default, OpenMP's default spin-wait", None, None),
    ("1", 1, None),
]


PAIRS = [(QuantValue.Q8S, "Q8_0"), (QuantValue.Q4S, "Q4_0")]  # same value width, block 32, f16 scale


def time_throughput(runs: int) -> list[tuple[str, str, float, float]]:
    """(qcli value, threads label, qcli seconds, gguf seconds), each configuration in a fresh process
    (OpenMP reads its wait policy when torch loads)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | {"PYTHONPATH": str(ROOT)}
    rows = []
    for label, threads, policy in CONFIGS:
        child_env = env | ({"OMP_WAIT_POLICY": policy} if policy else {})
        args = [sys.executable, "-m", "bench.cpu_vs_gguf", "--child", str(threads or 0), "--runs", str(runs)]
        out = subprocess.run(args, check=True, capture_output=True, text=True, env=child_env, cwd=ROOT).stdout
        rows += [(value, label, ours, peer) for value, ours, peer in json.loads(out)]
    return rows


def _child(threads: int, runs: int) -> None:
    """Print [value, qcli median s, gguf median s] per pair as JSON. qcli and gguf runs alternate, so a
    change in the machine's load reaches both sides of a ratio alike."""
    from gguf import GGMLQuantizationType, quants

    if threads:
        torch.set_num_threads(threads)
    w = _matrix()
    x = torch.from_numpy(w)
    results = []
    for value, qtype in PAIRS:
        scheme, ggml = _scheme(value), GGMLQuantizationType[qtype]
        ours, peer = [], []
        for _ in range(runs + 1):  # the first run of each warms up
            ours.append(_seconds(encode, x, scheme))
            peer.append(_seconds(quants.quantize, w, ggml))
        results.append((str(value), statistics.median(ours[1:]), statistics.median(peer[1:])))
    print(json.dumps(results))


def _seconds(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def _matrix() -> np.ndarray:
    return np.random.default_rng(0).standard_normal(SHAPE, dtype=np.float32)


_MEMORY_CHILD = """
import resource, sys, torch
from qcli.codec import encode
from qcli.scheme import QuantScheme, QuantValue, ScaleDtype
rows, cols, dtype = int(sys.argv[1]), int(sys.argv[2]), getattr(torch, sys.argv[3])
x = torch.randn(rows, cols, dtype=dtype)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
payload = encode(x, QuantScheme().with_value(QuantValue.Q4S).per_block([32], ScaleDtype.F16))
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(x.numel() * x.element_size(), payload.numel(), (after - before) * 1024)
"""


def measure_memory() -> list[tuple[tuple[int, int], str, int, int, int]]:
    """(shape, dtype, input bytes, payload bytes, peak RSS growth during encode in bytes) per case."""
    results = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for shape, dtype in MEMORY_CASES:
        out = subprocess.run(
            [sys.executable, "-c", _MEMORY_CHILD, str(shape[0]), str(shape[1]), dtype],
            check=True, capture_output=True, text=True, env=env,
        ).stdout.split()
        results.append((shape, dtype, *map(int, out)))
    return results


NOTES = """\
How the CPU path is built (`qcli/codec/`): scales over the whole tensor first, then values, both a row
chunk at a time (`quantize.CHUNK_ELEMENTS` = 2^18 elements per torch thread, 1 MiB of f32, so a core's
share and its temporaries stay in its L2); every op is vectorized torch on all of torch's threads. Per
chunk: one |x| pass and one max (or f64 sum) per block written straight into the scale grid; one IEEE
division by the broadcast scale, clamp, round half to even, int8; sub-byte fields masked and gathered
into their byte by one integer multiply, written straight into the payload. A bf16/f16 or transposed
input is widened or gathered a chunk at a time.

Peak memory of `encode`, beyond its input: the payload, plus a few f32 temporaries the size of the scale
grid (4 bytes per block each), plus a few chunk-sized temporaries (a few MiB) — bounded by the tensor,
never a whole f32 copy of it. The CPU pipeline passes tensors to `encode` without a contiguous copy.

The machine is shared: other sessions' test runs take CPU time (the load average above). With OpenMP's
default spin-wait, torch's threads spin at every barrier; while another process holds a core, a spinning
thread starves its busy peer, which is why the `qcli` command sets OMP_WAIT_POLICY=PASSIVE (unless the
user set it). The spin-wait rows show what spinning cost at this run's load. Under heavy load even
passive waiting loses to one thread, since each barrier waits for the thread that was descheduled.
"""


def report(rows: list[tuple[str, str, float, float]], memory, facts: dict[str, str]) -> str:
    n = SHAPE[0] * SHAPE[1]
    gguf = dict((str(v), q) for v, q in PAIRS)
    lines = [SECTION, "", *(f"- {k}: {v}" for k, v in facts.items()), ""]
    lines += [
        f"{SHAPE[0]}x{SHAPE[1]} f32, seeded standard normal; median wall time; qcli and gguf runs alternate "
        "in one process per row (gguf is numpy, one thread, whatever torch's setting).",
        "",
        "| qcli, [32] F16 | torch threads | qcli ms | qcli M el/s | gguf | gguf ms | gguf M el/s | qcli × gguf |",
        "|---|---|---:|---:|---|---:|---:|---:|",
    ]
    for value, threads, ours, peer in rows:
        lines.append(
            f"| {value} | {threads} | {ours * 1e3:.1f} | {n / ours / 1e6:.0f} | {gguf[value]} | {peer * 1e3:.1f} "
            f"| {n / peer / 1e6:.0f} | {peer / ours:.2f} |"
        )
    lines += ["", "Peak memory of `encode` (Q4S [32] F16), peak RSS growth in a fresh process:", ""]
    lines += ["| input | input MiB | payload MiB | peak growth MiB |", "|---|---:|---:|---:|"]
    for shape, dtype, in_bytes, out_bytes, growth in memory:
        mib = [f"{b / (1 << 20):.0f}" for b in (in_bytes, out_bytes, growth)]
        lines.append(f"| {shape[0]}x{shape[1]} {dtype} | " + " | ".join(mib) + " |")
    return "\n".join(lines + ["", NOTES]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--doc", type=Path, help="markdown file whose section to replace with the results")
    parser.add_argument("--child", type=int, metavar="THREADS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        return _child(args.child, args.runs)
    load_before = _load()
    rows = time_throughput(args.runs)
    memory = measure_memory()
    facts = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "CPU": f"{_cpu_model()}, {os.cpu_count()} cores, torch's default threads {torch.get_num_threads()}",
        "versions": f"python {platform.python_version()}, torch {torch.__version__}, numpy {np.__version__}, "
        f"gguf {version('gguf')}",
        "load average (1, 5, 15 min)": f"before {load_before}, after {_load()}",
    }
    section = report(rows, memory, facts)
    print(section)
    if args.doc:
        replace_section(args.doc, section)


if __name__ == "__main__":
    main()
