"""A quantize run's options, resolved once into typed values (`QuantizeOptions`), and where it writes
(`Destination`).

Both come from the command line or the Python API and are worked out here alone, so the run carries one
object instead of loose arguments."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qcli.calibrate.inputs import SAMPLES, SEED, SEQ_LEN, CalibrationInput
from qcli.errors import UsageError, one_of
from qcli.io.files import named_file
from qcli.io.readers import locate
from qcli.io.source import Names
from qcli.output.folder import MODEL_FILE
from qcli.output.names import default_output, is_folder_output
from qcli.pipeline.device import DEVICES
from qcli.plan.options import PlanOptions
from qcli.sizes import parse_size
from qcli.text import printable


@dataclass(frozen=True)
class QuantizeOptions:
    """A quantize run's options (`qcli.commands.quantize.quantize`; docs/cli.md says what each does).

    `plan`: what the plan is asked for (`PlanOptions`: the preset, calibration, requantize, Burn backend and
    release, transpose); `max_shard_size`: bytes per output file, None for one file; `names`: a GGUF file's
    tensor names; `revision`: for a model in the Hugging Face cache; `calibrating`: the text or importance
    matrix a calibrated run measures on."""

    plan: PlanOptions = PlanOptions()
    recipe: Path | None = None
    device: str = "auto"
    dry_run: bool = False
    force: bool = False
    stats: bool = True
    verify: bool = True
    max_shard_size: int | None = None
    names: Names = Names.file
    revision: str | None = None
    calibrating: CalibrationInput = CalibrationInput()
    write_recipe: Path | None = None

    @classmethod
    def parse(
        cls,
        *,
        recipe: str | Path | None = None,
        device: str = "auto",
        max_shard_size: int | str | None = None,
        names: str | Names = Names.file,
        calibration_data: str | Path | None = None,
        samples: int | None = None,
        seq_len: int | None = None,
        seed: int | None = None,
        imatrix: str | Path | None = None,
        write_recipe: str | Path | None = None,
        **given: Any,  # the plan's options and the flags, each checked where it is taken by name
    ) -> QuantizeOptions:
        """The options from their names as a user writes them (`scheme="q4s-b32"`, `calibration="mse"`,
        `max_shard_size="500MiB"`); each unknown name is a UsageError, raised before anything is read. The
        plan's options go to `PlanOptions.parse` by name, so a new one is added there alone."""
        unknown = set(given) - set(_FLAGS) - set(_PLANNED)
        if unknown:
            known = [*(p for p in inspect.signature(cls.parse).parameters if p != "given"), *_PLANNED, *_FLAGS]
            raise UsageError(f"unknown quantize option {sorted(unknown)[0]!r}",
                             hint=f"the options are {', '.join(known)}")
        device = one_of(device, DEVICES, "--device")
        names = Names(one_of(str(names), list(Names), "--names"))
        if isinstance(max_shard_size, str):
            max_shard_size = parse_size(max_shard_size, "--max-shard-size")
        plan = PlanOptions.parse(split=max_shard_size is not None, **{k: v for k, v in given.items() if k in _PLANNED})
        calibrating = CalibrationInput(
            data=None if calibration_data is None else Path(calibration_data),
            samples=SAMPLES if samples is None else samples, seq_len=SEQ_LEN if seq_len is None else seq_len,
            seed=SEED if seed is None else seed, imatrix=None if imatrix is None else Path(imatrix))
        calibrating.check(plan.calibration)
        if write_recipe is not None and plan.target is None:
            raise UsageError("--write-recipe writes the forms --target-bpw or --target-size chooses",
                             hint="give a target, or leave --write-recipe out")
        return cls(
            plan=plan,
            recipe=None if recipe is None else named_file(recipe, "recipe", "check the path given to --recipe"),
            device=device,
            max_shard_size=max_shard_size,
            names=names,
            calibrating=calibrating,
            write_recipe=None if write_recipe is None else Path(write_recipe),
            **{k: v for k, v in given.items() if k in _FLAGS},
        )

    def calibration_asked(self) -> str | None:
        """`--calibration` as the user spells it (`mse`), None where it was not given."""
        calibration = self.plan.calibration
        return None if calibration is None else calibration.name.lower()

    def record(self) -> dict[str, object]:
        """The options that shaped the plan, as a model folder's record states them (`qcli.output`)."""
        plan = self.plan
        return {"calibration": self.calibration_asked(),
                "requantize": None if plan.requantize is None else plan.requantize.name,
                "names": str(self.names), "max_shard_size": self.max_shard_size, "transpose": plan.transpose}


_FLAGS = ("dry_run", "force", "stats", "verify", "revision")  # taken by `parse` as they are
# The plan's options by their user's names; `split` follows `max_shard_size`.
_PLANNED = tuple(p for p in inspect.signature(PlanOptions.parse).parameters if p != "split")


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
