"""End to end on a synthetic Llama-3-8B-shaped bf16 checkpoint: qcli against the I/O floor and a naive path.

Run on a CUDA machine from the repository root:

    python3 -m bench.end_to_end --dir /tmp/qbench --out OUT [--layers 32] [--parts generate,floor,...]

Parts (each appends to OUT/end_to_end.json):
- `generate`: random bf16 tensors made on the GPU, written with safetensors in 4 shards plus an index
  (skipped when the index exists).
- `floor`: the I/O floor: every shard read into memory with 1 and with 16 threads, with the page cache
  dropped first (posix_fadvise DONTNEED) and then from the page cache, and writing plus fsyncing a file
  of each scheme's output size.
- `pipeline`: the GPU pipeline and the burnpack writer alone (`qcli.pipeline.gpu.run` into
  `BurnpackWriter`, as `qcli quantize` streams them), cold and cached.
- `qcli`: `qcli.commands.quantize.quantize_file`, what `qcli quantize --device cuda` runs, which by default also
  decodes every quantized tensor on the GPU for its error statistics and bound check and reads the
  finished file back to verify it; `qcli-nostats` is `--no-stats`, `qcli-nostats-noverify` adds
  `--no-verify`; a scheme `PRESET:mse` adds `--calibration mse`. Cold and cached.
- `naive`: load_file(shard, device="cuda"), a torch.compile'd quantize per tensor (the codec's own torch
  arithmetic), .cpu(), written and fsynced; compiled for every shape first (not timed). Cold and cached.
Each of these runs is a child process reporting its wall time (from after its `import torch` and CUDA
set-up), peak RSS and peak GPU memory.
- `process`: the whole `qcli quantize --device cuda --json` command (the console script beside this
  Python), timed from exec to exit, cold and cached, with a warm Triton cache (filled by one run first, not
  counted) and with a fresh one (a new empty TRITON_CACHE_DIR, as on a fresh machine); with defaults and
  with `--no-stats --no-verify` (`--flags`). The headline figure, against the floor of the same record.
- `startup`: what a process pays before its first tensor, each a child timed from exec to exit (median
  of 3): `python -c pass`, `import torch`, CUDA's context, `import triton`, the GPU pipeline's imports,
  `qcli --version`; and `trace`, one `process` run (warm cache, cached input) with the command's debug
  log on, whose timestamps say when torch, CUDA and the kernels were ready against the main thread.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

SCHEMES = ("q4s-b32", "fp4-b32")
SLICE = 16 << 20


LLAMA_3_8B = dict(hidden=4096, inter=14336, vocab=128256, kv=1024)
SMOKE = dict(hidden=256, inter=512, vocab=1000, kv=64)  # --small: a quick check of the script itself


def llama_shapes(layers: int, hidden: int, inter: int, vocab: int, kv: int) -> list[tuple[str, tuple]]:
    shapes = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes += [
            (p + "self_attn.q_proj.weight", (hidden, hidden)), (p + "self_attn.k_proj.weight", (kv, hidden)),
            (p + "self_attn.v_proj.weight", (kv, hidden)), (p + "self_attn.o_proj.weight", (hidden, hidden)),
            (p + "mlp.gate_proj.weight", (inter, hidden)), (p + "mlp.up_proj.weight", (inter, hidden)),
            (p + "mlp.down_proj.weight", (hidden, inter)), (p + "input_layernorm.weight", (hidden,)),
            (p + "post_attention_layernorm.weight", (hidden,)),
        ]
    return shapes + [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]


def generate(directory: Path, layers: int, dims: dict, shards: int = 4) -> dict:
    import torch
    from safetensors.torch import save_file

    index = directory / "model.safetensors.index.json"
    if index.exists():
        return {"generated": False}
    directory.mkdir(parents=True, exist_ok=True)
    shapes = llama_shapes(layers, **dims)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    total = sum(2 * _numel(s) for _, s in shapes)
    started = time.perf_counter()
    weight_map, part, size, k = {}, {}, 0, 1
    for i, (name, shape) in enumerate(shapes):
        part[name] = torch.randn(shape, device=device, dtype=torch.bfloat16).cpu()
        size += 2 * _numel(shape)
        if size >= k * total / shards or i == len(shapes) - 1:
            file = f"model-{k:05d}-of-{shards:05d}.safetensors"
            save_file(part, str(directory / file), metadata={"format": "pt"})
            weight_map.update({n: file for n in part})
            part, k = {}, k + 1
    index.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    os.sync()
    return {"generated": True, "bytes": total, "seconds": time.perf_counter() - started}


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def shards(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.safetensors"))


def drop_cache(paths: list[Path]) -> None:
    os.sync()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def read_all(paths: list[Path], threads: int) -> float:
    """Seconds to read every byte of `paths` in 16 MiB slices with `threads` threads."""
    jobs = [(p, off) for p in paths for off in range(0, p.stat().st_size, SLICE)]
    buffers = {}

    def read(job):
        path, offset = job
        buf = buffers.setdefault(os.getpid() * 1000 + _thread_id(), bytearray(SLICE))
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.preadv(fd, [buf], offset)
        finally:
            os.close(fd)

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(read, jobs))
    seconds = time.perf_counter() - started
    assert total == sum(p.stat().st_size for p in paths)
    return seconds


def _thread_id() -> int:
    import threading

    return threading.get_ident()


def write_fsync(path: Path, nbytes: int) -> float:
    buf = os.urandom(64 << 20)
    started = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left:
            n = min(left, len(buf))
            f.write(buf[:n])
            left -= n
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - started
    path.unlink()
    return seconds


def output_bytes(directory: Path, scheme: str) -> int:
    from qcli.io.safetensors import SafetensorsSource
    from qcli.plan.decisions import make_checked_plan
    from qcli.plan.options import PlanOptions

    with SafetensorsSource.open(directory) as source:
        plan = make_checked_plan(source.infos(), None, PlanOptions.parse(scheme=scheme))
    return sum(e.out_nbytes for e in plan.entries)


def floor(directory: Path) -> dict:
    paths = shards(directory)
    result = {"input_bytes": sum(p.stat().st_size for p in paths)}
    for threads in (1, 16):
        drop_cache(paths)
        result[f"cold_read_{threads}t_s"] = read_all(paths, threads)
    for threads in (1, 16):
        result[f"cached_read_{threads}t_s"] = read_all(paths, threads)
    for scheme in SCHEMES:
        n = output_bytes(directory, scheme)
        result[f"{scheme}_output_bytes"] = n
        result[f"{scheme}_write_fsync_s"] = write_fsync(directory.parent / "floor.bin", n)
    return result


# ------------------------------------------------------------------------------------------- children


def child(mode: str, directory: Path, scheme: str, target: Path) -> dict:
    import torch

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.init()
    baseline_rss = _rss_bytes()
    started = time.perf_counter()
    modes = {"pipeline": _pipeline, "qcli": _qcli, "naive": _naive,
             "qcli-nostats": partial(_qcli, stats=False),
             "qcli-nostats-noverify": partial(_qcli, stats=False, verify=False)}
    extra = modes[mode](directory, scheme, target)
    wall = time.perf_counter() - started
    return {"wall_s": wall, "peak_rss_bytes": _rss_bytes(), "baseline_rss_bytes": baseline_rss,
            "peak_gpu_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None,
            "peak_gpu_reserved_bytes": torch.cuda.max_memory_reserved() if cuda else None, **extra}


def _rss_bytes() -> int:
    """This process's peak RSS (Linux `VmHWM`). Not `ru_maxrss`, which a child inherits from its parent's
    peak across exec: the parent may have held a whole shard while generating the checkpoint."""
    with open("/proc/self/status") as status:
        kib = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    return int(kib) * 1024


def _pipeline(directory: Path, scheme: str, target: Path) -> dict:
    from qcli.io.burnpack import BurnpackWriter, TensorEntry
    from qcli.io.safetensors import SafetensorsSource
    from qcli.pipeline import GpuSettings
    from qcli.pipeline.gpu import run
    from qcli.plan.decisions import make_checked_plan
    from qcli.plan.options import PlanOptions

    with SafetensorsSource.open(directory) as source:
        plan = make_checked_plan(source.infos(), None, PlanOptions.parse(scheme=scheme))
        entries = [TensorEntry(e.info.name, e.out_dtype, tuple(e.out_shape), e.out_nbytes)
                   for e in plan.entries]
        with BurnpackWriter(target, entries, {"producer": "qcli-bench"}) as writer:
            write_s = 0.0
            for payload in run(plan, source, settings=GpuSettings.from_env()):
                tick = time.perf_counter()
                writer.write(payload.entry.info.name, payload.data)
                write_s += time.perf_counter() - tick
            tick = time.perf_counter()
            writer.commit()
            commit_s = time.perf_counter() - tick
    return {"write_s": write_s, "commit_s": commit_s, "output_bytes": target.stat().st_size}


def _qcli(directory: Path, scheme: str, target: Path, **options) -> dict:
    from qcli.commands.quantize import quantize_file

    preset, _, calibration = scheme.partition(":")  # `q4s-b32:mse` adds --calibration mse
    report = quantize_file(directory, target, scheme=preset, calibration=calibration or None, device="cuda",
                           force=True, **options)
    t = report.timings
    return {"device": report.device, "output_bytes": target.stat().st_size,
            "phases_s": {k: getattr(t, k).seconds for k in ("read", "quantize", "write", "stats", "verify")
                         if getattr(t, k) is not None}}


def _naive(directory: Path, scheme: str, target: Path) -> dict:
    import torch
    from safetensors.torch import load_file

    from bench.kernels import codec_on_device
    from qcli.io.safetensors import SafetensorsSource
    from qcli.plan.decisions import make_checked_plan
    from qcli.plan.options import PlanOptions

    with SafetensorsSource.open(directory) as source:
        plan = make_checked_plan(source.infos(), None, PlanOptions.parse(scheme=scheme))
    decisions = {e.info.name: e.decision for e in plan.entries}
    compiled = torch.compile(codec_on_device, dynamic=False)
    tick = time.perf_counter()
    for shape in sorted({e.info.shape for e in plan.entries if e.decision.scheme is not None}):
        d = next(e.decision for e in plan.entries if e.info.shape == shape and e.decision.scheme is not None)
        compiled(torch.randn(shape, device="cuda", dtype=torch.bfloat16), d.scheme, d.calibration)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - tick
    started = time.perf_counter()
    with open(target, "wb") as f:
        for shard in shards(directory):
            tensors = load_file(str(shard), device="cuda")
            for name, x in tensors.items():
                d = decisions[name]
                if d.scheme is None:
                    payload = x.view(-1).view(torch.uint8)
                else:
                    payload = compiled(x, d.scheme, d.calibration)
                f.write(payload.cpu().numpy().tobytes())
            del tensors
        f.flush()
        os.fsync(f.fileno())
    return {"compile_s": compile_s, "timed_s": time.perf_counter() - started,
            "output_bytes": target.stat().st_size}


# ------------------------------------------------------------------------------- the whole process


def qcli_command() -> list[str]:
    """The console script installed beside this Python (what a user runs), else `python -m qcli`."""
    script = Path(sys.executable).with_name("qcli")
    return [str(script)] if script.exists() else [sys.executable, "-m", "qcli"]


def _prepare_regime(directory: Path, regime: str) -> None:
    paths = shards(directory)
    if regime == "cold":
        drop_cache(paths)
    else:
        read_all(paths, 16)


def process_run(directory: Path, scheme: str, regime: str, cache: str, flags: list[str], timeout: float,
                device: str = "cuda", command: list[str] | None = None) -> dict:
    """One whole `qcli quantize` process, exec to exit. `cache` is `warm` (the shared TRITON_CACHE_DIR
    beside the checkpoint) or `fresh` (a new empty one)."""
    _prepare_regime(directory, regime)
    target = directory.parent / f"out-process-{scheme}.bpk"
    warm_dir = directory.parent / "triton-cache-warm"
    cache_dir = warm_dir if cache == "warm" else Path(tempfile.mkdtemp(prefix="triton-fresh-", dir=directory.parent))
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache_dir)}
    cmd = command or [*qcli_command(), "quantize", str(directory), "-o", str(target), "--scheme", scheme,
                      "--device", device, "--force", "--json", *flags]
    row = {"mode": "process", "scheme": scheme, "regime": regime, "triton_cache": cache, "flags": flags}
    row["exec_at"] = time.time()
    started = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**row, "timed_out_after_s": timeout}
    finally:
        wall = time.perf_counter() - started
        target.unlink(missing_ok=True)
        if cache == "fresh":
            shutil.rmtree(cache_dir, ignore_errors=True)
    row["process_s"] = wall
    if done.returncode:
        return {**row, "error": done.stderr[-2000:]}
    if command is not None:  # a trace: its log is on stderr
        return {**row, "stderr": done.stderr[-20000:]}
    report = json.loads(done.stdout)
    t = report["timings"]
    return {**row, "command_total_s": t["total_seconds"], "outside_write_loop_s": wall - t["total_seconds"],
            "phases_s": {k: t[k]["seconds"] for k in ("read", "quantize", "stats", "write", "verify")
                         if t[k] is not None},
            "peak_rss_bytes": report["memory"]["peak_bytes"]}


_TRACE = """
import logging, sys, time
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(created).4f %(threadName)s %(message)s")
logging.getLogger().debug("interpreter up")
from qcli.cli import main
sys.argv = {argv!r}
try:
    main()
