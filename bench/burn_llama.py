"""What a quantized model costs in Burn: a Llama-architecture model folder written by qcli in each form,
run by tests/burn/examples/llama.rs's `time` mode on each backend, beside the float model in one run.

Run from the repository root, after the harness is built (`python3 -m pytest tests/io/test_burn_llama.py`
or `.ci/run` builds it):

    python3 -m bench.burn_llama SOURCE WORKDIR [--backends flex,wgpu] [--forms f32,bf16,q8s-b32,q4s-b32]
                                [--prompt 128] [--tokens 16] [--layout col] [--matmul module,direct]

SOURCE is what `qcli quantize` takes: a Hugging Face folder (config.json beside the weights), or a GGUF
file with `--names hf` (give `--extra=--names --extra=hf`). Each form is written once under WORKDIR
(`f32` and `bf16`: every tensor kept and cast, a recipe; `best`: `--burn-backend B` without `--scheme`;
any other: a preset), then timed per backend and `--matmul` way (the example's: `module`, Burn's `Linear`,
or `direct`, a matmul on the weight as loaded): load time, VmRSS after load, the peak (VmHWM) of the load and
of a forward, the time to the first token of a `--prompt`-token prompt and the greedy decode's tokens a
second over `--tokens` tokens. With `--agree`, each run also holds Burn's logits to torch's (transformers'
Llama on qcli's decode of the same file, tests/io/test_burn_llama.py): the largest logit difference, the
top-1 agreement over the prompt and whether the greedy continuation is torch's. One JSON line per run, then
a markdown table, on stdout.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from qcli.burn_backends import BurnBackend
from tests.burn_harness import example, run_program
from tests.cli_support import cli

FLOATS = {"f32": "F32", "bf16": "BF16"}


def write(source: Path, out: Path, form: str, backend: str, extra: list[str]) -> Path:
    """`qcli quantize SOURCE -o OUT/` at `form` (for `backend` where the form depends on it)."""
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    args: list[str | Path] = ["quantize", source, "-o", f"{out}/", "--device", "cpu", *extra]
    if form in FLOATS:
        recipe = out.parent / f"{form}.toml"
        recipe.write_text(f'version = 1\n[[rule]]\nmatch = "*"\nkeep = true\ncast = "{FLOATS[form]}"\n')
        args += ["--recipe", recipe]
    elif form == "best":
        args += ["--burn-backend", backend]
    else:
        args += ["--scheme", form]
    result = cli(*args)
    if result.code != 0:
        sys.exit(f"qcli quantize failed for {form}:\n{result.err}")
    return out


def time(folder: Path, backend: str, matmul: str, args: argparse.Namespace) -> dict:
    layout = ["--layout", args.layout] if args.layout else []
    done = run_program(example("llama"), "time", "--backend", backend, "--matmul", matmul, "--prompt",
                       str(args.prompt), "--tokens", str(args.tokens), *layout, folder)
    if done.code != 0:
        return {"matmul": matmul, "error": failure(done.err) or f"exit {done.code}"}
    return json.loads(done.out)


def failure(stderr: str) -> str:
    """What a failed run says: a Rust panic's message (the line after `panicked at`), else its last line."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    panics = [i + 1 for i, line in enumerate(lines[:-1]) if "panicked at" in line]
    return lines[panics[0]] if panics else (lines[-1] if lines else "")


def agree(folder: Path, backend: str, matmul: str) -> dict:
    """Burn's logits against torch's on qcli's decode of `folder` (the whole-model test's figures)."""
    from tests.io.test_burn_llama import agreement

    with tempfile.TemporaryDirectory() as scratch:
        a = agreement(folder, BurnBackend(backend), Path(scratch), cached=False, matmul=matmul)
    return {"max_abs_logit_diff": a.max_abs, "max_logit": a.max_logit, "top1": a.top1,
            "continuation_identical": a.burn_ids == a.torch_ids}


def against_torch(r: dict) -> str:
    if "top1" not in r:
        return "not compared"
    same = "identical" if r["continuation_identical"] else "DIFFERENT"
    return (f"max diff {r['max_abs_logit_diff']:.1e} of {r['max_logit']:.1f}, top-1 {r['top1']:.3f}, "
            f"continuation {same}")


def table(rows: list[tuple[str, str, dict]], prompt: int) -> str:
    lines = [f"| form | backend | matmul | file MiB | load s | RSS after load MiB | peak load MiB | peak forward MiB | "
             f"first token s ({prompt}-token prompt) | prompt tokens/s | decode tokens/s | against torch |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for form, backend, r in rows:
        if "error" in r:
            lines.append(f"| {form} | {backend} | {r['matmul']} | {r.get('file_mib', 0):.0f} | failed: {r['error']} "
                         "||||||||")
            continue
        lines.append(f"| {form} | {backend} | {r['matmul']} | {r['file_mib']:.0f} | {r['load_s']:.2f} | "
                     f"{r['rss_after_load_mib']:.0f} | {r['peak_load_mib']:.0f} | {r['peak_forward_mib']:.0f} | "
                     f"{r['first_token_s']:.2f} | "
                     f"{r['prompt_tokens_per_s']:.1f} | {r['decode_tokens_per_s']:.2f} | {against_torch(r)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python3 -m bench.burn_llama", description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--backends", default="flex,wgpu")
    parser.add_argument("--forms", default="f32,bf16,q8s-b32,q4s-b32")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--layout", choices=("row", "col"))
    parser.add_argument("--matmul", default="module", help="module, direct or both: module,direct")
    parser.add_argument("--extra", action="append", default=[], help="an argument for qcli quantize")
    parser.add_argument("--agree", action="store_true", help="also hold Burn's logits to torch's")
    args = parser.parse_args(argv)
    rows = []
    for form in args.forms.split(","):
        for backend in args.backends.split(","):
            # A form that does not depend on the backend is written once.
            name = f"{form}-{backend}" if form == "best" else form
            folder = args.workdir / name
            if not (folder / "model.bpk").exists():
                write(args.source, folder, form, backend, args.extra)
            for matmul in args.matmul.split(","):
                result = time(folder, backend, matmul, args)
                result["file_mib"] = (folder / "model.bpk").stat().st_size / 2**20
                if args.agree and "error" not in result:
                    result.update(agree(folder, backend, matmul))
                print(json.dumps({"form": form, **result}), flush=True)
                rows.append((form, backend, result))
    print(table(rows, args.prompt))


if __name__ == "__main__":
    main()
