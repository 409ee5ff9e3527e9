"""Compile every kernel variant a set of schemes launches for sm_90 (H200) here, without a GPU.

Run as `python3 -m bench.compile_sm90` from the repository root.

Step 1 (TRITON_INTERPRET=1) encodes small tensors and records each launch's argument types and
constexprs; step 2 (a fresh interpreter without it) compiles them with Triton's bundled ptxas and counts
the PTX instructions that would break byte-identity, so compiler-only failures show up before device time
is spent. `--digests FILE` also writes each variant's PTX digest (debug lines left out): two revisions
whose digests agree run the same code on the device.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import subprocess
import sys

KERNELS = {"_quantize": ("quantize_fused_kernel", "quantize_fused_rows_kernel", "quantize_blocks_kernel",
                         "quantize_tensor_kernel", "alpha_kernel", "scales_kernel"),
           "_search": ("quantize_searched_kernel",), "_gptq": ("gptq_columns_kernel",)}
_OPTION_NAMES = ("enable_fp_fusion", "num_warps")


def _record(path: str) -> None:
    import torch
    import triton.language as tl

    from qcli.calibrate.gptq import columns_in_kernel
    from qcli.kernels import encode
    from qcli.kernels import gptq as gptq_kernel
    from qcli.scheme import Calibration
    from tests.cases import all_schemes
    from tests.kernels.test_kernels import SEARCHED

    seen: dict[str, dict] = {}
    types = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
              torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8"}

    def arg_type(a) -> str:
        if isinstance(a, torch.Tensor):
            return "*" + types[a.dtype]
        if isinstance(a, float):
            return "fp32"
        return "i64" if abs(a) >= 2**31 else "i32"

    for module, name in _kernels():
        fn = getattr(module, name)

        class Recorder:
            def __init__(self, fn=fn, name=name):
                self.fn, self.name = fn, name
                self.arg_names = fn.arg_names  # what a memoized launch orders its constexprs by

            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    options = {k: kwargs.pop(k) for k in _OPTION_NAMES if k in kwargs}
                    params = inspect.signature(self.fn.fn).parameters
                    values = dict(zip(params, args, strict=False)) | kwargs
                    # an absent pointer (None) is a constexpr to Triton too
                    constexprs = {n: v for n, v in values.items()
                                  if params[n].annotation is tl.constexpr or v is None}
                    sig = {n: "constexpr" if n in constexprs else arg_type(values[n]) for n in params}
                    seen[json.dumps([self.name, sig, constexprs, options], sort_keys=True)] = {}
                    return self.fn[grid](*args, **kwargs, **options)
                return launch

        setattr(module, name, Recorder())
    for scheme, calibration, shape in all_schemes():
        for dtype in (torch.float32, torch.bfloat16):
            encode(torch.randn(shape).to(dtype), scheme, calibration)
    for scheme in SEARCHED:  # the searched kernel, unweighed and weighed by column and by row
        for importance in (None, torch.rand(96), torch.rand(4, 1)):
            encode(torch.randn(4, 96), scheme, Calibration.Mse, importance=importance)
    for scheme in {s for s in SEARCHED if gptq_kernel.takes(s, (16, 64), False, 128)}:  # GPTQ's column kernel
        for search, importance in ((False, None), (True, None), (True, torch.rand(64))):
            w = torch.randn(16, 64)
            columns_in_kernel(w, torch.eye(64), scheme, search, w.abs().amax(), 128, importance)
    with open(path, "w") as f:
        json.dump(sorted(seen), f)


def _kernels() -> list:
    """(module, kernel name) of every kernel, their modules imported."""
    import importlib

    return [(importlib.import_module(f"qcli.kernels.{module}"), name)
            for module, names in KERNELS.items() for name in names]


def _digest(ptx: str) -> str:
    """The PTX's digest without its debug lines (source locations), which move with every edit."""
    code = (line for line in ptx.splitlines() if not line.lstrip().startswith((".loc", ".file", "//"))
            and "debug" not in line)
    return hashlib.sha256("\n".join(code).encode()).hexdigest()


def _compile(path: str, digests: str | None) -> None:
    import triton
    from triton.backends.compiler import GPUTarget

    kernels = {name: getattr(module, name) for module, name in _kernels()}
    failures, digested = 0, {}
    for entry in json.load(open(path)):
        name, sig, constexprs, options = json.loads(entry)
        src = triton.compiler.ASTSource(kernels[name], sig, constexprs)
        try:
            kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
            ptx = kernel.asm["ptx"]
            # Flushed subnormals, approximate division or a fused multiply-add would change the bytes.
            risky = {op: ptx.count(op) for op in (".ftz", "div.approx", "div.full", "fma.rn.f32")}
            digested[entry] = _digest(ptx)
            print(f"ok   {name} {risky} {options} {constexprs}")
        except Exception as exc:  # report every variant, then fail
            failures += 1
            print(f"FAIL {name} {constexprs}: {str(exc).splitlines()[-1] if str(exc) else exc!r}")
    if digests is not None:
        with open(digests, "w") as f:
            json.dump(digested, f, indent=1, sort_keys=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    record = "/tmp/qcli_kernel_variants.json"
    if len(sys.argv) > 1 and sys.argv[1] == "record":
        _record(record)
    else:
        env = dict(os.environ, TRITON_INTERPRET="1")
        subprocess.run([sys.executable, "-m", "bench.compile_sm90", "record"], check=True, env=env)
        _compile(record, sys.argv[2] if len(sys.argv) > 2 and sys.argv[1] == "--digests" else None)
