"""PackedU32(1) cases for the Burn 0.23 harness, built by hand from the PackedU32(0) codec, apart from qcli's own
writing of the store (`--burn-version 0.23`), which tests/io/test_burn_023_recorded.py holds to these bytes.

    PYTHONPATH=. python3 tests/burn-0.23/packed_dim1.py DIR   # from the root: DIR/packed1.bpk, DIR/expected.safetensors

Burn 0.23's host layout (burn-std src/tensor/quantization/packing.rs, `PackedOrder`): a store packed along
`dim` (counted from the innermost axis) stores the tensor with that axis swapped innermost, read row-major,
each line padded to whole words; block scales of a block scheme are stored in the same order
(`ValueLayout::block_scale_order`). For a 2-D `[R, C]` tensor with `PackedU32(1)` that is the transpose
`[C, R]` packed along its rows, and its `[Br, Bc]` block scales those of `[Bc, Br]` blocks on the transpose.
So the payload of `X` under `PackedU32(1)` and blocks `[Br, Bc]` is qcli's `PackedU32(0)` payload of `X.T`
under blocks `[Bc, Br]`, and its decode is qcli's decode of that, transposed back.
"""

from __future__ import annotations

import sys
from pathlib import Path

from safetensors.torch import save_file

from bench.burn_sweep import sample
from qcli.burn_backends import qfloat
from qcli.codec import decode, encode
from qcli.io.burnpack import BurnpackWriter, TensorEntry
from qcli.scheme import PackedU32, QuantScheme, QuantValue, ScaleDtype

V = QuantValue
# (name, value, block of the [R, C] tensor or None for per-tensor, scale dtype, shape [R, C])
CASES = [
    ("Q4S tensor", V.Q4S, None, ScaleDtype.F32, (64, 16)),
    ("Q4S block[32,1] F16", V.Q4S, [32, 1], ScaleDtype.F16, (64, 16)),  # the tile kernels' Row Linear form
    ("Q4S block[32,1] F32 [256,128]", V.Q4S, [32, 1], ScaleDtype.F32, (256, 128)),
    ("Q4F block[32,1] F16", V.Q4F, [32, 1], ScaleDtype.F16, (64, 16)),
    ("Q8S block[32,1] F16", V.Q8S, [32, 1], ScaleDtype.F16, (64, 16)),
    ("Q8S tensor", V.Q8S, None, ScaleDtype.F32, (64, 16)),
    ("Q2S block[32,1] F16", V.Q2S, [32, 1], ScaleDtype.F16, (64, 16)),
    ("E4M3 block[32,1] F32", V.E4M3, [32, 1], ScaleDtype.F32, (64, 16)),
    ("E2M1 block[32,1] UE8M0", V.E2M1, [32, 1], ScaleDtype.UE8M0, (64, 16)),
    ("Q4S block[1,16] F16 (scales across the words)", V.Q4S, [1, 16], ScaleDtype.F16, (64, 16)),
    ("Q4S tensor ragged [36,16]", V.Q4S, None, ScaleDtype.F32, (36, 16)),
]


def scheme_of(value: QuantValue, block: list[int] | None, dtype: ScaleDtype, dim: int) -> QuantScheme:
    scheme = QuantScheme().with_value(value).with_store(PackedU32(dim))
    return scheme.per_tensor(dtype) if block is None else scheme.per_block(block, dtype)


def main(folder: Path) -> None:
    entries, payloads, expected = [], [], {}
    for seed, (name, value, block, dtype, shape) in enumerate(CASES):
        x = sample(shape, seed + 100)
        flipped = scheme_of(value, None if block is None else block[::-1], dtype, 0)
        payload = encode(x.T.contiguous(), flipped)
        expected[name] = decode(payload, flipped, shape[::-1]).T.contiguous()
        entries.append(TensorEntry(name, qfloat(scheme_of(value, block, dtype, 1)), shape, payload.numel()))
        payloads.append(payload)
    folder.mkdir(parents=True, exist_ok=True)
    with BurnpackWriter(folder / "packed1.bpk", entries) as writer:
        for entry, payload in zip(entries, payloads, strict=True):
            writer.write(entry.name, payload)
        writer.commit()
    save_file(expected, str(folder / "expected.safetensors"))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
