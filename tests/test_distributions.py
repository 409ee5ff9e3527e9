"""The checkout's top-level kernels/ folder and Hugging Face's `kernels` distribution, which transformers
(5.25 on) imports: from the checkout's root `import kernels` finds qcli's folder, which must hand over to
the distribution whatever imports the name first."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The optional integrations the suite imports: each reaches `kernels` through transformers, or beside it.
INTEGRATIONS = ("compressed_tensors", "transformers.integrations.hub_kernels", "modelopt.torch.quantization",
                "bitsandbytes", "transformers")


def run_from_root(code: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter whose first path entry is the checkout's root, as `python -m qcli`
    and `python -m pytest` run there have it."""
    program = f"import sys; sys.path.insert(0, {str(ROOT)!r})\n{code}"
    return subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_from_the_root_the_name_is_shadowed():
    """The case the hand-over is for: without it, the name would find qcli's folder."""
    found = run_from_root("import importlib.util; print(importlib.util.find_spec('kernels').origin)")
    assert found.returncode == 0, found.stderr
    assert Path(found.stdout.strip()) == ROOT / "kernels" / "__init__.py"


# The name itself first, or an integration whose import chain reaches it (compressed-tensors through
# transformers' hub kernels, the order that broke a fresh clone).
@pytest.mark.parametrize("first", ["kernels", "compressed_tensors"])
def test_every_integration_imports_from_the_root_whatever_comes_first(first):
    """Each optional integration imports in a fresh interpreter from the root, with `first` imported before
    the rest, and `kernels` is then the distribution (or absent, where it is not installed)."""
    if importlib.util.find_spec(first.split(".")[0]) is None and first != "kernels":
        pytest.skip(f"{first} is not installed")
    order = [first, *(m for m in INTEGRATIONS if m != first)]
    code = ("import importlib, importlib.util\n"
            f"for name in {order!r}:\n"
            "    if name == 'kernels' or importlib.util.find_spec(name.split('.')[0]) is not None:\n"
            "        try:\n"
            "            importlib.import_module(name)\n"
            "        except ModuleNotFoundError as err:\n"
            "            if err.name != 'kernels':\n"
            "                raise\n"
            "module = sys.modules.get('kernels')\n"
            "print(module.__file__ if module is not None else 'absent')")
    done = run_from_root(code)
    assert done.returncode == 0, done.stderr[-4000:]
    assert Path(done.stdout.strip()).parent != ROOT / "kernels"


def test_qcli_kernels_is_still_qclis_folder():
    done = run_from_root("import kernels, qcli.kernels\nprint(qcli.kernels.__file__)\nprint(kernels is qcli.kernels)")
    assert done.returncode == 0 or "No module named 'kernels'" in done.stderr, done.stderr[-4000:]
    if done.returncode == 0:
        file, same = done.stdout.split()
        assert Path(file) == ROOT / "kernels" / "__init__.py"
        assert same == "False"


def test_qcli_builds_transformers_models_from_the_root():
    pytest.importorskip("transformers")
    done = run_from_root("from qcli.calibrate.checkpoint import transformers_module\n"
                         "transformers = transformers_module()\n"
                         "from transformers import LlamaForCausalLM\n"
                         "print(LlamaForCausalLM.__name__)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "LlamaForCausalLM"


def test_from_the_root_without_the_distribution_integrations_import_once_qcli_has(tmp_path):
    """Where Hugging Face's `kernels` is not installed, transformers finds the name, cannot read its version
    and imports it: after `import qcli` (the suite's, the benchmarks' and `python -m qcli`'s first import) the
    name finds nothing, as without the checkout. The interpreter sees this one's site-packages without the
    distribution: every other entry linked into a folder of its own, read as a site folder (its .pth files too)."""
    pytest.importorskip("transformers")
    site_packages = Path(importlib.util.find_spec("transformers").origin).parents[1]
    for entry in site_packages.iterdir():
        if entry.name != "kernels" and not entry.name.startswith("kernels-"):
            (tmp_path / entry.name).symlink_to(entry)
    code = (f"import site, sys\nsite.addsitedir({str(tmp_path)!r})\nsys.path.insert(0, {str(ROOT)!r})\n"
            "import importlib, importlib.util, qcli\n"
            f"for name in {INTEGRATIONS!r}:\n"
            "    if importlib.util.find_spec(name.split('.')[0]) is not None:\n"
            "        importlib.import_module(name)\n"
            "from transformers import LlamaForCausalLM\n"
            "print(importlib.util.find_spec('kernels'))")
    done = subprocess.run([sys.executable, "-S", "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip() == "None"