finally:
    logging.getLogger().debug("command returned")
"""


def trace(directory: Path, scheme: str, timeout: float, device: str = "cuda") -> dict:
    """A `process` run with the command's debug log on: when each start-up step finished, as seconds
    after exec (log lines stamped with the wall clock, against the parent's clock at exec)."""
    target = directory.parent / f"out-process-{scheme}.bpk"
    argv = ["qcli", "quantize", str(directory), "-o", str(target), "--scheme", scheme, "--device", device,
            "--force", "--json"]
    row = process_run(directory, scheme, "cached", "warm", [], timeout, device,
                      command=[sys.executable, "-c", _TRACE.format(argv=argv)])
    events = []
    for line in row.pop("stderr", "").splitlines():
        stamp, _, what = line.partition(" ")
        try:
            events.append([round(float(stamp) - row["exec_at"], 3), what])
        except ValueError:
            continue
    return {**row, "mode": "trace", "events_s_after_exec": events}


def startup(runs: int = 3) -> dict:
    """Median seconds, exec to exit, of what a process pays before its first tensor."""
    probes = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "import torch": [sys.executable, "-c", "import torch"],
        "import torch + CUDA context": [sys.executable, "-c", "import torch; torch.zeros(1, device='cuda')"],
        "import triton": [sys.executable, "-c", "import triton"],
        "GPU pipeline imports + CUDA": [sys.executable, "-c",
                                        "import torch; torch.zeros(1, device='cuda'); import qcli.pipeline.gpu"],
        "qcli --version": [*qcli_command(), "--version"],
    }
    result = {}
    for name, cmd in probes.items():
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            subprocess.run(cmd, capture_output=True, check=True)
            times.append(time.perf_counter() - started)
        result[name] = sorted(times)[len(times) // 2]
    return result


def run_child(mode: str, directory: Path, scheme: str, regime: str, timeout: float) -> dict:
    paths = shards(directory)
    if regime == "cold":
        drop_cache(paths)
    else:
        read_all(paths, 16)
    target = directory.parent / f"out-{mode}-{scheme}.bin"
    cmd = [sys.executable, "-m", "bench.end_to_end", "--child", mode, "--dir", str(directory),
           "--scheme", scheme, "--target", str(target)]
    started = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"mode": mode, "scheme": scheme, "regime": regime, "timed_out_after_s": timeout}
    finally:
        target.unlink(missing_ok=True)
    if done.returncode:
        return {"mode": mode, "scheme": scheme, "regime": regime, "error": done.stderr[-2000:]}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"mode": mode, "scheme": scheme, "regime": regime, "process_s": time.perf_counter() - started,
            **result}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--small", action="store_true", help="tiny shapes, to check the script")
    parser.add_argument("--parts", default="generate,floor,pipeline")
    parser.add_argument("--timeout", type=float, default=240)
    parser.add_argument("--schemes", default=",".join(SCHEMES))
    parser.add_argument("--regimes", default="cold,cached")
    parser.add_argument("--device", default="cuda", help="`process` and `trace`: qcli's --device")
    parser.add_argument("--caches", default="warm,fresh", help="Triton caches for `process`")
    parser.add_argument("--flags", default="defaults,--no-stats --no-verify",
                        help="comma-separated flag sets for `process` (`defaults`: none)")
    parser.add_argument("--child")
    parser.add_argument("--scheme")
    parser.add_argument("--target", type=Path)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.dir, args.scheme, args.target)))
        return
    record_path = args.out / "end_to_end.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {"runs": []}
    for part in args.parts.split(","):
        if part == "generate":
            record["generate"] = generate(args.dir, args.layers, SMOKE if args.small else LLAMA_3_8B)
        elif part == "floor":
            record["floor"] = floor(args.dir)
        elif part == "startup":
            record["startup"] = startup()
            print(json.dumps(record["startup"]), flush=True)
        elif part == "trace":
            for scheme in args.schemes.split(","):
                run = trace(args.dir, scheme, args.timeout, args.device)
                record["runs"].append(run)
                print(json.dumps(run), flush=True)
        elif part == "process":
            flag_sets = [[] if f == "defaults" else f.split() for f in args.flags.split(",")]
            for scheme in args.schemes.split(","):
                for flags in flag_sets:
                    process_run(args.dir, scheme, "cached", "warm", flags, args.timeout, args.device)  # fills it
                    for regime in args.regimes.split(","):
                        for cache in args.caches.split(","):
                            run = process_run(args.dir, scheme, regime, cache, flags, args.timeout, args.device)
                            record["runs"].append(run)
                            shown = {k: v for k, v in run.items() if k != "error"}
                            print(json.dumps(shown), run.get("error", "")[-600:], flush=True)
        else:
            for scheme in args.schemes.split(","):
                for regime in args.regimes.split(","):
                    run = run_child(part, args.dir, scheme, regime, args.timeout)
                    record["runs"].append(run)
                    shown = {k: v for k, v in run.items() if k != "error"}
                    print(json.dumps(shown), run.get("error", "")[-600:], flush=True)
        record_path.write_text(json.dumps(record, indent=1))
        print(part, "done", flush=True)


if __name__ == "__main__":
    main()
