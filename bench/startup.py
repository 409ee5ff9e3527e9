"""What a command pays before and after its work: whole processes, exec to exit, beside their floors.

Run from the repository root:

    python3 -m bench.startup [--runs 7]

Each row is a fresh child process, the median and the least of `--runs` wall times: `qcli --help`,
`--version`, `validate-scheme` of the sample recipe, `inspect` and a dry run of a 16 KB checkpoint (a
64 x 64 f32 matrix), and that checkpoint quantized on the CPU; beside them the floors, an interpreter that
does nothing, one that imports torch (and exits, as Python does, tearing it down) and one that imports it
and exits at once, as qcli does once its work is done. The `qcli` rows run
the console script's `main` as the installed command does (`python -c`, so no shim of a version manager
is timed).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QCLI = "import sys; from qcli.cli import main; sys.argv[0] = 'qcli'; main()"


def timed(command: list[str], runs: int) -> tuple[float, float]:
    """The median and least wall seconds of `runs` runs of `command` (each must exit 0)."""
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, cwd=ROOT)
        seconds.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr.decode()[-2000:]}")
    return statistics.median(seconds), min(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    import torch
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as tmp:
        small = Path(tmp) / "small.safetensors"
        save_file({"w": torch.randn(64, 64, generator=torch.Generator().manual_seed(0))}, str(small))
        out = str(Path(tmp) / "small.bpk")
        python = [sys.executable, "-c"]
        rows = [
            ("floor: python, nothing imported", python + ["pass"]),
            ("floor: python importing torch", python + ["import torch"]),
            ("floor: python importing torch, exiting at once (os._exit)", python + ["import os, torch; os._exit(0)"]),
            ("qcli --help", python + [QCLI, "--help"]),
            ("qcli --version", python + [QCLI, "--version"]),
            ("qcli validate-scheme sample_weights/tiny-llama.toml", python + [QCLI, "validate-scheme",
                                                                              "sample_weights/tiny-llama.toml"]),
            (f"qcli inspect (a {small.stat().st_size // 1024} KB checkpoint)", python + [QCLI, "inspect", str(small)]),
            ("qcli quantize --dry-run (the same)", python + [QCLI, "quantize", str(small), "-o", out, "--dry-run"]),
            ("qcli quantize --device cpu (the same)", python + [QCLI, "quantize", str(small), "-o", out, "--force",
                                                                "--device", "cpu", "--quiet"]),
        ]
        print(f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, torch "
              f"{torch.__version__}; load {os.getloadavg()[0]:.2f}; {args.runs} runs each\n")
        print("| command | median s | least s |\n|---|---:|---:|")
        for label, command in rows:
            median, least = timed(command, args.runs)
            print(f"| {label} | {median:.3f} | {least:.3f} |", flush=True)
        print(f"\nload {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
