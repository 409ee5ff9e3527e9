"""Options and fixtures shared by the test modules: where the Triton kernels run, and a small checkpoint."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

SAMPLES = Path(__file__).resolve().parents[1] / "sample_weights"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu",
        help="where the kernel tests put their tensors: cuda runs the compiled kernels, cpu the kernels "
             "interpreted by Triton (TRITON_INTERPRET=1); default cuda where torch sees a GPU, else cpu")


def pytest_configure(config: pytest.Config) -> None:
    # Tests write only under temporary folders: Hypothesis keeps its example database in a temporary
    # folder of the session too, not in .hypothesis/ of the working directory (the checkout).
    from hypothesis.configuration import set_hypothesis_home_dir

    home = tempfile.mkdtemp(prefix="qcli-hypothesis-")
    set_hypothesis_home_dir(home)
    config.add_cleanup(lambda: shutil.rmtree(home, ignore_errors=True))
    if config.getoption("--device") == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("--device cuda: torch sees no CUDA device")
    if config.getoption("--device") == "cpu":
        # Triton chooses between compiling and interpreting as it defines each kernel, so the variable is
        # set before any test module imports qcli.kernels, for every test alike; undone at the end.
        interpret = pytest.MonkeyPatch()
        interpret.setenv("TRITON_INTERPRET", "1")
        config.add_cleanup(interpret.undo)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--device") != "cuda":
        needs_cuda = pytest.mark.skip(reason="needs a CUDA device (--device cuda)")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(needs_cuda)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Where tests load qcli's output in Burn, the harnesses are built now, saying so, rather than
    silently inside the first of those tests."""
    if not session.config.option.collectonly and any(item.get_closest_marker("burn") for item in session.items):
        from tests import burn_harness

        terminal = session.config.pluginmanager.get_plugin("terminalreporter")
        burn_harness.build_before_tests(lambda line: terminal.write_line(line) if terminal else None)


def pytest_terminal_summary(terminalreporter) -> None:
    """The figures tests measured in Burn (whole models' agreement with torch), so CI logs show them."""
    from tests import burn_harness

    if burn_harness.FIGURES:
        terminalreporter.section("measured in Burn")
        for line in burn_harness.FIGURES:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def device(pytestconfig: pytest.Config) -> str:
    """The torch device the kernel tests put their tensors on (--device)."""
    return pytestconfig.getoption("--device")


@pytest.fixture(scope="session")
def kernels():
    """qcli.kernels, compiled or interpreted as --device chose in pytest_configure."""
    import qcli.kernels

    return qcli.kernels


@pytest.fixture(scope="session")
def small_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real checkpoint written by `safetensors` itself, holding what a PyTorch model saves: F32 conv,
    bias and linear weights, a BF16 matrix, and I64 tensors, a scalar (num_batches_tracked) among them."""
    generator = torch.Generator().manual_seed(0)
    tensors = {
        "conv1.weight": torch.randn(8, 1, 3, 3, generator=generator),
        "conv1.bias": torch.randn(8, generator=generator),
        "fc1.weight": torch.randn(64, 32, generator=generator),
        "embed.weight": torch.randn(16, 32, generator=generator).to(torch.bfloat16),
        "positions": torch.arange(4),
        "norm1.num_batches_tracked": torch.tensor(938),
    }
    path = tmp_path_factory.mktemp("checkpoint") / "model.safetensors"
    save_file(tensors, path)
    return path


def _listing(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="session", autouse=True)
def samples_untouched() -> Iterator[None]:
    """The tests read the sample weights and write nothing beside them: whatever a user's own runs left
    there (`qcli quantize sample_weights/tiny-llama.safetensors` writes tiny-llama.bpk) stays as it was
    and decides no test (those that need an output write it under tmp_path)."""
    before = _listing(SAMPLES)
    yield
    assert _listing(SAMPLES) == before, "a test wrote into sample_weights/"
