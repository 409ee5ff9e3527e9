"""`PlanOptions`: what a plan is asked for besides its recipe, resolved once from the user's words, so that quantize
and validate-scheme plan alike and `make_plan` takes one typed object."""

from __future__ import annotations

from dataclasses import dataclass

from qcli import BURN_VERSION
from qcli.burn_backends import BurnBackend, default_preset, require_measured, resolve_backend, resolve_version
from qcli.presets import DEFAULT_PRESET, PRESETS, Preset, resolve_preset
from qcli.scheme import Calibration, resolve_calibration


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
    `transpose` (`--transpose`): Linear weights no rule orients are written `[in, out]`."""

    preset: Preset = PRESETS[DEFAULT_PRESET]
    split: bool = False
    backend: BurnBackend | None = None
    burn_version: str = BURN_VERSION
    calibration: Calibration | None = None
    requantize: Preset | None = None
    transpose: bool = False

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
    ) -> PlanOptions:
        """The options from their names as a user writes them (`scheme="q4s-b32"`, `calibration="mse"`); each
        bad value is a UsageError. Without `scheme`, the preset is the backend's best form."""
        chosen = None if calibration is None else resolve_calibration(str(calibration))
        backend = resolve_backend(None if burn_backend is None else str(burn_backend))
        version = resolve_version(burn_version)
        require_measured(backend, version)
        return cls(
            preset=resolve_preset(scheme, default_preset(backend, version)),
            split=split,
            backend=backend,
            burn_version=version,
            calibration=chosen,
            requantize=None if requantize is None else resolve_preset(requantize),
            transpose=transpose,
        )
