"""The functions the commands call: `quantize.quantize_file`, `inspect.inspect_file`,
`validate_scheme.validate_scheme`, `imatrix.imatrix_file`, `evaluate.evaluate_file`.

Each returns a report (`qcli.report`) or raises a `QcliError`; the CLI only parses and renders. They are
usable from Python as they are. torch is imported inside the functions that touch tensors.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from types import TracebackType


class collector_paused:  # noqa: N801 (a context manager, named as one)
    """Python's cyclic garbage collector off while a header becomes objects, until `resume` (what `with`
    gives) or the end of the block: those objects hold no cycles, and with hundreds of thousands of them
    alive every collection walks them all, 40 % of the time planning a header of 200k tensors took
    (docs/benchmarks.md). A run resumes it before any tensor is read."""

    def __enter__(self) -> Callable[[], None]:
        self._enabled = gc.isenabled()
        gc.disable()
        return self.resume

    def resume(self) -> None:
        if self._enabled:
            gc.enable()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.resume()
