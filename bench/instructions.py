"""Instructions per value of the quantize launch each benchmark scheme takes, compiled here for sm_90.

Run from the repository root, no GPU needed: `python3 -m bench.instructions --out DIR`. For each scheme of
`bench.kernels` at a size it works out the launch the GPU pipeline makes (`qcli.kernels.launch`: the
fused kernels, or the tensor kernel given the range), specialized as Triton's JIT specializes it on an
aligned launch, compiles it for sm_90 and counts the SASS instructions of one program. The kernels are
straight-line code, so a program issues each once: `count × warps / values` warp instructions a value.
An H200 issues at most one warp instruction per scheduler and clock (132 SMs, 4 schedulers, 1.98 GHz),
which bounds the values a second, and with the bytes a value moves, the fraction of copy bandwidth
(`--copy`, bytes read plus written a second) that issue alone allows. Writes instructions.json.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget

from bench.kernels import SCHEMES, two_pass
from qcli import layout
from qcli.kernels import launch as E
from qcli.kernels.launcher import Launch
from qcli.scheme import Calibration

_ISSUE_PER_S = 132 * 4 * 1.98e9  # warp instructions a second: an H200's SMs, schedulers and boost clock
_SASS_LINE = re.compile(r"^\S+\t(\S.*?)\s*;")  # an instruction, after its control codes
_TYPES = {torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.int32: "*i32", torch.uint8: "*u8"}


def quantize_launch(scheme, calibration: Calibration, shape: tuple[int, ...]) -> tuple[Launch, tuple]:
    """The quantize launch the pipeline makes for `shape` from bf16, and its pointers' element types
    (None for an absent pointer)."""
    values = torch.int32 if scheme.size_bits_stored() == 32 else torch.uint8
    if two_pass(scheme) and scheme.block is None:  # given its range
        return E.tensor_launch(scheme, shape, True), (torch.bfloat16, values, torch.float32, torch.uint8, None, None)
    fused = E.fused_launch(scheme, shape, torch.bfloat16, calibration)
    if fused is None:
        raise SystemExit(f"{scheme}: no fused launch")
    two_level = scheme.is_two_level()
    return fused[0], (torch.bfloat16, values, torch.uint8, torch.uint8 if two_level else None,
                      torch.float32 if two_level else None, torch.int32)


def compiled(launch: Launch, pointers: tuple):
    """The launch's kernel compiled for sm_90 as the JIT compiles it for 16-byte aligned pointers."""
    names = launch.kernel.arg_names
    args = list(pointers) + list(launch.ints)
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(names):
        if name in launch.constexprs:
            signature[name] = "constexpr"
            constexprs[name] = launch.constexprs[name]
        elif i < len(pointers):
            signature[name] = "constexpr" if args[i] is None else _TYPES[args[i]]
            if args[i] is None:
                constexprs[name] = None
            else:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            value = args[i]
            signature[name] = "i64" if abs(value) >= 2**31 else "i32"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    options = {k: launch.constexprs[k] for k in ("num_warps", "enable_fp_fusion") if k in launch.constexprs}
    for k in options:
        signature.pop(k, None)
        constexprs.pop(k, None)
    source = triton.compiler.ASTSource(launch.kernel, signature, constexprs, attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shape", default="16384x16384")
    parser.add_argument("--copy", type=float, default=4.24e12, help="copy bandwidth, bytes read + written a second")
    args = parser.parse_args()
    shape = tuple(int(d) for d in args.shape.split("x"))
    rows = []
    for label, scheme, calibration, _ in SCHEMES:
        launch, pointers = quantize_launch(scheme, calibration, shape)
        kernel = compiled(launch, pointers)
        instructions = [m.group(1) for m in map(_SASS_LINE.search, kernel.asm["sass"].splitlines()) if m]
        warps = launch.constexprs["num_warps"]
        c = launch.constexprs
        values = c["G"] * c["U"] * c["N"] * c.get("BR", 1)
        per_value = len(instructions) * warps / values
        bytes_per_value = (2 * shape[0] * shape[1] + layout.quantized_data_len(scheme, shape)) / (shape[0] * shape[1])
        bound = _ISSUE_PER_S / per_value * bytes_per_value / args.copy
        rows.append({"label": label, "kernel": launch.kernel.__name__, "sass_instructions": len(instructions),
                     "warps": warps, "values_per_program": values, "warp_instructions_per_value": per_value,
                     "bytes_per_value": bytes_per_value, "issue_bound_copy_fraction": bound,
                     "fp32_ops": sum(i.split()[0].startswith(("FMUL", "FADD", "FFMA", "FSETP", "FMNMX"))
                                     for i in instructions)})
        print(f"{label:30s} {launch.kernel.__name__:28s} {len(instructions):5d} SASS, {warps} warps, {values:5d} "
              f"values: {per_value:.3f} warp instr/value, issue allows {100 * bound:5.1f}% of copy", flush=True)
    (args.out / "instructions.json").write_text(json.dumps({"shape": list(shape), "triton": triton.__version__,
                                                            "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
