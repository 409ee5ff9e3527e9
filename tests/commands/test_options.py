"""QuantizeOptions: names as a user writes them become typed values once, and each bad one is refused before
anything is read; Destination works out where a run writes."""

from pathlib import Path

import pytest

from qcli import BURN_VERSION
from qcli.burn_backends import BurnBackend
from qcli.commands.options import Destination, QuantizeOptions
from qcli.errors import UsageError
from qcli.io.source import Names
from qcli.plan.options import PlanOptions
from qcli.presets import DEFAULT_PRESET
from qcli.scheme import Calibration


def test_names_as_a_user_writes_them_become_typed_values():
    options = QuantizeOptions.parse(scheme="Q8S-B32", calibration="MSE", burn_backend="WGPU", burn_version="0.21",
                                    max_shard_size="1KiB", names="HF", requantize="q4s-b32", dry_run=True,
                                    transpose=True)
    plan = options.plan
    assert plan.preset.name == "q8s-b32" and plan.requantize.name == "q4s-b32" and plan.transpose
    assert plan.calibration is Calibration.Mse and plan.backend is BurnBackend.wgpu
    assert plan.burn_version == "0.21.0" and plan.split
    assert options.max_shard_size == 1024 and options.names is Names.hf
    assert options.dry_run and options.stats and options.verify and not options.force
    assert options.record() == {"calibration": "mse", "requantize": "q4s-b32", "names": "hf", "max_shard_size": 1024,
                                "transpose": True}


def test_defaults_are_the_commands_defaults():
    options = QuantizeOptions.parse()
    assert options.plan == PlanOptions() == PlanOptions.parse()  # make_plan's defaults are the command's
    assert options.plan.preset.name == DEFAULT_PRESET and options.plan.calibration is None
    assert options.plan.backend is None and options.plan.burn_version == BURN_VERSION and not options.plan.split
    assert options.device == "auto" and options.names is Names.file


@pytest.mark.parametrize(("given", "message"), [
    ({"scheme": "q5z"}, "q5z"),
    ({"calibration": "best"}, "--calibration: 'best' is not one of minmax, absmean, mse, gptq"),
    ({"device": "tpu"}, "--device: 'tpu' is not one of auto, cpu, cuda"),
    ({"names": "gguf"}, "--names: 'gguf' is not one of file, hf"),
    ({"burn_backend": "metal"}, "--burn-backend: 'metal' is not one of flex, ndarray, wgpu, cuda"),
    ({"burn_backend": "cuda"}, "Burn 0.22.1's cuda backend is not measured"),
    ({"burn_version": "0.9"}, "not a release"),
    ({"max_shard_size": "lots"}, "--max-shard-size"),
    ({"dryrun": True}, "unknown quantize option 'dryrun'"),
])
def test_each_bad_value_is_a_usage_error(given, message):
    with pytest.raises(UsageError, match=message) as raised:
        QuantizeOptions.parse(**given)
    assert raised.value.hint


def test_the_output_is_worked_out_in_one_place(tmp_path):
    model = tmp_path / "m.safetensors"
    model.write_bytes(b"")
    assert Destination.of(model, None).target == tmp_path / "m.bpk"
    beside = Destination.of(model, tmp_path / "out.bpk")
    assert (beside.target, beside.folder, beside.model, beside.given) == (tmp_path / "out.bpk", None, None, str(model))
    folder = Destination.of(model, f"{tmp_path}/dir/")
    assert (folder.folder, folder.target) == (Path(f"{tmp_path}/dir"), tmp_path / "dir" / "model.bpk")
    with pytest.raises(UsageError, match="--revision"):
        Destination.of(model, None, revision="main")


@pytest.mark.parametrize("name", ["org/model.safetensors", "org/model.GGUF", "org/model.safetensors.index.json"])
def test_a_missing_path_with_a_checkpoints_suffix_is_a_path_not_a_model_name(name):
    where = Destination.of(name, None)
    assert where.model is None and where.input == Path(name)
