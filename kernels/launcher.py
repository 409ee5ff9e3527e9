"""Launching a compiled Triton kernel again without its JIT.

Every launch of a shape and scheme is the same but for its pointers, so its arguments are worked out once
(`Launch`, memoized by `qcli.kernels.launch` per scheme, shape and dtype): the first launch goes through
Triton's JIT, which compiles the kernel and checks its arguments; later ones go straight to the compiled
kernel with raw device addresses, skipping the JIT's per-launch binding and specialization, several
microseconds each, which at 4096² is most of the device's time.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import triton


def interpreted() -> bool:
    """Whether Triton runs kernels in its interpreter (TRITON_INTERPRET=1), on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET") == "1"


class View(NamedTuple):
    """`length` bytes of the uint8 tensor `base` from byte `offset`, as `dtype`: a pointer argument that
    is a torch view only for the launch that compiles."""

    base: torch.Tensor
    offset: int
    length: int
    dtype: torch.dtype = torch.uint8

    def tensor(self) -> torch.Tensor:
        part = self.base[self.offset : self.offset + self.length]
        return part if self.dtype is torch.uint8 else part.view(self.dtype)

    def data_ptr(self) -> int:
        return self.base.data_ptr() + self.offset


@dataclass
class Launch:
    """One kernel's launch for one shape and scheme: its grid, its integer arguments and its constexprs
    (with the launch options), all fixed; the pointers (tensors, `View`s or None, first in every
    kernel's signature) vary. Triton specializes a kernel on each pointer's element type and on whether it
    is 16-byte aligned, so the compiled kernel is kept per both: an input of another dtype (bf16 after f32)
    must not run the kernel compiled for the first."""

    kernel: Any  # a Triton JITFunction (Triton has no type information)
    grid: int
    ints: tuple[int, ...]
    constexprs: dict[str, object]
    _compiled: dict[tuple[object, ...], Callable[..., object]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # the parameters in order: pointers, ints, then the constexprs, which launch by position too
        names = getattr(self.kernel, "arg_names", None)
        self._constexpr_values = None if names is None else tuple(
            self.constexprs[n] for n in names if n in self.constexprs)

    def __call__(self, *pointers) -> None:
        addresses = tuple(None if p is None else p.data_ptr() for p in pointers)
        key = tuple(None if p is None or a is None else (p.dtype, a % 16 == 0)
                    for p, a in zip(pointers, addresses, strict=True))
        runner = self._compiled.get(key)
        if runner is None:
            args = [p.tensor() if isinstance(p, View) else p for p in pointers]
            compiled = self.kernel[(self.grid,)](*args, *self.ints, **self.constexprs)
            if compiled is not None and not interpreted():  # the interpreter compiles nothing
                runner = _runner(compiled, self.grid, self._constexpr_values is not None)
                if runner is not None:
                    self._compiled[key] = runner
            return
        assert self._constexpr_values is not None, "a runner is kept only for a kernel launched by position"
        runner(*addresses, *self.ints, *self._constexpr_values)


def _runner(compiled: Any, grid: int, positional: bool) -> Callable[..., object] | None:
    """The compiled kernel's own launcher for `grid` (it takes the current stream per call), or None where
    this Triton's compiled kernel offers none (its launch path is not public API): every launch then goes
    through the JIT, slower by its binding but the same kernel, and a warning says so once."""
    try:
        runner = compiled[(grid, 1, 1)] if positional else None
    except (TypeError, KeyError, AttributeError):
        runner = None
    if not callable(runner):
        warn_jit_launches()
        return None
    return runner


@functools.cache
def warn_jit_launches() -> None:
    warnings.warn(f"Triton {triton.__version__} offers no direct launch of a compiled kernel: every launch goes "
                  "through its JIT, which is slower per launch but computes the same bytes", RuntimeWarning,
                  stacklevel=3)
