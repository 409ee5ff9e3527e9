"""The calibration passes on the CPU (issue 41): qcli's forward passes, Hessians and GPTQ column loop against
the same work in plain torch (the floor) and llama.cpp's `llama-imatrix`, on SmolLM2-135M, the same tokens
and threads.

Run from the repository root:

    python3 -m bench.calibration_passes [--work ~/.cache/qcli/bench] [--samples 16] [--seq-len 256]
        [--threads 2] [--llama-bin DIR] [--json FILE] [--doc docs/benchmarks.md]

The model is bench.calibrated's float reference (SmolLM2-135M-Instruct's GGUF dequantized to an f32 Hugging
Face folder, and the same weights as an F32 GGUF for llama.cpp), the text its calibration docstrings, both
made in `--work` as bench.calibrated makes them. qcli's windows (`qcli.calibrate.data.windows`: the
tokenizer's special tokens around each) are the floor's tokens too.

**Rows**, each timed in this process with torch at `--threads`:
- *imatrix pass*: qcli's `run_blocks` as `qcli imatrix` and a target's sensitivity run it (`hessians=False`:
  every block Linear's input measured; the model opened and the text tokenized beforehand, as the floor's
  model is loaded before its clock starts, and the pass run once untimed first); the floor:
  transformers' model body (no LM head: qcli runs none) over all windows in one batch, a forward hook on each
  block Linear adding each input channel's sum of squares (float32, as llama.cpp sums). Beside them, whole
  processes: `python -m qcli imatrix` and `llama-imatrix` (`-c seq_len --chunks samples -b seq_len -t
  threads --no-ppl`; its own tokens: the file's text with BOS, as many).
- *GPTQ pass*: `run_blocks` with every block Linear's Hessian handed to a callback that gives the float
  weight back (so each block runs twice, as GPTQ's does: the second pass what the quantized block gives), no
  column loop; the floor: the body batched with hooks adding x xᵀ (float64, as qcli sums), then the body
  again.
- *GPTQ column loop*: the first block's Linears, each on its Hessian from the pass: qcli's `gptq` for
  q4s-b32 with MinMax scales (`search=False`, the floor's work) and with the scale search the command runs
  (`search=True`, weighed by the importance), against the textbook loop (GPTQ's reference: lazy blocks of
  128, each group's symmetric scale taken where the group starts, float32).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.markdown import replace_section

SECTION = "## Calibration passes on the CPU against plain torch and llama-imatrix (issue 41, this 2-core machine)"
ROOT = Path(__file__).resolve().parents[1]
TARGET_RATIO = 1.3


def _timed(run, *args, **kwargs) -> tuple[float, object]:
    started = time.perf_counter()
    result = run(*args, **kwargs)
    return time.perf_counter() - started, result


def _load() -> float:
    return os.getloadavg()[0]


# --- the floor: plain torch --------------------------------------------------------------------------

def block_linears(body) -> list:
    import torch

    return [m for name, m in body.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in f".{name}"]


def floor_pass(body, ids, hessians: bool) -> dict:
    """The body over every window in one batch, a hook on each block Linear summing its input: each
    channel's squares (float32) or x xᵀ (float64); with `hessians`, the body once more (GPTQ's second pass)."""
    import torch

    sums: dict[int, torch.Tensor] = {}

    def hook(module, args, _output):
        x = args[0].detach().reshape(-1, args[0].shape[-1])
        key = id(module)
        if hessians:
            x = x.double()
            sums[key] = sums[key].addmm_(x.T, x) if key in sums else x.T @ x
        else:
            squares = x.square().sum(0)
            sums[key] = sums[key] + squares if key in sums else squares

    handles = [m.register_forward_hook(hook) for m in block_linears(body)]
    with torch.inference_mode():
        try:
            body(input_ids=ids, use_cache=False)
        finally:
            for handle in handles:
                handle.remove()
        if hessians:
            body(input_ids=ids, use_cache=False)
    return sums


def textbook_gptq(weight, hessian, bits: int = 4, group: int = 32, block: int = 128, damp: float = 0.01):
    """GPTQ's reference column loop (Frantar et al., `fasterquant`): symmetric `bits`-bit values, one scale
    per `group` columns of a row taken where the group starts (absmax / (2^(bits-1) - 1)), float32."""
    import torch

    w = weight.detach().float().clone()
    h = hessian.detach().double().clone()
    dead = h.diagonal() == 0
    h.diagonal()[dead] = 1.0
    w[:, dead] = 0.0
    h.diagonal().add_(damp * h.diagonal().mean())
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True).float()
    top = 2 ** (bits - 1) - 1
    q = torch.zeros_like(w)
    columns = w.shape[1]
    for i1 in range(0, columns, block):
        i2 = min(i1 + block, columns)
        w1, errors, u1 = w[:, i1:i2].clone(), torch.zeros(w.shape[0], i2 - i1), u[i1:i2, i1:i2]
        for i in range(i2 - i1):
            if (i1 + i) % group == 0:
                scale = (w1[:, i : i + group].abs().amax(1) / top).clamp_min(1e-12)
            column = w1[:, i]
            q[:, i1 + i] = (column / scale).round().clamp(-top - 1, top) * scale
            error = (column - q[:, i1 + i]) / u1[i, i]
            w1[:, i:].addr_(error, u1[i, i:], alpha=-1)
            errors[:, i] = error
        w[:, i2:] -= errors @ u[i1:i2, i2:]
    return q


# --- qcli --------------------------------------------------------------------------------------------

def qcli_passes(folder: Path, data: Path, samples: int, seq_len: int, first_block: str) -> dict:
    """qcli's imatrix pass and GPTQ pass, timed; the first block's Linears' weights and Hessians kept."""
    from qcli.calibrate.checkpoint import Checkpoint
    from qcli.calibrate.importance import opened
    from qcli.calibrate.inputs import CalibrationInput
    from qcli.calibrate.runner import block_linears as qcli_block_linears
    from qcli.calibrate.runner import run_blocks, shapes_of
    from qcli.io.readers import open_source

    given = CalibrationInput(data, samples, seq_len)
    kept: dict[str, tuple] = {}

    def on_linear(name, weight, stats):
        if name.startswith(first_block):
            kept[name] = (weight.clone(), stats.hessian.clone(), stats.importance.clone())
        return weight  # a weight given back: the block runs again, as GPTQ's does

    with open_source(folder) as source:
        checkpoint = Checkpoint.beside(folder, source)
        model, _, tokens = opened(checkpoint, given)  # as quantize and imatrix open it, untimed: the floor's
        # model is loaded before its clock starts too
        linears = qcli_block_linears(model, shapes_of(checkpoint.tensors))
        run_blocks(model, tokens, linears, lambda *_: None, "cpu", hessians=False)  # the weights' pages read once
        imatrix_s, _ = _timed(run_blocks, model, tokens, linears, lambda *_: None, "cpu", hessians=False)
        load = _load()
        gptq_s, _ = _timed(run_blocks, model, tokens, linears, on_linear, "cpu")
    return {"imatrix_pass_s": imatrix_s, "gptq_pass_s": gptq_s, "gptq_pass_load": load, "tokens": tokens.tokens,
            "first_block": kept}


