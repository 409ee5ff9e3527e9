"""Another distribution's import name that a checkout of qcli shadows.

The Triton kernels sit in the top-level folder `kernels/` and install as `qcli.kernels`; the import name
`kernels` belongs to Hugging Face's `kernels` distribution, which transformers (from 5.25 a dependency of
it) imports where it is installed. Where the checkout's root is on `sys.path` (`python -m qcli` run from
it, the test suite), `import kernels` finds qcli's folder first, and transformers fails to import.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

SHADOWED = "kernels"


def import_shadowed_distribution() -> None:
    """Import the `kernels` distribution under its own name, from `sys.path` without the checkout's root,
    where that root would shadow it; elsewhere (an installed qcli, or no such distribution) do nothing, so
    that an import of it finds what it always would."""
    ours = importlib.util.find_spec("qcli.kernels")
    if ours is None or ours.origin is None:
        return
    folder = Path(ours.origin).resolve().parent
    loaded = sys.modules.get(SHADOWED)
    if loaded is not None and Path(getattr(loaded, "__file__", None) or "").resolve().parent != folder:
        return  # the distribution, already imported
    found = importlib.machinery.PathFinder.find_spec(SHADOWED, sys.path)
    if loaded is None and (found is None or found.origin is None or Path(found.origin).resolve().parent != folder):
        return  # the name is not shadowed here
    root = folder.parent
    path = [entry for entry in sys.path if Path(entry or ".").resolve() != root]
    spec = importlib.machinery.PathFinder.find_spec(SHADOWED, path)
    if spec is None or spec.loader is None:
        sys.modules.pop(SHADOWED, None)  # not installed: nothing imports the name then but through this folder
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[SHADOWED] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(SHADOWED, None)
        raise
