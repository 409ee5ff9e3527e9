"""`QuantizeOptions`: what a quantize run was asked, resolved once (from the command line or the Python API)
and carried through as typed values; and `Destination`, where the run writes, worked out in one place."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path

from qcli import BURN_VERSION
from qcli.burn_backends import BurnBackend, default_preset, resolve_backend, resolve_version
from qcli.calibrate.inputs import SAMPLES, SEED, SEQ_LEN, CalibrationInput
from qcli.errors import UsageError, one_of
from qcli.io.files import named_file
from qcli.io.readers import locate
from qcli.io.source import Names
from qcli.output import MODEL_FILE, default_output, is_folder_output
from qcli.pipeline.device import DEVICES
from qcli.presets import Preset, resolve_preset
from qcli.scheme import Calibration, resolve_calibration
from qcli.sizes import parse_size
from qcli.text import printable


@dataclass(frozen=True)
class QuantizeOptions:
    """A quantize run's options (`qcli.commands.quantize.quantize`; docs/cli.md says what each does).

    `preset`: the default scheme (without `scheme`, `burn_backend`'s best form); `calibration`: replaces the
    presets' and covers every recipe rule that names none (None: the presets'); `requantize`: the preset for
    weights no Burn scheme holds; `max_shard_size`: bytes per output file, None for one file; `burn_backend`
    and `burn_version`: the Burn the file is for (None: the common backends); `names`: a GGUF file's tensor
    names; `revision`: for a model in the Hugging Face cache; `transpose`: Linear weights written `[in, out]`,
    for Burn's `LinearLayout::Row`."""

    preset: Preset
    recipe: Path | None = None
    calibration: Calibration | None = None
    requantize: Preset | None = None
    device: str = "auto"
    dry_run: bool = False
    force: bool = False
    stats: bool = True
    verify: bool = True
    max_shard_size: int | None = None
    burn_backend: BurnBackend | None = None
    burn_version: str = BURN_VERSION
    names: Names = Names.file
    revision: str | None = None
    calibrating: CalibrationInput = CalibrationInput()
    transpose: bool = False

    @classmethod
    def parse(
        cls,
        *,
        scheme: str | None = None,
        recipe: str | Path | None = None,
        calibration: str | Calibration | None = None,
        requantize: str | None = None,
        device: str = "auto",
        max_shard_size: int | str | None = None,
        burn_backend: str | BurnBackend | None = None,
        burn_version: str | None = None,
        names: str | Names = Names.file,
        calibration_data: str | Path | None = None,
        samples: int | None = None,
        seq_len: int | None = None,
        seed: int | None = None,
        imatrix: str | Path | None = None,
        **flags: bool | str | None,
    ) -> QuantizeOptions:
        """The options from their names as a user writes them (`scheme="q4s-b32"`, `calibration="mse"`,
        `max_shard_size="500MiB"`); each unknown name is a UsageError, raised before anything is read."""
        unknown = set(flags) - set(_FLAGS)
        if unknown:
            known = [*(p for p in inspect.signature(cls.parse).parameters if p != "flags"), *_FLAGS]
            raise UsageError(f"unknown quantize option {sorted(unknown)[0]!r}",
                             hint=f"the options are {', '.join(known)}")
        device = one_of(device, DEVICES, "--device")
        names = Names(one_of(str(names), list(Names), "--names"))
        if isinstance(max_shard_size, str):
            max_shard_size = parse_size(max_shard_size, "--max-shard-size")
        chosen = None if calibration is None else resolve_calibration(str(calibration))
        calibrating = CalibrationInput(
            data=None if calibration_data is None else Path(calibration_data),
            samples=SAMPLES if samples is None else samples, seq_len=SEQ_LEN if seq_len is None else seq_len,
            seed=SEED if seed is None else seed, imatrix=None if imatrix is None else Path(imatrix))
        calibrating.check(chosen)
        backend = resolve_backend(None if burn_backend is None else str(burn_backend))
        version = resolve_version(burn_version)
        return cls(
            preset=resolve_preset(scheme, default_preset(backend, version)),
            recipe=None if recipe is None else named_file(recipe, "recipe", "check the path given to --recipe"),
            calibration=chosen,
            requantize=None if requantize is None else resolve_preset(requantize),
            device=device,
            max_shard_size=max_shard_size,
            burn_backend=backend,
            burn_version=version,
            names=names,
            calibrating=calibrating,
            **flags,
        )

    def record(self) -> dict[str, object]:
        """The options that shaped the plan, as a model folder's record states them (`qcli.output`)."""
        return {"calibration": None if self.calibration is None else self.calibration.name.lower(),
                "requantize": None if self.requantize is None else self.requantize.name,
                "names": str(self.names), "max_shard_size": self.max_shard_size, "transpose": self.transpose}


_FLAGS = ("dry_run", "force", "stats", "verify", "revision", "transpose")  # taken by `parse` as they are


@dataclass(frozen=True)
class Destination:
    """Where a run reads and writes: `given`, the input as the user named it; `input`, the path read (a
    cache snapshot for a model name); `model`, the `ORG/NAME` it names, if any; `target`, the .bpk (or
    the shards' name); `folder`, the model folder around it, if one is written."""

    given: str
    input: Path
    model: str | None
    target: Path
    folder: Path | None

    @classmethod
    def of(cls, input: str | Path, output: str | Path | None, revision: str | None = None) -> Destination:
        """`input` as a path, or a model `ORG/NAME` in the Hugging Face cache (at `revision`) where no such
        path exists; `output` a file, `DIR/` or an existing directory (a model folder), or None: beside the
        input, or for a model name the folder `NAME/` here. A new `output` without a suffix is refused: it
        may mean a file or a folder, and either guess writes what the user did not ask for."""
        path, model = locate(input, revision)
        folder = None
        if output is None and model is not None:
            folder = Path(model.split("/")[1])
        elif output is not None and is_folder_output(output):
            folder = Path(output)
        elif output is not None and not Path(output).suffix and not Path(output).exists():
            raise UsageError(printable(f"-o {output} names neither a .bpk file nor a folder"),
                             hint=printable(f"write -o {output}/ for a model folder, or -o {output}.bpk for a file"))
        target = folder / MODEL_FILE if folder else Path(output) if output is not None else default_output(path)
        return cls(str(input), path, model, target, folder)