def column_loops(kept: dict) -> dict:
    """The first block's Linears through qcli's gptq (MinMax scales and searched) and the textbook loop."""
    from qcli.calibrate.gptq import gptq
    from qcli.presets import PRESETS

    scheme = PRESETS["q4s-b32"].scheme
    times = {"qcli_minmax_s": 0.0, "qcli_search_s": 0.0, "textbook_s": 0.0}
    for name, (weight, hessian, importance) in kept.items():
        times["qcli_minmax_s"] += _timed(gptq, weight, hessian, scheme, search=False, name=name)[0]
        times["qcli_search_s"] += _timed(gptq, weight, hessian, scheme, search=True, importance=importance,
                                         name=name)[0]
        times["textbook_s"] += _timed(textbook_gptq, weight, hessian)[0]
    return times | {"linears": len(kept), "columns": sum(w.shape[1] for w, _, _ in kept.values())}


def whole_qcli_imatrix(folder: Path, data: Path, samples: int, seq_len: int, threads: int, out: Path) -> float:
    command = [sys.executable, "-m", "qcli", "imatrix", str(folder), "--calibration-data", str(data), "-o", str(out),
               "--samples", str(samples), "--seq-len", str(seq_len), "--device", "cpu", "--force", "--quiet"]
    seconds, done = _timed(subprocess.run, command, capture_output=True, text=True, env=_env(threads))
    if done.returncode:
        raise SystemExit(f"{shlex.join(command)} failed:\n{done.stderr}")
    return seconds


