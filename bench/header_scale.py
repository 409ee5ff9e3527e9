"""Planning and inspecting a header of many tensors: `qcli quantize --dry-run` and `qcli inspect` as whole processes.

Run from the repository root:

    python3 -m bench.header_scale --dir /tmp/qheader [--tensors 200000] [--runs 3] [--doc docs/benchmarks.md]

A safetensors file of `--tensors` tiny tensors (Llama's eight per layer: seven 4x32 bf16 projections and a
32-wide norm), written by the safetensors library, and a GGUF file of as many (4x32 f32 and 32-wide norms, by
the gguf package's writer), are made once; then each command runs `--runs` times in a fresh child process. For
each it records the process's wall time from exec to exit and the CPU time it used (user + system, the
child's rusage): the machine's other processes stretch the first, not the second. `--dry-run` is given
`--max-shard-size 10GB`, since one burnpack holds at most 100,000 tensors; `inspect --json` is the listing
without its table. A tenth of the tensors is timed too, to show the cost grows linearly. Prints a markdown
section; `--doc` also replaces that section in the given file.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

from bench.markdown import replace_section

SECTION = "## Headers of 200,000 tensors: plan and inspect (this 2-core machine)"
PROJECTIONS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
               "mlp.up_proj", "mlp.down_proj"]


def names(count: int) -> list[tuple[str, bool]]:
    """(name, is a norm) of `count` tensors, eight a layer."""
    layer = [(f"{p}.weight", False) for p in PROJECTIONS] + [("input_layernorm.weight", True)]
    return [(f"model.layers.{i // 8}.{layer[i % 8][0]}", layer[i % 8][1]) for i in range(count)]


def safetensors_file(directory: Path, count: int) -> Path:
    path = directory / f"header-{count}.safetensors"
    if not path.exists():
        import torch
        from safetensors.torch import save_file

        weight, norm = torch.ones(4, 32, dtype=torch.bfloat16), torch.ones(32, dtype=torch.bfloat16)
        save_file({name: (norm if is_norm else weight).clone() for name, is_norm in names(count)}, str(path))
    return path


def gguf_file(directory: Path, count: int) -> Path:
    path = directory / f"header-{count}.gguf"
    if not path.exists():
        import gguf
        import numpy as np

        writer = gguf.GGUFWriter(str(path), "llama")
        weight, norm = np.ones((4, 32), dtype=np.float32), np.ones(32, dtype=np.float32)
        for name, is_norm in names(count):
            writer.add_tensor(name, norm if is_norm else weight)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return path


def commands(source: Path, directory: Path) -> dict[str, list[str]]:
    return {
        "quantize --dry-run": ["quantize", str(source), "--dry-run", "--max-shard-size", "10GB", "-o",
                               str(directory / "out.bpk")],
        "inspect": ["inspect", str(source)],
        "inspect --json": ["inspect", str(source), "--json"],
    }


def run_once(args: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of `python -m qcli ARGS` in a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "qcli", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True, env={**os.environ, "COLUMNS": "155"})
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--tensors", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--doc", type=Path)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    rows = []
    for count in (args.tensors // 10, args.tensors):
        for make in (safetensors_file, gguf_file):
            source = make(args.dir, count)
            for label, command in commands(source, args.dir).items():
                runs = [run_once(command) for _ in range(args.runs)]
                rows.append((source.suffix, count, label, statistics.median(w for w, _ in runs),
                             statistics.median(c for _, c in runs)))
                print(*rows[-1], flush=True)
    floor = [run_once(["--version"]) for _ in range(args.runs)]
    section = _markdown(rows, floor, args, load_before, os.getloadavg())
    print(section)
    if args.doc:
        replace_section(args.doc, section)


def _markdown(rows, floor, args, load_before, load_after) -> str:
    lines = [
        SECTION, "",
        f"{datetime.now(UTC):%Y-%m-%d}, {platform.node()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, safetensors {version('safetensors')}, gguf {version('gguf')}, rich "
        f"{version('rich')}, qcli {version('qcli')}. `python3 -m bench.header_scale --dir {args.dir} --tensors "
        f"{args.tensors} --runs {args.runs}`: the median of {args.runs} run(s) of each, a fresh process each; "
        f"load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after (other work shared the cores: the CPU column is "
        f"what the process itself used). `qcli --version` alone: "
        f"{statistics.median(w for w, _ in floor):.2f} s wall, {statistics.median(c for _, c in floor):.2f} s CPU.",
        "",
        "| file | tensors | command | process wall s | process CPU s | CPU µs per tensor |",
        "|---|---|---|---|---|---|",
    ]
    for suffix, count, label, wall, cpu in rows:
        lines.append(f"| {suffix} | {count:,} | `{label}` | {wall:.2f} | {cpu:.2f} | {cpu / count * 1e6:.0f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
