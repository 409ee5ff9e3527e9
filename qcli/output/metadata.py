"""The burnpack metadata map qcli writes (docs/output.md), and the one reader of what it says back."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from qcli import __version__
from qcli.errors import InputError
from qcli.io.burnpack import metadata_json
from qcli.text import printable

if TYPE_CHECKING:
    from qcli.report.quantize import QuantizeReport

def written_transposed(path: Path, metadata: Mapping[str, str]) -> set[str]:
    """The tensors a file's metadata says `metadata` wrote `[in, out]` (none where it does not say)."""
    listed = metadata_json(path, "transposed", metadata.get("transposed", "[]"))
    if not isinstance(listed, list) or not all(isinstance(n, str) for n in listed):
        raise InputError(printable(f"{path}: metadata 'transposed' is not a JSON list of tensor names"),
                         hint="the file was not written by qcli, or was edited; write it again from its source")
    return set(listed)


def metadata(report: QuantizeReport, calibration: str | None = None) -> dict[str, str]:
    """The burnpack metadata map (docs/output.md); `calibration`, the `--calibration` asked for (`mse`),
    recorded with no file where the run has no calibration data."""
    meta = {
        "format": "burnpack",
        "producer": "qcli",
        "producer_version": __version__,
        "burn_version": report.burn_version,
        **({} if report.burn_backend is None else {"burn_backend": report.burn_backend}),
        "source_files": json.dumps([f.to_json() for f in report.source_files]),
        "preset": report.preset,
        "transposed": json.dumps([t.name for t in report.tensors if t.transposed]),
    }
    if report.recipe_sha256 is not None:
        meta["recipe_sha256"] = report.recipe_sha256
    record = report.calibration
    if record is not None:  # what it is asked to run on: the windows a short text gives are fewer
        assert record.file is not None, "a run's calibration names its file"
        meta["calibration"] = json.dumps({"method": record.method, "file": Path(record.file).name,
                                          "sha256": record.sha256, "samples": record.samples,
                                          "seq_len": record.seq_len, "seed": record.seed})
    elif calibration is not None:  # chosen from the weights alone
        meta["calibration"] = json.dumps({"method": calibration, "file": None, "sha256": None, "samples": None,
                                          "seq_len": None, "seed": None})
    return meta