def whole_llama_imatrix(binary: Path, gguf: Path, data: Path, samples: int, seq_len: int, threads: int,
                        out: Path) -> dict:
    command = [str(binary), "-m", str(gguf), "-f", str(data), "-o", str(out), "-c", str(seq_len), "--chunks",
               str(samples), "-b", str(seq_len), "-t", str(threads), "--no-ppl"]
    seconds, done = _timed(subprocess.run, command, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{shlex.join(command)} failed:\n{done.stderr[-2000:]}")
    return {"seconds": seconds, "command": shlex.join(command)}


def _env(threads: int) -> dict[str, str]:
    return os.environ | {"OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}


# --- the record --------------------------------------------------------------------------------------

def markdown(record: dict) -> str:
    p, r = record["provenance"], record["results"]
    imatrix_ratio = r["qcli_imatrix_pass_s"] / r["floor_imatrix_s"]
    gptq_ratio = r["qcli_gptq_pass_s"] / r["floor_gptq_s"]
    loops = r["column_loop"]
    lines = [
        SECTION, "",
        f"{p['date']}, {p['cpu']}, {p['cores']} cores, {p['threads']} threads; Python {p['python']}, torch "
        f"{p['torch']}, transformers {p['transformers']}; llama.cpp {p['llama_cpp']}; qcli at {p['qcli_commit']}. "
        f"`{p['command']}`. SmolLM2-135M (bench.calibrated's f32 reference), {r['samples']} windows × "
        f"{r['seq_len']} tokens of its calibration text. Load average (1 min) beside each number: the machine is "
        "shared with other builds, so every time is an upper bound.", "",
        "| pass | qcli (s) | plain torch, the floor (s) | qcli / floor | load |", "|---|---:|---:|---:|---:|",
        f"| imatrix: forward, each channel's sum of squares | {r['qcli_imatrix_pass_s']:.1f} | "
        f"{r['floor_imatrix_s']:.1f} | {imatrix_ratio:.2f} | {r['load']['imatrix']:.1f} |",
        f"| GPTQ: forward with x xᵀ, forward again | {r['qcli_gptq_pass_s']:.1f} | {r['floor_gptq_s']:.1f} | "
        f"{gptq_ratio:.2f} | {r['load']['gptq']:.1f} |",
        f"| GPTQ column loop, block 0 ({loops['linears']} Linears, {loops['columns']} columns), MinMax scales | "
        f"{loops['qcli_minmax_s']:.1f} | {loops['textbook_s']:.1f} | {loops['qcli_minmax_s'] / loops['textbook_s']:.2f}"
        f" | {r['load']['columns']:.1f} |",
        f"| the same, scales searched (what `--calibration gptq` runs) | {loops['qcli_search_s']:.1f} | "
        f"{loops['textbook_s']:.1f} | {loops['qcli_search_s'] / loops['textbook_s']:.2f} "
        f"| {r['load']['columns']:.1f} |",
        "", "Whole processes, start-up included:", "",
        "- `python -m qcli imatrix` (the imatrix pass, with Python's and torch's start-up and the file's write): "
        f"{r['qcli_imatrix_command_s']:.1f} s "
        f"(load {r['load']['qcli_command']:.1f})",
    ]
    if r.get("llama_imatrix"):
        lines.append(f"- `{r['llama_imatrix']['command']}`: {r['llama_imatrix']['seconds']:.1f} s (load "
                     f"{r['load']['llama']:.1f})")
    else:
        lines.append("- llama-imatrix: not run (no --llama-bin)")
    return "\n".join(lines) + "\n"


def main() -> None:
    from bench.calibrated import f32_gguf as make_f32
    from bench.calibrated import package_gguf, provenance, reference_folder, texts

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path.home() / ".cache/qcli/bench")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--llama-bin", type=Path, help="the folder holding a built llama.cpp's llama-imatrix")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--doc", type=Path)
    args = parser.parse_args()
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    source = package_gguf()
    folder, f32 = reference_folder(args.work, source), make_f32(args.work, source)
    data = args.work / "calibration.txt"
    data.write_text(texts()[0])
    load: dict[str, float] = {}
    results: dict = {"samples": args.samples, "seq_len": args.seq_len}

    load["imatrix"] = _load()
    passes = qcli_passes(folder, data, args.samples, args.seq_len, "model.layers.0.")
    results["qcli_imatrix_pass_s"], results["qcli_gptq_pass_s"] = passes["imatrix_pass_s"], passes["gptq_pass_s"]
    print(f"qcli: imatrix pass {passes['imatrix_pass_s']:.1f} s, GPTQ pass {passes['gptq_pass_s']:.1f} s", flush=True)
    body = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).model.eval()
    ids = passes["tokens"]
    load["gptq"] = passes["gptq_pass_load"]
    results["floor_imatrix_s"] = _timed(floor_pass, body, ids, hessians=False)[0]
    results["floor_gptq_s"] = _timed(floor_pass, body, ids, hessians=True)[0]
    print(f"floor: imatrix {results['floor_imatrix_s']:.1f} s, GPTQ {results['floor_gptq_s']:.1f} s", flush=True)
    del body
    load["columns"] = _load()
    results["column_loop"] = column_loops(passes["first_block"])
    print(f"column loops: {results['column_loop']}", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        load["qcli_command"] = _load()
        results["qcli_imatrix_command_s"] = whole_qcli_imatrix(folder, data, args.samples, args.seq_len,
                                                               args.threads, Path(scratch) / "qcli.imatrix.gguf")
        if args.llama_bin is not None:
            load["llama"] = _load()
            results["llama_imatrix"] = whole_llama_imatrix(args.llama_bin / "llama-imatrix", f32, data, args.samples,
                                                           args.seq_len, args.threads,
                                                           Path(scratch) / "llama.imatrix.gguf")
    results["load"] = load
    base = provenance(args)
    record = {"results": results, "provenance": {
        "date": base["date"], "cpu": base["cpu"], "cores": base["cores"], "threads": args.threads,
        "python": base["python"], "torch": torch.__version__, "transformers": transformers.__version__,
        "llama_cpp": "llama-cpp-python 0.3.36's vendored llama.cpp" if args.llama_bin else "not run",
        "qcli_commit": base["qcli_commit"],
        "command": shlex.join(["python3", "-m", "bench.calibration_passes", *sys.argv[1:]])}}
    section = markdown(record)
    print(section)
    (args.json or args.work / "calibration_passes.json").write_text(json.dumps(record, indent=1))
    if args.doc:
        replace_section(args.doc, section)


if __name__ == "__main__":
    main()
