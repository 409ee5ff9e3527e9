"""Where the fused Q4S block-32 kernel's time goes: the same tiles, loads and stores, with less arithmetic.

Run on a CUDA machine from the repository root: `python3 -m bench.ceiling`. Variants of one program
shape (4096 bf16 values, 2 warps, as `qcli.kernels.launch` launches it): `move` loads, packs 4 bits of every value's
bit pattern and stores words and one 2-byte scale per block (the real kernel's traffic, no math);
`+div_rn` adds an IEEE division per value; `+markstein` adds the reciprocal-and-residual division instead;
`qcli` is the real kernel. Prints each one's bytes in plus out per second as a fraction of copy.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bench.kernels import copy_bandwidth, median_ms
from qcli import layout
from qcli.kernels import enqueue
from qcli.scheme import Calibration, QuantScheme, QuantValue, ScaleDtype


@triton.jit
def _move(x_ptr, words_ptr, scales_ptr, DIVIDE: tl.constexpr, G: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    block = pid * G + tl.arange(0, G)
    unit = block[:, None] * 4 + tl.arange(0, 4)[None, :]
    k = tl.arange(0, 8)[None, None, :]
    x = tl.load(x_ptr + unit[:, :, None] * 8 + k).to(tl.float32)
    s = tl.max(tl.max(tl.abs(x), axis=2), axis=1) + 1.0
    if DIVIDE == 1:
        x = tl.math.div_rn(x, s[:, None, None])
    elif DIVIDE == 2:
        r = tl.math.div_rn(1.0, s)[:, None, None]
        q = x * r
        x = tl.fma(tl.fma(-q, s[:, None, None], x), r, q)
    field = x.to(tl.int32, bitcast=True) & 0xF
    tl.store(words_ptr + unit, tl.sum(field << (k * 4), axis=2))
    bits = s.to(tl.int32, bitcast=True)
    tl.store(scales_ptr + block * 2, (bits & 0xFF).to(tl.uint8))
    tl.store(scales_ptr + block * 2 + 1, ((bits >> 8) & 0xFF).to(tl.uint8))


def main() -> None:
    copy_bps = copy_bandwidth(1 << 30)
    shape = (16384, 16384)
    x = (torch.randn(shape, device="cuda") * torch.exp(torch.randn(shape, device="cuda"))).to(torch.bfloat16)
    scheme = QuantScheme().with_value(QuantValue.Q4S).per_block([32], ScaleDtype.F16)
    out = torch.empty(layout.quantized_data_len(scheme, shape), dtype=torch.uint8, device="cuda")
    words = out[: x.numel() // 2].view(torch.int32)
    scales = out[x.numel() // 2 :]
    moved = x.nbytes + out.numel()
    g = 4096 // 32
    grid = (x.numel() // 4096,)
    for name, divide in (("move", 0), ("+div_rn", 1), ("+markstein", 2)):
        ms = median_ms(lambda divide=divide: _move[grid](x, words, scales, DIVIDE=divide, G=g, num_warps=2))
        print(f"{name:12s} {moved / ms / 1e6:7.1f} GB/s {100 * moved / (ms * 1e-3) / copy_bps:5.1f}% of copy")
    bad = torch.zeros(1, dtype=torch.int32, device="cuda")
    ms = median_ms(lambda: enqueue(x, scheme, Calibration.MinMax, out, bad))
    print(f"{'qcli':12s} {moved / ms / 1e6:7.1f} GB/s {100 * moved / (ms * 1e-3) / copy_bps:5.1f}% of copy  "
          f"(copy {copy_bps / 1e12:.2f} TB/s)")


if __name__ == "__main__":
    main()
