"""Another distribution's import name that a checkout of qcli shadows.

The Triton kernels sit in the top-level folder `kernels/` and install as `qcli.kernels`; the import name
`kernels` belongs to Hugging Face's `kernels` distribution, which transformers (from 5.25 a dependency of
it) looks for and imports. Where the checkout's root is on `sys.path` (`python -m qcli` run from it, the
test suite, the benchmarks), `import kernels` would find qcli's folder first. Importing qcli calls
`shield_checkout`, so that from then on the name finds only the distribution, or nothing where it is not
installed; the folder's `__init__` calls `hand_over` for an import of the name that comes before qcli's.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

SHADOWED = "kernels"
_ROOT = Path(__file__).resolve().parent.parent


def _elsewhere(name: str, root: Path) -> importlib.machinery.ModuleSpec | None:
    """The spec of `name` found on `sys.path` without the checkout's root."""
    path = [entry for entry in sys.path if Path(entry or ".").resolve() != root]
    return importlib.machinery.PathFinder.find_spec(name, path)


class _Elsewhere(importlib.abc.MetaPathFinder):
    """Finds `name` on `sys.path` without the checkout's root, ahead of the path finder that would not skip it."""

    def __init__(self, name: str, root: Path):
        self.name, self.root = name, root

    def find_spec(self, fullname, path=None, target=None):
        return _elsewhere(self.name, self.root) if fullname == self.name else None


def shield_checkout(root: Path = _ROOT, name: str = SHADOWED) -> None:
    """In a checkout (its root holds pyproject.toml and the folder `name`), make `import name` and
    `importlib.util.find_spec(name)` see the installed distribution, or none (`sys.modules[name]` set to None,
    as Python's import system reads it) where none is installed. Installed as a wheel, qcli has no such root."""
    if name in sys.modules or not ((root / "pyproject.toml").is_file() and (root / name).is_dir()):
        return
    if _elsewhere(name, root) is None:
        sys.modules[name] = None  # type: ignore[assignment]  # import's "not found" mark, which typeshed omits
    elif not any(isinstance(finder, _Elsewhere) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Elsewhere(name, root))


def hand_over(name: str, init_file: str) -> None:
    """Put the distribution that the folder of `init_file` shadows under `name` in its place in
    `sys.modules`, found on `sys.path` without the checkout's root; the import in progress then returns
    it. Where no such distribution is installed, the import fails as it would without the checkout."""
    spec = _elsewhere(name, Path(init_file).resolve().parent.parent)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
