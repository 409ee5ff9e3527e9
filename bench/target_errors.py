"""Where a quantized SmolLM2 loses, tensor by tensor (issue 40): each quantized matrix's bits and its expected
output error on the calibration activations, for a qcli burnpack and a llama.cpp GGUF of the same reference,
so that a KL gap between them reads as the bits each spends per role and the error each role is left with.

Run from the repository root, on bench.calibrated's reference folder:

    python3 -m bench.target_errors REFERENCE_FOLDER --imatrix IMATRIX.gguf --bpk X.bpk --gguf Y.gguf [--top 12]

The error of a tensor W and its decode Q is qcli's sensitivity measure (`qcli.sensitivity`): the sum over
input channels j of importance[j] × Σ rows (W - Q)[:, j]², the importance the mean square of channel j's
activations from IMATRIX (any llama.cpp importance matrix of this model); relative: over the same sum of W².
Tensors the importance lacks (the tied embedding) are left out of the errors. Per role (q, k, v, o, gate, up,
down over every layer): the weights' share, each file's bits per weight and its error summed over the role's
tensors; then the tensors where the burnpack's error most exceeds the GGUF's.
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

import numpy as np


def bpk_tensors(path: Path) -> dict[str, tuple[np.ndarray, float]]:
    """Each quantized tensor of a burnpack decoded by qcli, with its bits per weight."""
    from qcli.codec import decode
    from qcli.io.burnpack import BurnpackReader
    from qcli.io.dtypes import QFloat

    reader = BurnpackReader.open(path)
    found = {}
    for entry in reader.entries():
        if isinstance(entry.dtype, QFloat):
            shape = tuple(entry.shape)
            values = decode(reader.read(entry.name), entry.dtype.scheme, shape).float().numpy()
            found[entry.name] = (values, 8 * entry.dtype.nbytes(shape) / int(np.prod(shape)))
    return found


def gguf_tensors(path: Path) -> dict[str, tuple[np.ndarray, float]]:
    """Each quantized matrix of a llama.cpp GGUF dequantized by the `gguf` package under Hugging Face's names
    (the Q and K rows in Hugging Face's order), with its bits per weight."""
    import gguf

    from bench.calibrated import gguf_weights
    from bench.cpu_vs_llama_cpp import hf_name

    weights, bits = gguf_weights(path)[0], {}
    for tensor in gguf.GGUFReader(path).tensors:
        if len(tensor.shape) == 2 and tensor.tensor_type.name not in ("F32", "F16"):
            bits[hf_name(tensor.name)] = 8 * int(tensor.n_bytes) / int(tensor.n_elements)
    return {name: (values.numpy(), bits[name]) for name, values in weights.items() if name in bits}


ROLE = re.compile(r"\.(\w+_proj)\.weight$")


def role_of(name: str) -> str:
    found = ROLE.search(name)
    return found.group(1) if found else name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reference", type=Path, help="the reference folder (config.json, model.safetensors)")
    parser.add_argument("--imatrix", type=Path, required=True)
    parser.add_argument("--bpk", type=Path, required=True)
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    from safetensors.numpy import load_file

    from qcli.calibrate.importance import file_importance
    from qcli.io.readers import open_source

    reference = load_file(str(args.reference / "model.safetensors"))
    with open_source(args.reference) as source:
        importance = {k: v.numpy() for k, v in file_importance(args.imatrix, args.reference, source.infos()).items()}
    files = {"qcli": bpk_tensors(args.bpk), "llama.cpp": gguf_tensors(args.gguf)}
    total = sum(reference[n].size for n in files["qcli"])
    roles: dict[str, dict] = defaultdict(lambda: defaultdict(float))
    tensors = []
    for name in sorted(files["qcli"]):
        w = reference[name].astype(np.float64)
        share = w.size / total
        row = roles[role_of(name)]
        row["share"] += share
        errors = {}
        for tool, decoded in files.items():
            values, bits = decoded[name]
            row[f"{tool} bits"] += bits * share
            if name in importance:
                errors[tool] = float(((w - values) ** 2).sum(0) @ importance[name])
                row[f"{tool} error"] += errors[tool]
        if name in importance:
            row["energy"] += float((w**2).sum(0) @ importance[name])
            tensors.append((errors["qcli"] - errors["llama.cpp"], name, errors, files["qcli"][name][1],
                            files["llama.cpp"][name][1]))
    print("| role | weights % | qcli bits | llama.cpp bits | qcli error (relative) | llama.cpp error (relative) |")
    print("|---|---:|---:|---:|---:|---:|")
    for role, row in sorted(roles.items(), key=lambda item: -item[1]["share"]):
        energy = row["energy"]
        errors = [f"{row[f'{t} error'] / energy:.2e}" if energy else "" for t in files]
        print(f"| {role} | {100 * row['share']:.1f} | {row['qcli bits'] / row['share']:.2f} | "
              f"{row['llama.cpp bits'] / row['share']:.2f} | {errors[0]} | {errors[1]} |")
    print(f"\nThe {args.top} tensors where qcli's error most exceeds llama.cpp's (absolute, the importance's units):\n")
    print("| tensor | qcli bits | qcli error | llama.cpp bits | llama.cpp error |")
    print("|---|---:|---:|---:|---:|")
    for _, name, errors, ours, theirs in sorted(tensors, reverse=True)[: args.top]:
        print(f"| {name} | {ours:.2f} | {errors['qcli']:.3g} | {theirs:.2f} | {errors['llama.cpp']:.3g} |")


if __name__ == "__main__":
    main()
