"""The whole `qcli quantize --device cpu` command: what statistics and verification cost, and its peak memory.

Run from the repository root:

    python3 -m bench.cpu_command --dir /tmp/qbench [--layers 6] [--runs 3] [--doc docs/benchmarks.md]

A seeded bf16 checkpoint of `--layers` Llama-shaped layers (q_proj 4096x4096, up_proj 14336x4096,
down_proj 4096x14336, a norm) is written once, then quantized with the default preset in fresh child
processes, alternating the default (`--stats --verify`), `--no-stats`, `--no-verify` and
`--no-stats --no-verify`, `--runs` times each, the input in the page cache. For each it records the
process's wall time from exec to exit, the command's own timings and memory (its `--json` document),
whose peak RSS is the kernel's VmHWM (wait4's ru_maxrss would also count what this process held when
it forked the child). Prints a markdown section; `--doc` also
replaces that section in the given file.

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

from bench.markdown import replace_section

SECTION = "## CPU command: statistics, verification and peak memory (this 2-core machine)"
FLAGS = {
    "defaults": [],
    "--no-stats": ["--no-stats"],
    "--no-verify": ["--no-verify"],
    "--no-stats --no-verify": ["--no-stats", "--no-verify"],
}
SHAPES = {"self_attn.q_proj.weight": (4096, 4096), "mlp.up_proj.weight": (14336, 4096),
          "mlp.down_proj.weight": (4096, 14336), "input_layernorm.weight": (4096,)}


def checkpoint(directory: Path, layers: int) -> Path:
    path = directory / f"llama-{layers}-layers.safetensors"
    if path.exists():
        return path
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(0)
    tensors = {f"model.layers.{i}.{name}": torch.randn(shape, generator=generator).to(torch.bfloat16)
               for i in range(layers) for name, shape in SHAPES.items()}
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, path)
    return path


def run_once(source: Path, output: Path, flags: list[str]) -> dict:
    command = [sys.executable, "-m", "qcli", "quantize", str(source), "-o", str(output), "--force",
               "--device", "cpu", "--json", *flags]
    started = time.perf_counter()
    child = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - started
    doc = json.loads(child.stdout)
    return {"wall_seconds": wall, "timings": doc["timings"],
            "memory": doc["memory"], "expected_bytes": doc["totals"]["peak_memory_bytes"],
            "model_bytes": doc["totals"]["bytes_in"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--doc", type=Path)
    args = parser.parse_args()
    source = checkpoint(args.dir, args.layers)
    load_before = os.getloadavg()
    subprocess.run(["cat", str(source)], stdout=subprocess.DEVNULL, check=True)  # into the page cache
    runs: dict[str, list[dict]] = {name: [] for name in FLAGS}
    for _ in range(args.runs):
        for name, flags in FLAGS.items():
            runs[name].append(run_once(source, args.dir / "out.bpk", flags))
    section = _markdown(runs, source, args, load_before, os.getloadavg())
    print(section)
    (args.dir / "cpu_command.json").write_text(json.dumps(runs, indent=1))
    if args.doc:
        replace_section(args.doc, section)


def _median(rows: list[dict], key) -> float:
    return statistics.median(key(row) for row in rows)


def _markdown(runs: dict, source: Path, args, load_before, load_after) -> str:
    base = runs["--no-stats --no-verify"]
    base_wall = _median(base, lambda r: r["wall_seconds"])
    base_total = _median(base, lambda r: r["timings"]["total_seconds"])
    first = runs["defaults"][0]
    lines = [
        SECTION, "",
        f"{datetime.now(UTC):%Y-%m-%d}, {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"torch {version('torch')}, qcli {version('qcli')}. `python3 -m bench.cpu_command --dir {args.dir} "
        f"--layers {args.layers} --runs {args.runs}`: {first['model_bytes'] / 2**30:.2f} GiB bf16 checkpoint, "
        f"largest tensor {14336 * 4096 * 2 / 2**20:.0f} MiB, default preset, input cached; medians of "
        f"{args.runs} runs; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after.", "",
        "| flags | process wall s | × | command total s | × | quantize s | stats s | write s | verify s "
        "| peak RSS MiB | tensors MiB (expected) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in runs.items():
        wall = _median(rows, lambda r: r["wall_seconds"])
        total = _median(rows, lambda r: r["timings"]["total_seconds"])
        phase = {p: _median(rows, lambda r, p=p: (r["timings"][p] or {"seconds": 0.0})["seconds"])
                 for p in ("quantize", "stats", "write", "verify")}
        rss = _median(rows, lambda r: r["memory"]["peak_bytes"]) / 2**20
        tensors = _median(rows, lambda r: r["memory"]["tensors_bytes"]) / 2**20
        expected = rows[0]["expected_bytes"] / 2**20
        lines.append(f"| {name} | {wall:.2f} | {wall / base_wall:.2f} | {total:.2f} | {total / base_total:.2f} | "
                     f"{phase['quantize']:.2f} | {phase['stats']:.2f} | {phase['write']:.2f} | {phase['verify']:.2f} | "
                     f"{rss:.0f} | {tensors:.0f} ({expected:.0f}) |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
