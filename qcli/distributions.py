"""Another distribution's import name that a checkout of qcli shadows.

The Triton kernels sit in the top-level folder `kernels/` and install as `qcli.kernels`; the import name
`kernels` belongs to Hugging Face's `kernels` distribution, which transformers (from 5.25 a dependency of
it) imports. Where the checkout's root is on `sys.path` (`python -m qcli` run from it, the test suite,
the benchmarks), `import kernels` finds qcli's folder first. The folder's `__init__` then calls
`hand_over`, so whatever imports the name, in whatever order, gets the distribution.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path


def hand_over(name: str, init_file: str) -> None:
    """Put the distribution that the folder of `init_file` shadows under `name` in its place in
    `sys.modules`, found on `sys.path` without the checkout's root; the import in progress then returns
    it. Where no such distribution is installed, the import fails as it would without the checkout."""
    root = Path(init_file).resolve().parent.parent
    path = [entry for entry in sys.path if Path(entry or ".").resolve() != root]
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
