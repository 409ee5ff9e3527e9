"""The options that name the Burn a file is for, shared by `quantize` and `validate-scheme`."""

from __future__ import annotations

from typing import Annotated

import typer

from qcli import BURN_VERSION
from qcli.burn_backends import BURN_VERSIONS, BurnBackend, version_label

BurnBackendOption = Annotated[
    BurnBackend | None,
    typer.Option(
        "--burn-backend",
        metavar="flex|ndarray|wgpu|cuda",
        help="The Burn backend the file is for: refuse every tensor (or, without a model, scheme) it cannot"
        " load or compute with (docs/output.md); without --scheme, quantize with its best 4-bit form"
        " (docs/presets.md). cuda is measured for Burn 0.21 only (--burn-version 0.21). Default: warn about"
        " what flex or wgpu cannot.",
    ),
]
BurnVersionOption = Annotated[
    str | None,
    typer.Option(
        "--burn-version",
        metavar="VERSION",
        help=f"The Burn release the file is for: {', '.join(map(version_label, BURN_VERSIONS))} (default"
        f" {BURN_VERSION}, the newest stable). 0.21 reads one-level schemes only; 0.23 is Burn's pre-release,"
        " never the default.",
    ),
]
