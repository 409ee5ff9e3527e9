"""GPTQ's cost and its device agreement, whole process: `qcli quantize --calibration gptq` on a synthetic
Llama-3-8B-shaped checkpoint (random N(0, 0.02) bf16 weights, the sample's word-level tokenizer and
calibration text repeated; time and memory do not depend on the values), and the same command on the CPU
and on CUDA for a smaller model, compared code by code.

    python -m bench.gptq_speed speed --dir /tmp/l8b --layers 32 --samples 128 --seq-len 2048
    python -m bench.gptq_speed agreement --dir /tmp/agree --layers 2 --hidden 512

`speed` times `python -m qcli quantize` from exec to exit and reads the calibration's CUDA peak from its
--json document (the most torch's allocator held) beside the most memory nvidia-smi showed the qcli
process holding, and the whole device (this script's own process included: it made the model on the GPU
and keeps its CUDA context and cached blocks, 4.6 GB for the 8B-shaped model);
`agreement` writes the model with --device cpu and twice with --device cuda, and reports the share of weights
whose decode (field and scale) is identical between the devices, the output errors side by side, and whether
the two CUDA runs wrote the same bytes.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "sample_weights"))


def make_model(directory: Path, layers: int, hidden: int, inter: int, vocab: int, kv: int) -> None:
    """Weights, config.json, the sample's tokenizer and a calibration text of about 300k tokens."""
    import make_samples
    import torch
    from safetensors.torch import save_file

    from bench.end_to_end import llama_shapes

    directory.mkdir(parents=True, exist_ok=True)
    if not (directory / "config.json").exists():
        generator = torch.Generator(device="cuda" if torch.cuda.is_available() else "cpu").manual_seed(0)
        tensors = {}
        for name, shape in llama_shapes(layers, hidden, inter, vocab, kv):
            x = torch.randn(shape, generator=generator, device=generator.device) * 0.02
            tensors[name] = (x + 1 if len(shape) == 1 else x).to(torch.bfloat16).cpu()
        save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
        config = make_samples.config() | {"hidden_size": hidden, "intermediate_size": inter, "vocab_size": vocab,
                                          "num_hidden_layers": layers, "num_attention_heads": hidden // 128,
                                          "num_key_value_heads": kv // 128, "head_dim": 128,
                                          "max_position_embeddings": 8192, "rope_theta": 500000.0}
        (directory / "config.json").write_text(json.dumps(config, indent=2))
        (directory / "tokenizer.json").write_text(json.dumps(make_samples.tokenizer()))
        (directory / "tokenizer_config.json").write_text(json.dumps(make_samples.tokenizer_config()
                                                                    | {"model_max_length": 1 << 20}))
    (directory / "calibration.txt").write_text(make_samples.TEXT.read_text() * 500)


def quantize(directory: Path, out: Path, device: str, samples: int, seq_len: int, scheme: str) -> dict:
    command = [sys.executable, "-m", "qcli", "quantize", str(directory), "-o", str(out), "--force", "--json",
               "--scheme", scheme, "--calibration", "gptq", "--calibration-data", str(directory / "calibration.txt"),
               "--samples", str(samples), "--seq-len", str(seq_len), "--device", device]
    used, own, stop = [], [], threading.Event()
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def sample() -> None:
        """What the device shows taken (every process's: this one's too, which made the model on the GPU),
        and what it shows the qcli process holding: its allocator's reserve and CUDA's context with it."""
        while not stop.wait(0.25):
            query = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                   capture_output=True, text=True)
            if query.returncode == 0 and query.stdout.strip():
                used.append(int(query.stdout.split()[0]))
            apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,"
                                   "nounits"], capture_output=True, text=True)
            for line in apps.stdout.splitlines() if apps.returncode == 0 else []:
                pid, _, mib = line.partition(",")
                if pid.strip() == str(child.pid) and mib.strip().isdigit():
                    own.append(int(mib))

    sampler = threading.Thread(target=sample, daemon=True)
    if device == "cuda" and shutil.which("nvidia-smi"):
        sampler.start()
    stdout, stderr = child.communicate()
    seconds = time.perf_counter() - started
    stop.set()
    if child.returncode != 0:
        raise SystemExit(f"qcli failed ({child.returncode}):\n{stderr[-3000:]}")
    doc = json.loads(stdout)
    return {"command": " ".join(command[1:]), "seconds": seconds, "calibration": doc["calibration"],
            "timings": doc["timings"], "memory": doc["memory"], "nvidia_smi_peak_mib": max(used, default=None),
            "nvidia_smi_process_peak_mib": max(own, default=None),
            "errors": {t["name"]: t["output_error"] for t in doc["tensors"] if t["output_error"] is not None}}


def versions() -> dict:
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                     cwd=ROOT).stdout.strip() or None}


def agreement(cpu: Path, cuda: Path) -> dict:
    """The share of the quantized weights that decode identically (field and scale) from the two files."""
    import torch

    import qcli.codec
    from qcli.io.burnpack import BurnpackReader
    from qcli.io.dtypes import QFloat

    a, b = BurnpackReader.open(cpu), BurnpackReader.open(cuda)
    same = total = 0
    for entry in a.entries():
        if not isinstance(entry.dtype, QFloat):
            continue
        x, y = (qcli.codec.decode(r.read(entry.name), entry.dtype.scheme, entry.shape) for r in (a, b))
        same += int((x.view(torch.int32) == y.view(torch.int32)).sum())
        total += x.numel()
    return {"identical_share": same / total, "weights": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["speed", "agreement"])
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--inter", type=int, default=None, help="default: 3.5 × hidden")
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--scheme", default="q4f-b32")
    parser.add_argument("--device", default="cuda", help="speed: the device to calibrate on")
    parser.add_argument("--json", type=Path, help="write the record here")
    args = parser.parse_args()
    inter = args.inter or int(args.hidden * 3.5)
    make_model(args.dir, args.layers, args.hidden, inter, args.vocab, args.hidden // 4)
    record = {"mode": args.mode, "layers": args.layers, "hidden": args.hidden, "inter": inter,
              "scheme": args.scheme, "samples": args.samples, "seq_len": args.seq_len, "versions": versions()}
    if args.mode == "speed":
        record["run"] = quantize(args.dir, args.dir / "out.bpk", args.device, args.samples, args.seq_len, args.scheme)
    else:
        runs = {device: quantize(args.dir, args.dir / f"{device}.bpk", device, args.samples, args.seq_len, args.scheme)
                for device in ("cpu", "cuda")}
        record["runs"] = runs
        record["agreement"] = agreement(args.dir / "cpu.bpk", args.dir / "cuda.bpk")
        again = quantize(args.dir, args.dir / "cuda-again.bpk", "cuda", args.samples, args.seq_len, args.scheme)
        record["agreement"]["cuda_twice_same_bytes"] = (
            (args.dir / "cuda.bpk").read_bytes() == (args.dir / "cuda-again.bpk").read_bytes())
        record["runs"]["cuda_again"] = again
        errors = [(runs["cpu"]["errors"][n], runs["cuda"]["errors"][n]) for n in runs["cpu"]["errors"]]
        record["agreement"]["mean_output_error"] = {"cpu": sum(e for e, _ in errors) / len(errors),
                                                    "cuda": sum(e for _, e in errors) / len(errors)}
        record["agreement"]["largest_output_error_difference"] = max(abs(a - b) for a, b in errors)
    text = json.dumps(record, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
