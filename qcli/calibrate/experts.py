"""Fused experts: a MoE layer's experts held in one parameter ([experts, out, in]) that transformers makes from
the checkpoint's per-expert tensors (Mixtral's `w1`, `w3`, `w2`; Qwen-MoE's `gate_proj`, `up_proj`,
`down_proj`), calibrated as the Linears they are.

Which rows of which expert each checkpoint tensor becomes is read off transformers' own conversion
(`expert_slices`): run on markers (each tensor's rows numbered, and its columns) in place of the weights, it
must put every tensor's rows, whole and in order, into one expert's rows, its columns unmoved; a conversion
that does anything else (a transposed layout, as gpt-oss keeps its experts [experts, in, out]) gives none,
and its tensors stay uncalibrated. The markers are [rows, 1] and [1, columns], not the weights' size.

What each expert takes is caught as the experts run (`ExpertInputs`): transformers' eager experts call
`F.linear(x, weight[e])` on the tokens routed to expert e, so a torch function mode sums, for each call whose
weight is a view of expert e of a tracked parameter, that x into expert e's Hessian: the tokens routing gave
it and no other. Experts that never call F.linear on their weight are left uncalibrated (the runner); a call
on part of one expert's weight is refused. The run asks transformers for its eager experts
(`eager_experts`): the grouped kernels (`grouped_mm`) take every expert in one call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from qcli.calibrate.gptq import Hessian
from qcli.calibrate.model import Assembly
from qcli.errors import UsageError

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class ExpertSlice:
    """A checkpoint tensor (`name`) that is rows `rows` (int64, in the tensor's own row order) of expert
    `expert` of a fused parameter."""

    name: str
    expert: int
    rows: torch.Tensor


def expert_slices(assembly: Assembly, target: str, like: torch.Tensor, module: nn.Module,
                  shapes: Mapping[str, Sequence[int]]) -> list[ExpertSlice] | None:
    """Each checkpoint tensor of `assembly` as rows of one expert of the parameter `target` (its meta tensor
    `like`, [experts, out, in]), given the tensors' shapes; None where the conversion does not make the
    parameter of whole rows of its 2-D tensors in order (the module's docstring)."""
    if like.dim() != 3 or any(len(shapes.get(name, ())) != 2 for name in assembly.names):
        return None
    experts, out, columns = like.shape
    index = {name: i for i, name in enumerate(assembly.names)}
    try:
        # each tensor's rows numbered `tensor index * 2^32 + row` (exact in float64), and its columns
        rows = assembly.build(target, lambda name: (index[name] * 2.0**32 + torch.arange(
            shapes[name][0], dtype=torch.float64))[:, None], module)
        cols = assembly.build(target, lambda name: torch.arange(shapes[name][1], dtype=torch.float64)[None], module)
    except (RuntimeError, ValueError, IndexError, KeyError):  # an operation that needs the real shapes
        return None
    if tuple(rows.shape) != (experts, out, 1) or cols.dim() != 3 or cols.shape[0] != experts \
            or cols.shape[2] != columns or not torch.equal(cols, torch.arange(columns).to(cols).expand_as(cols)):
        return None
    found = []
    for expert in range(experts):
        numbers = rows[expert, :, 0].to(torch.int64)
        for tensor in numbers.div(2**32, rounding_mode="floor").unique().tolist():
            name = assembly.names[tensor]
            mine = torch.nonzero(numbers.div(2**32, rounding_mode="floor") == tensor)[:, 0]
            ordered = mine[torch.argsort(numbers[mine] % 2**32)]
            if shapes[name][1] != columns or not torch.equal(numbers[ordered] % 2**32,
                                                               torch.arange(shapes[name][0])):
                return None
            found.append(ExpertSlice(name, expert, ordered))
    if sorted(s.name for s in found) != sorted(assembly.names):  # a tensor in two experts, or in none
        return None
    return found


class ExpertInputs(TorchFunctionMode):
    """While active: each `F.linear(x, weight)` whose weight is expert e of a tracked parameter (`params`: a
    fused parameter, [experts, out, in]) sums x into that parameter's expert-e Hessian (`hessians[name][e]`,
    float64 [in, in] on the parameter's device, made as the expert is first reached)."""

    def __init__(self, params: Mapping[str, torch.Tensor]) -> None:
        super().__init__()
        self._tracked = {id(param): (name, param) for name, param in params.items()}
        self.hessians: dict[str, dict[int, Hessian]] = {name: {} for name in params}

    def __torch_function__(self, func: Callable, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.linear:
            weight = args[1] if len(args) > 1 else kwargs.get("weight")
            found = self._tracked.get(id(getattr(weight, "_base", None)))
            if found is not None:
                name, param = found
                expert = self._expert(weight, param)
                sums = self.hessians[name]
                if expert not in sums:
                    sums[expert] = Hessian(param.shape[2], param.device)
                sums[expert].add(args[0] if args else kwargs["input"])
        return func(*args, **kwargs)

    @staticmethod
    def _expert(weight: torch.Tensor, param: torch.Tensor) -> int:
        """Which expert of `param` the view `weight` is; an error for a view that is no one expert's whole."""
        offset = int(weight.storage_offset() - param.storage_offset())  # torch types it a SymInt
        expert, rest = divmod(offset, param.stride(0))
        if rest or tuple(weight.shape) != tuple(param.shape[1:]) or weight.stride() != param.stride()[1:]:
            raise UsageError(f"the model's experts run F.linear on a part of one expert's weight ({list(weight.shape)} "
                             f"of {list(param.shape)}), which calibration cannot follow",
                             hint="quantize without calibration, or keep the experts with a recipe rule")
        return expert


@contextmanager
def eager_experts(module: PreTrainedModel) -> Iterator[None]:
    """transformers' eager experts inside (one `F.linear` an expert, `ExpertInputs` catches), the model's own
    choice put back on leaving; nothing for a transformers without the setting."""
    get = getattr(module, "get_experts_implementation", None)
    if get is None:
        yield
        return
    before = get()
    module.set_experts_implementation("eager")
    try:
        yield
    finally:
        module.set_experts_implementation(before)
