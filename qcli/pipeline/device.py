"""Which pipeline a run takes (`select_pipeline`), from `--device` and the environment read once for the run.

The run's runtime (`Runtime`) loads while the main thread reads the headers and plans, so its seconds of
imports overlap work that needs no torch."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING

from qcli.errors import UsageError, one_of
from qcli.pipeline import GpuSettings, Pipeline
from qcli.pipeline.prefetch import Prefetch

if TYPE_CHECKING:
    from qcli.plan.entries import Plan

DEVICES = ("auto", "cpu", "cuda")

log = logging.getLogger(__name__)


def select_pipeline(device: str, environ: Mapping[str, str] = os.environ,
                    ahead: threading.Event | None = None) -> tuple[str, Pipeline]:
    """`(device, run)`: auto is cuda when torch sees a GPU; QCLI_KERNELS=triton forces the GPU pipeline,
    which takes its `GpuSettings` from `environ` and waits for `ahead` (set) before its first launch."""
    device = require_device(device, environ)
    if environ.get("QCLI_KERNELS") == "triton":
        device = "triton"
    elif device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        from qcli.pipeline import cpu

        return device, cpu.run
    try:
        from qcli.pipeline import gpu
    except ImportError as exc:
        raise UsageError(
            f"the GPU pipeline is unavailable: {exc}", hint="use --device cpu, or install qcli with triton"
        ) from None
    return device, partial(gpu.run, settings=GpuSettings.from_env(environ), ahead=ahead)


def require_device(device: str, environ: Mapping[str, str] = os.environ) -> str:
    """The device `device` names (`one_of` DEVICES); UsageError for one the run cannot have: an unknown one,
    or `cuda` where torch sees none (outside Triton's interpreter, QCLI_KERNELS=triton). A dry run asks too,
    so that it exits as its run would."""
    device = one_of(device, DEVICES, "--device")
    if device == "cuda" and environ.get("QCLI_KERNELS") != "triton":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda: torch sees no CUDA device",
                             hint="use --device cpu (or auto), or install a CUDA build of torch before qcli")
    return device


class Runtime:
    """A run's runtime (torch, the CUDA context), loaded on a thread of its own once the plan is checked.

    Every refusal the headers and the plan give comes without torch, and the loading overlaps opening the output
    and preparing the calibration. Once the plan is known (`warm`), the kernels it launches compile on another
    thread (`gpu.compile_ahead`) while the pipeline's first reads go on. The input is read into the page cache
    ahead of the pipeline (`qcli.pipeline.prefetch`): until the CPU pipeline starts, as its cores quantize, or
    to the end of the run beside the GPU pipeline, whose reads wait on the disk. `select` is `select_pipeline`
    once the loading is done.

    Nothing here decides anything: a failure on these threads is met again by `select_pipeline` on the main
    thread, where it becomes the run's error."""

    def __init__(self, device: str, environ: Mapping[str, str] = os.environ) -> None:
        self._started = time.perf_counter()
        self._environ = environ
        self._gpu = device != "cpu"
        self._loaded = threading.Event()
        self._compiled = threading.Event()
        self._warming = False
        self._prefetch: Prefetch | None = None
        threading.Thread(target=self._load, name="qcli-runtime", daemon=True).start()

    def _load(self) -> None:
        try:
            import torch

            self._log("torch imported")
            if self._gpu and (torch.cuda.is_available() or self._environ.get("QCLI_KERNELS") == "triton"):
                from qcli.pipeline import gpu

                gpu.prepare()
                self._log("CUDA context, Triton and the GPU pipeline loaded")
            else:
                from qcli.pipeline import cpu  # noqa: F401  (its imports: the codec)

                self._log("CPU pipeline loaded")
        except Exception as exc:  # noqa: BLE001 - select_pipeline meets it again on the main thread
            log.debug("loading the runtime failed: %s", exc)
        finally:
            self._loaded.set()

    def warm(self, plan: Plan, measure: bool) -> None:
        """Compile, on a thread of its own once the runtime is loaded, the kernels that `plan` launches
        on the GPU pipeline (`select` hands the pipeline the event it waits for before its first launch)."""
        self._warming = True
        self._prefetch = Prefetch(plan, _available_memory() // 4)
        threading.Thread(target=self._compile, args=(plan, measure), name="qcli-compile", daemon=True).start()

    def _compile(self, plan: Plan, measure: bool) -> None:
        try:
            self._loaded.wait()
            import sys

            gpu = sys.modules.get("qcli.pipeline.gpu")  # loaded only where the GPU pipeline can run
            if gpu is not None:
                launches = gpu.compile_ahead(plan, measure, GpuSettings.from_env(self._environ))
                self._log(f"kernels of {launches} launches compiled ahead")
        except Exception as exc:  # noqa: BLE001 - the pipeline's own launch meets it again
            log.debug("compiling ahead failed: %s", exc)
        finally:
            self._compiled.set()

    def select(self, device: str) -> tuple[str, Pipeline]:
        """`select_pipeline(device)`, after the loading thread is done; the GPU pipeline waits for the
        kernels compiled ahead (when `warm` was called) before its first launch."""
        tick = time.perf_counter()
        self._loaded.wait()
        self._log(f"runtime ready; the main thread waited {time.perf_counter() - tick:.3f} s for it")
        if self._prefetch is not None:
            self._log(f"{self._prefetch.read / 1e9:.2f} GB of the input read into the page cache meanwhile")
        chosen, run = select_pipeline(device, self._environ, self._compiled if self._warming else None)
        if chosen == "cpu":
            self._stop_prefetch()
        return chosen, run

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_prefetch()

    def _stop_prefetch(self) -> None:
        if self._prefetch is not None:
            prefetch, self._prefetch = self._prefetch, None
            self._log(f"{prefetch.stop() / 1e9:.2f} GB of the input read into the page cache in all")

    def _log(self, what: str) -> None:
        log.debug("%.3f s after the command started: %s", time.perf_counter() - self._started, what)


def _available_memory() -> int:
    """Linux's estimate of the memory available without swapping (MemAvailable), or 0 where unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            return next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return 0
