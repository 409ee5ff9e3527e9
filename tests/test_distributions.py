"""The checkout's top-level kernels/ folder and Hugging Face's `kernels` distribution, which transformers
(5.25 on) imports: from the checkout's root, before the fix, `import kernels` found qcli's folder and
transformers failed to import."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_from_root(code: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter whose first path entry is the checkout's root, as `python -m qcli`
    run there has it."""
    program = f"import sys; sys.path.insert(0, {str(ROOT)!r})\n{code}"
    return subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=300)


def installed() -> bool:
    try:
        importlib.metadata.version("kernels")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_from_the_root_the_name_finds_qclis_folder_until_the_distribution_is_imported():
    found = run_from_root("import importlib.util; print(importlib.util.find_spec('kernels').origin)")
    assert found.returncode == 0, found.stderr
    assert Path(found.stdout.strip()) == ROOT / "kernels" / "__init__.py"  # the shadow the fix is for
    fixed = run_from_root("from qcli.distributions import import_shadowed_distribution\n"
                          "import_shadowed_distribution()\n"
                          "module = sys.modules.get('kernels')\n"
                          "print(module.__file__ if module is not None else 'absent')")
    assert fixed.returncode == 0, fixed.stderr
    if installed():
        assert Path(fixed.stdout.strip()).parent != ROOT / "kernels"
        assert Path(fixed.stdout.strip()).name == "__init__.py"
    else:
        assert fixed.stdout.strip() == "absent"


def test_qcli_imports_transformers_models_from_the_root():
    pytest.importorskip("transformers")
    done = run_from_root("from qcli.calibrate.model import transformers_module\n"
                         "transformers = transformers_module()\n"
                         "from transformers import LlamaForCausalLM\n"
                         "print(LlamaForCausalLM.__name__)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "LlamaForCausalLM"


def test_an_installed_qcli_leaves_the_name_alone(tmp_path):
    """Away from the root the name is not shadowed: nothing is imported on its behalf."""
    program = ("import sys\nfrom qcli.distributions import import_shadowed_distribution\n"
               "import_shadowed_distribution()\nprint('kernels' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
