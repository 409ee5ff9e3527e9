"""`PlanOptions`: what a plan is asked for besides its recipe, resolved once from the user's words.

quantize and validate-scheme both build it, so they plan alike, and `make_plan` takes one typed object."""

from __future__ import annotations

import math
from dataclasses import dataclass

from qcli import BURN_VERSION
from qcli.burn_backends import BurnBackend, default_preset, require_measured, resolve_backend, resolve_version
from qcli.errors import UsageError
from qcli.presets import DEFAULT_PRESET, PRESETS, Preset, resolve_preset
from qcli.scheme import Calibration, resolve_calibration
from qcli.sizes import parse_size


@dataclass(frozen=True)
class Target:
    """`--target-bpw X` (bits per quantized weight, its scales included) or `--target-size SIZE` (the whole
    file's bytes, kept tensors and the container's own included); `given` is the user's word for it."""

    bpw: float | None = None
    size: int | None = None
    given: str = ""

    @classmethod
    def parse(cls, target_bpw: float | str | None, target_size: int | str | None) -> Target | None:
        if target_bpw is not None and target_size is not None:
            raise UsageError("--target-bpw and --target-size cannot be used together",
                             hint="give the budget one way: bits per weight, or the file's size")
        if target_bpw is not None:
            try:
                bpw = float(target_bpw)
            except ValueError:
                bpw = math.nan
            if not math.isfinite(bpw) or bpw <= 0:
                raise UsageError(f"--target-bpw {target_bpw!r} is not a number of bits per weight",
                                 hint="give a positive number, e.g. --target-bpw 4.5")
            return cls(bpw=bpw, given=f"--target-bpw {bpw:g}")
        if target_size is not None:
            size = target_size if isinstance(target_size, int) else parse_size(str(target_size), "--target-size")
            if size <= 0:
                raise UsageError(f"--target-size {target_size!r} is not a size", hint="give a byte count, e.g. 4GB")
            return cls(size=size, given=f"--target-size {target_size}")
        return None


@dataclass(frozen=True)
class PlanOptions:
    """A plan's options (`qcli.plan.decisions.make_plan`; docs/cli.md says what each does).

    `preset` (`--scheme`): the scheme of tensors no rule covers. `split` (`--max-shard-size`): the output is
    cut into several files, so Burn's per-file limits are the split's to keep. `backend` (`--burn-backend`):
    every tensor that backend cannot load is an error; without one, what a common backend cannot load is a
    warning. `burn_version` (`--burn-version`): the Burn release the file is for; a scheme it has no form for
    is an error. `calibration` (`--calibration`): replaces the presets' and covers every rule that names
    none. `requantize` (`--requantize`): the preset that weights no Burn scheme holds, and transcodable ones
    the release or backend cannot use, are quantized into once dequantized; without it they are refused.
    `transpose` (`--transpose`): Linear weights no rule orients are written `[in, out]`. `target`
    (`--target-bpw`, `--target-size`): each tensor the default policy quantizes takes the form that loses
    least under that budget (`qcli.plan.target`), chosen from its weights before the plan is made; the
    preset is then the backend's default, which the choice replaces."""

    preset: Preset = PRESETS[DEFAULT_PRESET]
    split: bool = False
    backend: BurnBackend | None = None
    burn_version: str = BURN_VERSION
    calibration: Calibration | None = None
    requantize: Preset | None = None
    transpose: bool = False
    target: Target | None = None

    @classmethod
    def parse(
        cls,
        *,
        scheme: str | None = None,
        calibration: str | Calibration | None = None,
        requantize: str | None = None,
        burn_backend: str | BurnBackend | None = None,
        burn_version: str | None = None,
        transpose: bool = False,
        split: bool = False,
        target_bpw: float | str | None = None,
        target_size: int | str | None = None,
    ) -> PlanOptions:
        """The options from their names as a user writes them (`scheme="q4s-b32"`, `calibration="mse"`); each
        bad value is a UsageError. Without `scheme`, the preset is the backend's best form."""
        chosen = None if calibration is None else resolve_calibration(str(calibration))
        backend = resolve_backend(None if burn_backend is None else str(burn_backend))
        version = resolve_version(burn_version)
        require_measured(backend, version)
        target = Target.parse(target_bpw, target_size)
        if target is not None and scheme is not None:
            raise UsageError(f"--scheme and {target.given.split()[0]} cannot be used together",
                             hint="the target chooses each tensor's preset; pin a tensor with a recipe rule instead")
        return cls(
            preset=resolve_preset(scheme, default_preset(backend, version)),
            split=split,
            backend=backend,
            burn_version=version,
            calibration=chosen,
            requantize=None if requantize is None else resolve_preset(requantize),
            transpose=transpose,
            target=target,
        )
