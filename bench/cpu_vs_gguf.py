"""The CPU path (`qcli.codec.encode`) against gguf-py's numpy quantizer on one 4096 x 4096 f32 matrix.

Run from the repository root with the `gguf` package installed: `python3 -m bench.cpu_vs_gguf [--out DIR]`.
Pairs: Q8S and Q4S with F16 scales over blocks of 32 against gguf's Q8_0 and Q4_0 (also blocks of 32 with
an f16 scale). Median of 5 runs each, in values per second; writes cpu_vs_gguf.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, quants

from qcli.codec import encode
from qcli.scheme import QuantScheme, QuantValue, ScaleDtype

PAIRS = [("Q8S b32 F16", QuantValue.Q8S, GGMLQuantizationType.Q8_0),
         ("Q4S b32 F16", QuantValue.Q4S, GGMLQuantizationType.Q4_0)]


def median_seconds(fn, runs: int = 5) -> float:
    fn()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    w = np.random.default_rng(0).standard_normal((4096, 4096), dtype=np.float32)
    x = torch.from_numpy(w)
    result = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
              "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "numpy": np.__version__,
              "rows": []}
    for label, value, ggml in PAIRS:
        scheme = QuantScheme().with_value(value).per_block([32], ScaleDtype.F16)
        ours = median_seconds(lambda scheme=scheme: encode(x, scheme))
        theirs = median_seconds(lambda ggml=ggml: quants.quantize(w, ggml))
        row = {"label": label, "gguf": ggml.name, "qcli_melems_per_s": w.size / ours / 1e6,
               "gguf_melems_per_s": w.size / theirs / 1e6, "speedup": theirs / ours}
        result["rows"].append(row)
        print(f"{label} {row['qcli_melems_per_s']:7.1f} M/s  gguf {ggml.name} "
              f"{row['gguf_melems_per_s']:7.1f} M/s  {row['speedup']:.2f}x", flush=True)
    if args.out:
        (args.out / "cpu_vs_gguf.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
