"""Tile size and warps of the quantize kernel, per scheme: median time and fraction of copy bandwidth.

Run on a CUDA machine from the repository root: `python3 -m bench.tune --out DIR`. Only the launch
configuration changes between variants (values per program, warps per program, units per group where
scales come from elsewhere), never the arithmetic. Per-tensor and two-level schemes are timed given
their range, as the GPU pipeline launches them.
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

import torch

from bench.kernels import SCHEMES, copy_bandwidth, median_ms, two_pass
from qcli import layout
from qcli.kernels import launch as E
from qcli.kernels import tensor_range


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shape", default="16384x16384")
    parser.add_argument("--tiles", default="1024,2048,4096,8192", help="values per program to try")
    parser.add_argument("--warps", default="2,4,8", help="warps per program to try")
    parser.add_argument("--group-values", default="64,32",
                        help="values per group of the blocks and tensor kernels, which take their scales whole")
    parser.add_argument("--schemes", help="comma-separated labels (default: all)")
    args = parser.parse_args()
    shape = tuple(int(d) for d in args.shape.split("x"))
    copy_bps = copy_bandwidth(1 << 30)
    x = (torch.randn(shape, device="cuda") * torch.exp(torch.randn(shape, device="cuda"))).to(torch.bfloat16)
    bad = torch.zeros(1, dtype=torch.int32, device="cuda")
    rows = []
    variants = [(tile, warps, units) for tile in map(int, args.tiles.split(","))
                for warps in map(int, args.warps.split(",")) for units in map(int, args.group_values.split(","))]
    for label, scheme, calibration, _ in SCHEMES:
        if args.schemes is not None and label not in args.schemes.split(","):
            continue
        out = torch.empty(layout.quantized_data_len(scheme, shape), dtype=torch.uint8, device="cuda")
        whole = tensor_range(x, scheme, calibration, bad) if two_pass(scheme) else None
        reference = None
        best = None
        for tile, warps, units in variants:
            E.TILE, E.WARPS, E.WIDE_WARPS = tile, warps, warps
            E.BLOCKS_GROUP = E.TENSOR_GROUP = units
            E.clear_launch_caches()  # each shape's launch was worked out under the previous variant
            out.fill_(0xA5)
            E.enqueue(x, scheme, calibration, out, bad, whole=whole)
            reference = out.clone() if reference is None else reference
            same = bool(torch.equal(out, reference))
            ms = median_ms(partial(E.enqueue, x, scheme, calibration, out, bad, whole=whole), rep=100)
            fraction = (x.nbytes + out.numel()) / (ms * 1e-3) / copy_bps
            rows.append({"label": label, "tile": tile, "warps": warps, "group_values": units, "ms": ms,
                         "copy_fraction": fraction, "same_bytes": same})
            if best is None or ms < best[0]:
                best = (ms, tile, warps, units, fraction)
        print(f"{label:30s} best tile {best[1]:5d} warps {best[2]:2d} group values {best[3]:3d}: "
              f"{100 * best[4]:5.1f}% of copy", flush=True)
        record = {"copy_bytes_per_s": copy_bps, "rows": rows}
        (args.out / "tune.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
