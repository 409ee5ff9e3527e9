"""The calibration run: the model's repeated blocks one at a time, each Linear's inputs summed into its Hessian.

As GPTQ and llm-compressor's sequential pipeline do, the embeddings (whatever runs before the first block)
run once for every window, and the first block's inputs are caught there, its keyword arguments (mask,
positions, rotary embeddings) with them; then each block in turn is loaded from the checkpoint, run on
every window with its float weights while a hook on each Linear to calibrate sums H = sum x x^T over the
tokens of its input (float64; Linears fed the same tensor, as q, k and v are, share one sum), handed to
`on_linear` Linear by Linear, which may put a quantized weight in its place; run again where one did, so
that the next block sees what the quantized block gives; and put back on the meta device. Memory holds one
block's weights and Hessians and the activations of every window twice (a block's inputs and outputs),
never the whole model.

On CUDA the blocks' float32 matrix products run in TF32 (10 mantissa bits, the activations' rounding of
the fp16 and bf16 runs GPTQ's reference code and llm-compressor make), which halves the two passes (8.8 s to
4.5 s a block of a Llama-3-8B-shaped model on 128 windows of 2048 tokens, H200); the Hessians' products
(float64) and what `on_linear` computes keep full precision.

The first block's keyword arguments are every block's where the model's layers are all alike. Where its
config gives them several kinds (`layer_types`: sliding-window attention beside global attention, as Gemma 2
and 3 interleave them, each kind with its own mask and, in Gemma 3, its own rotary embeddings), the catch
goes on past the first block, each block passed through (its input given back as its output, none of its
weights loaded), and each block keeps the arguments the model gave it: every block runs with its own
kind's inputs. Parameters transformers assembles from several checkpoint tensors (a MoE layer's experts,
fused into one [experts, out, in] tensor) are assembled as transformers does (`model.Assembly`), so MoE
blocks run with their routing; each checkpoint tensor of such experts is calibrated as the Linear it is,
on the tokens routed to its expert (`experts`: its rows of the fused parameter read off transformers'
conversion, its input caught as the expert runs), its weight put back in those rows. Only these and
`nn.Linear` layers are calibrated: the Linears outside the blocks (an LM head, BERT's pooler) are not run,
and are returned apart, as are names that are neither (GPT-2's Conv1D, a MoE router's weight, experts a
conversion lays out otherwise).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
from torch import nn

from qcli.calibrate.data import CalibrationSet
from qcli.calibrate.experts import ExpertInputs, ExpertSlice, eager_experts, expert_slices
from qcli.calibrate.gptq import Hessian
from qcli.calibrate.model import CalibrationModel, build_model, token_embedding
from qcli.errors import InputError, InternalError, UsageError
from qcli.text import quoted

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from qcli.io.source import TensorInfo


SLACK = 64 << 20  # bytes estimate_memory allows for cuBLAS's workspace and the caching allocator's rounding
# On the CPU a block runs on this many tokens of windows a call at most: one window of 256 tokens at a time,
# SmolLM2's block took 5 to 8 times as long as the same 16 windows in one call on 2 loaded cores
# (docs/benchmarks.md), each small product paying the threads' start and join.
CPU_BATCH_TOKENS = 4096


@dataclass
class LinearStats:
    """What calibration saw of one Linear's input: `name`, the checkpoint name of its weight; `tokens`, the
    tokens it took (every window's, or fewer for an expert that routing skips); `importance` (float64 [in],
    on the CPU), diag(H) / tokens, the mean square of each input channel (llama.cpp's imatrix quantity);
    `hessian` (float64 [in, in], on the run's device), H = sum of x x^T over those tokens, held only while
    `on_linear` runs (None in `run_blocks`' result: a large model's would not fit in memory together)."""

    name: str
    tokens: int
    importance: torch.Tensor
    hessian: torch.Tensor | None = None


# on_linear(name, weight, stats): the float weight ([out, in], the run's dtype and device) and its stats;
# returns the weight to put in its place (quantized then dequantized), or None to leave it float.
OnLinear = Callable[[str, torch.Tensor, LinearStats], "torch.Tensor | None"]


@dataclass(frozen=True)
class BlockDone:
    """How far a calibration run is: `done` blocks of `count` (0 as it starts), `tokens` run through each,
    in `seconds` since it started (the embeddings, and each block's load, both passes and the Linears'
    callbacks)."""

    done: int
    count: int
    tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.done * self.tokens / self.seconds if self.seconds > 0 else float("inf")


BlockProgress = Callable[[BlockDone], None]  # hears of each block done


@dataclass(frozen=True)
class CalibrationRun:
    """`stats` of each calibrated Linear by its weight's checkpoint name; the names asked for that were not
    calibrated: `outside`, the weights of Linears outside the repeated blocks, and `not_linear`, names that
    are no nn.Linear's weight in the model; and the count of `blocks` run."""

    stats: dict[str, LinearStats]
    outside: list[str]
    not_linear: list[str]
    blocks: int


def repeated_blocks(module: nn.Module) -> tuple[str, nn.ModuleList]:
    """The model's repeated blocks and their path: the nn.ModuleList holding the most parameters (the
    layers, not the experts inside one of them)."""
    lists = [(name, sub) for name, sub in module.named_modules() if isinstance(sub, nn.ModuleList) and len(sub)]
    if not lists:
        raise UsageError(f"{type(module).__name__} has no repeated blocks (an nn.ModuleList of layers) to "
                         "calibrate one at a time", hint="quantize without calibration")
    return max(lists, key=lambda item: sum(p.numel() for p in item[1].parameters()))


def shapes_of(infos: Sequence[TensorInfo]) -> dict[str, tuple[int, ...]]:
    """Each checkpoint tensor's shape, by name: what fused experts' rows are read off (`block_linears`)."""
    return {info.name: tuple(info.shape) for info in infos}


def block_linears(model: CalibrationModel, shapes: Mapping[str, Sequence[int]]) -> list[str]:
    """The checkpoint names of the weights of the nn.Linear layers in the model's repeated blocks, and of the
    checkpoint tensors of their fused experts (given the checkpoint's tensor `shapes`), block by block in
    the order they run: what `run_blocks` can calibrate (no weight is read)."""
    path, blocks = repeated_blocks(model.module)
    return [name for index, block in enumerate(_linears_by_block(model, path, blocks))
            for name in [n for _, n in block]
            + [s.name for _, slices in _fused_experts(model, path, index, blocks[index], shapes) for s in slices]]


def _linears_by_block(model: CalibrationModel, path: str, blocks: nn.ModuleList) -> list[list[tuple[nn.Linear, str]]]:
    """Each block's nn.Linear layers with the checkpoint names of their weights, in the order they run."""
    return [[(sub, model.names[f"{name}.weight"]) for name, sub in block.named_modules(prefix=f"{path}.{index}")
             if isinstance(sub, nn.Linear) and f"{name}.weight" in model.names]
            for index, block in enumerate(blocks)]


def _fused_experts(model: CalibrationModel, path: str, index: int, block: nn.Module,
                   shapes: Mapping[str, Sequence[int]]) -> list[tuple[str, list[ExpertSlice]]]:
    """Block `index`'s fused experts (parameters transformers makes of several checkpoint tensors, [experts,
    out, in]) whose checkpoint tensors are whole rows of one expert each (`experts.expert_slices`), by name."""
    found = []
    for name, param in block.named_parameters(prefix=f"{path}.{index}"):
        assembly = model.assembled.get(name)
        slices = None if assembly is None else expert_slices(assembly, name, param, model.module, shapes)
        if slices is not None:
            found.append((name, slices))
    return found


def run_blocks(model: CalibrationModel, tokens: CalibrationSet, linears: Collection[str], on_linear: OnLinear,
               device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
               progress: BlockProgress | None = None, hessians: bool = True) -> CalibrationRun:
    """Run `tokens`' windows through `model` block by block on `device`, computing in `dtype`; for each
    nn.Linear whose weight's checkpoint name is in `linears`, in the order of the block's modules, then each
    checkpoint tensor of fused experts in `linears`, call `on_linear` with the stats of its input and put
    in place the weight it returns. `progress` hears of the start and of each block done. Without
    `hessians`, only each Linear's input channels' sums of squares are summed (`LinearStats.hessian` None):
    all an importance matrix needs of H, its diagonal, which spares the float64 [in, in] products (`qcli
    imatrix` and a target's sensitivity; docs/benchmarks.md measures the pass against plain torch's). The
    model's buffers are left on `device`."""
    device = torch.device(device)
    module = model.module
    path, blocks = repeated_blocks(module)
    wanted = set(linears)
    asked = [[(sub, name) for sub, name in block if name in wanted] for block in _linears_by_block(model, path, blocks)]
    shapes: dict[str, tuple[int, ...]] = {}  # of the checkpoint tensors read, which the experts' rows are read off

    def tensor(name: str) -> torch.Tensor:
        value = model.tensor(name)
        shapes[name] = tuple(value.shape)
        return value

    reading = replace(model, tensor=tensor)
    fused = any(name in wanted for assembly in model.assembled.values() for name in assembly.names)
    for sub in module.modules():  # small, and needed where the blocks run
        sub._buffers.update({name: b.to(device) for name, b in sub._buffers.items() if b is not None})
    stats: dict[str, LinearStats] = {}
    start = time.perf_counter()
    if progress is not None:
        progress(BlockDone(0, len(blocks), tokens.used, 0.0))
    with torch.no_grad(), eager_experts(module) if fused else nullcontext():
        hidden, extras = _block_inputs(reading, blocks, tokens.tokens, device, dtype)
        spare = torch.empty_like(hidden)
        for index, block in enumerate(blocks):
            with _checkpoint_weights(reading, device, dtype) as load:
                for name, sub in block.named_modules(prefix=f"{path}.{index}"):
                    load(sub, name)
                experts = [] if not fused else [
                    (block.get_parameter(name.removeprefix(f"{path}.{index}.")), mine)
                    for name, slices in _fused_experts(model, path, index, block, shapes)
                    for mine in [[s for s in slices if s.name in wanted]] if mine]
                stats |= _calibrated(block, asked[index], experts, hidden, extras[index], spare, on_linear,
                                     hessians)
            hidden, spare = spare, hidden
            if progress is not None:
                progress(BlockDone(index + 1, len(blocks), tokens.used, time.perf_counter() - start))
    every = {model.names.get(f"{name}.weight") for name, sub in module.named_modules() if isinstance(sub, nn.Linear)}
    every |= stats.keys()
    return CalibrationRun(stats, sorted((wanted & every) - stats.keys()), sorted(wanted - every), len(blocks))


def _calibrated(block: nn.Module, linears: list[tuple[nn.Linear, str]],
                experts: list[tuple[nn.Parameter, list[ExpertSlice]]], hidden: torch.Tensor,
                extras: list[tuple[tuple, dict]], out: torch.Tensor, on_linear: OnLinear, hessians: bool
                ) -> dict[str, LinearStats]:
    """The stats of `block`'s `linears` (with their checkpoint names) and of its fused `experts`' checkpoint
    tensors over every window of `hidden`, run with the block's float weights, each handed to `on_linear` in
    turn; `out` left holding the block's outputs, with the weights on_linear gave back (run again where it
    gave any)."""
    sums = _HessianSums(linears, hessians)
    hooks = [linear.register_forward_hook(sums.hook(index)) for index, (linear, _) in enumerate(linears)]
    routed = ExpertInputs({str(i): param for i, (param, _) in enumerate(experts)})
    try:
        with routed if experts else nullcontext():
            _run(block, hidden, extras, out)
    finally:
        sums.last = None
        for hook in hooks:
            hook.remove()
    stats, changed = {}, False
    for index, (linear, name) in enumerate(linears):
        give_back_cached(hidden.device)
        found = sums.stats(index)
        changed |= _replace(linear, name, on_linear(name, linear.weight.detach(), found))
        found.hessian = None
        sums.release(index)  # a sum freed once the last Linear that reads it has had its turn
        stats[name] = found
    for index, (param, slices) in enumerate(experts):
        by_expert = routed.hessians[str(index)]
        if not by_expert:  # the experts ran without F.linear on any expert's weight: their inputs are not known
            continue
        for piece in slices:  # an expert routing never reached has no tokens: zero H, as llama.cpp counts it
            give_back_cached(hidden.device)
            total = by_expert.get(piece.expert) or by_expert.setdefault(piece.expert, Hessian(param.shape[2],
                                                                                              param.device))
            found = _input_stats(piece.name, total)
            weight = param[piece.expert, piece.rows]
            given = on_linear(piece.name, weight, found)
            if given is not None:
                _check_shape(piece.name, given, weight)
                param[piece.expert, piece.rows] = given.to(param.dtype)
                changed = True
            found.hessian = None
            stats[piece.name] = found
        routed.hessians[str(index)] = {}
    if changed:
        give_back_cached(hidden.device)
        _run(block, hidden, extras, out)
    return stats


def give_back_cached(device: torch.device) -> None:
    """Between the run's phases (a block's pass, one Linear's GPTQ, the next pass), and after the run, hand
    the blocks torch's caching allocator keeps free back to the device: each phase allocates tensors of
    other sizes (a pass its windows' activations, GPTQ float64 [in, in] matrices of up to 1.6 GB), which
    blocks cached by the last phase do not fit, so without this the allocator held each phase's cache
    beside the next's, and the run's cache beside the pipeline's buffers after it (with it, 21.24 GB at
    most for a Llama-3-8B-shaped model on an H200, docs/benchmarks.md)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def layer_kinds(module: nn.Module) -> list[str]:
    """The kinds the model's config gives its layers (`layer_types`: `sliding_attention`, `full_attention`),
    each once, in the order they first come; empty where it gives none."""
    config = getattr(module, "config", None)
    kinds = getattr(config.get_text_config(), "layer_types", None) if config is not None else None
    return list(dict.fromkeys(kinds or ()))


class _Stop(Exception):
    """Raised by the hook on the first block once it has its inputs: nothing after it needs to run."""


def _block_inputs(model: CalibrationModel, blocks: nn.ModuleList, ids: torch.Tensor, device: torch.device,
                  dtype: torch.dtype) -> tuple[torch.Tensor, list[list[tuple[tuple, dict]]]]:
    """The first block's input for every window ([windows, seq_len, hidden]) and, for each block, the other
    arguments it takes with it (positional, keyword), each window's: the first block's for every block where
    the layers are all alike, each block's own where the config gives them several kinds (the module's
    docstring). A tensor that windows or blocks get alike is kept once. Only the modules that run before
    the first block are loaded, as they run."""
    module = model.module
    hidden: torch.Tensor | None = None
    every = len(layer_kinds(module)) > 1
    caught: list[list[tuple[tuple, dict]]] = [[] for _ in blocks] if every else [[]]
    pool = _Pool()

    def catcher(index: int) -> Callable:
        def forward(*args, **kwargs):
            nonlocal hidden
            first, args = (args[0], args[1:]) if args else (kwargs.pop("hidden_states"), args)
            window = len(caught[index])
            if index == 0:
                if hidden is None:
                    hidden = first.new_empty((ids.shape[0], *first.shape[1:]))
                hidden[window] = first[0]
            caught[index].append(pool.shared((args, kwargs), caught[index][0] if window else None))
            if index == len(caught) - 1:
                raise _Stop
            return first  # passed through: the next block's arguments are all that is wanted of it

        return forward

    inside = {id(sub) for sub in blocks.modules()}
    owners = [(name, sub) for name, sub in module.named_modules()
              if id(sub) not in inside and any(p is not None for p in sub._parameters.values())]
    options = {"use_cache": False} if "use_cache" in inspect.signature(module.forward).parameters else {}
    with _checkpoint_weights(model, device, dtype) as load:
        hooks = [sub.register_forward_pre_hook(lambda sub, _args, name=name: load(sub, name)) for name, sub in owners]
        for index in range(len(caught)):
            blocks[index].forward = catcher(index)  # an instance attribute: nn.Module calls it in the class's place
        try:
            for row in ids:
                try:
                    module(input_ids=row[None].to(device), **options)
                except _Stop:
                    continue
                raise InternalError(f"{type(module).__name__} ran to its end without reaching its last block")
        finally:
            for index in range(len(caught)):
                del blocks[index].forward
            for hook in hooks:
                hook.remove()
    assert hidden is not None, "every window reaches the first block"
    return hidden, caught if every else caught * len(blocks)


class _Pool:
    """Tensors kept once: an attention mask or position embeddings that every window, or every block of a
    kind, gets alike."""

    def __init__(self) -> None:
        self.distinct: dict[tuple, list[torch.Tensor]] = {}  # the first window's tensors, by shape and dtype

    def shared(self, value, first):
        """`value` with each tensor equal to `first`'s in its place (the block's first window) replaced by
        `first`'s; on the first window (`first` None), by an equal one an earlier block took."""
        if isinstance(value, torch.Tensor):
            if first is None:
                return self._known(value)
            same = (isinstance(first, torch.Tensor) and first.shape == value.shape and first.dtype == value.dtype
                    and torch.equal(first, value))
            return first if same else value
        if isinstance(value, tuple | list):
            if first is None:
                return type(value)(self.shared(v, None) for v in value)
            if type(first) is type(value) and len(first) == len(value):
                return type(value)(self.shared(v, f) for v, f in zip(value, first, strict=True))
        if isinstance(value, dict):
            if first is None:
                return {key: self.shared(v, None) for key, v in value.items()}
            if isinstance(first, dict):
                return {key: self.shared(v, first.get(key)) for key, v in value.items()}
        return value

    def _known(self, value: torch.Tensor) -> torch.Tensor:
        alike = self.distinct.setdefault((tuple(value.shape), value.dtype, value.device), [])
        found = next((known for known in alike if torch.equal(known, value)), None)
        if found is None:
            alike.append(value)
        return found if found is not None else value


@contextmanager
def _checkpoint_weights(model: CalibrationModel, device: torch.device, dtype: torch.dtype
                        ) -> Iterator[Callable[[nn.Module, str], None]]:
    """`load(owner, path)` puts the checkpoint's tensors in place of the meta parameters that `owner` (at
    `path` in the model) holds itself, float ones in `dtype`, on `device`; on leaving, the meta parameters
    are put back and the loaded ones freed."""
    loaded: list[tuple[nn.Module, str, nn.Parameter]] = []

    def load(owner: nn.Module, path: str) -> None:
        for name, meta in list(owner._parameters.items()):
            if meta is None or meta.device.type != "meta":
                continue
            value = model.parameter(f"{path}.{name}" if path else name, meta)
            value = value.to(device, dtype) if value.is_floating_point() else value.to(device)
            owner._parameters[name] = nn.Parameter(value, requires_grad=False)
            loaded.append((owner, name, meta))

    try:
        yield load
    finally:
        for owner, name, meta in reversed(loaded):
            owner._parameters[name] = meta


class _SquareSums:
    """Σ x² per input channel (float64 [in]) over the tokens of one Linear's input, and how many tokens: the
    diagonal of `Hessian.matrix` without its off-diagonal products."""

    def __init__(self, columns: int, device: torch.device) -> None:
        self.diagonal = torch.zeros(columns, dtype=torch.float64, device=device)
        self.tokens = 0

    def add(self, x: torch.Tensor) -> None:
        rows = x.detach().reshape(-1, self.diagonal.shape[0]).to(torch.float64)
        self.diagonal += rows.square_().sum(0)
        self.tokens += rows.shape[0]


class _HessianSums:
    """Forward hooks summing the inputs of a block's Linears (by index in `linears`) into Hessians
    (H = sum x x^T, float64), or, without `hessians`, into their diagonals alone, one per distinct input: a
    Linear fed the very tensor the Linear before it took (q, k and v; gate and up) reads that one's sum, the
    same matrix, which spares a block most of its float64 products. Which Linears share is settled on the
    first window and held on every other."""

    def __init__(self, linears: list[tuple[nn.Linear, str]], hessians: bool = True) -> None:
        self.linears = [linear for linear, _ in linears]
        self.names = [name for _, name in linears]
        self.hessians = hessians
        self.sums: dict[int, Hessian | _SquareSums] = {}
        self.owner: dict[int, int] = {}  # a Linear's index -> the index whose sum it reads (its own: absent)
        self.last: tuple[torch.Tensor, int] | None = None  # the input summed last, and whose sum took it

    def hook(self, index: int) -> Callable[[nn.Module, tuple, torch.Tensor], None]:
        def add(_linear: nn.Module, args: tuple, _output: torch.Tensor) -> None:
            x = args[0]
            same = self.last is not None and self.last[0] is x
            reads = self._root(self.last[1]) if self.last is not None and same else index
            if index not in self.sums and index not in self.owner:  # its first window
                if same:
                    self.owner[index] = reads
                else:
                    self.sums[index] = self._new(index)
            elif self._root(index) != reads:
                raise InternalError(f"the input of {quoted(self.names[index])} is another Linear's on one window "
                                    "and its own on another")
            if not same:
                self.sums[index].add(x)
            self.last = (x, index)

        return add

    def _root(self, index: int) -> int:
        return self.owner.get(index, index)

    def _new(self, index: int) -> Hessian | _SquareSums:
        linear = self.linears[index]
        return (Hessian if self.hessians else _SquareSums)(linear.in_features, linear.weight.device)

    def stats(self, index: int) -> LinearStats:
        """The stats of Linear `index`'s input; an input error where it held NaN or Inf, which every
        diagonal element of H, a sum of squares, shows in its own channel (checked once, not at every
        window)."""
        root = self._root(index)
        total = self.sums.get(root) or self.sums.setdefault(root, self._new(index))  # never called: zeros
        return _input_stats(self.names[index], total)

    def release(self, index: int) -> None:
        """Free the sum Linear `index` read where no Linear after it reads it too."""
        root = self._root(index)
        if all(self._root(later) != root for later in range(index + 1, len(self.names))):
            self.sums.pop(root, None)


def _input_stats(name: str, total: Hessian | _SquareSums) -> LinearStats:
    """The stats of the input summed in `total` into the weight `name`; an input error where it held NaN or
    Inf, which every diagonal element of H, a sum of squares, shows in its own channel (checked once, not at
    every window)."""
    if isinstance(total, Hessian):
        hessian, diagonal = total.matrix, total.matrix.diagonal()
    else:
        hessian, diagonal = None, total.diagonal
    tokens = total.tokens
    if not torch.isfinite(diagonal).all():
        raise InputError(f"the calibration activations into {quoted(name)} hold NaN or Inf values",
                         hint="the checkpoint's weights before it may hold them, or the activations overflow "
                              "the dtype computed in: calibrate in float32")
    return LinearStats(name, tokens, (diagonal / max(tokens, 1)).cpu(), hessian)


def _run(block: nn.Module, hidden: torch.Tensor, extras: list[tuple[tuple, dict]], out: torch.Tensor) -> None:
    """`block` on the windows of `hidden` (`_batches` of them at a time), its output written to `out` (matrix
    products in TF32 on CUDA: the module's docstring)."""
    with _tf32(hidden.device):
        for start, stop in _batches(hidden, extras):
            args, kwargs = extras[start]
            result = block(hidden[start:stop], *args, **kwargs)
            out[start:stop] = result if isinstance(result, torch.Tensor) else result[0]


def _batches(hidden: torch.Tensor, extras: list[tuple[tuple, dict]]) -> Iterator[tuple[int, int]]:
    """The windows run in one call, as [start, stop) ranges: on the CPU, consecutive windows whose arguments
    are alike (`_alike`), up to CPU_BATCH_TOKENS tokens; on other devices each window alone, which keeps
    `estimate_memory`'s bound."""
    most = max(1, CPU_BATCH_TOKENS // hidden.shape[1]) if hidden.device.type == "cpu" else 1
    start = 0
    while start < len(extras):
        stop = start + 1
        while stop < len(extras) and stop - start < most and _alike(extras[stop], extras[start]):
            stop += 1
        yield start, stop
        start = stop


def _alike(a, b) -> bool:
    """Whether two windows' block arguments are the same: the very same tensors (`_Pool` shares equal ones),
    equal plain values, in the same structure."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    if isinstance(a, tuple | list):
        return type(a) is type(b) and len(a) == len(b) and all(_alike(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_alike(a[k], b[k]) for k in a)
    return a is b or (isinstance(a, bool | int | float | str) and type(a) is type(b) and a == b)


@contextmanager
def _tf32(device: torch.device) -> Iterator[None]:
    """float32 matrix products in TF32 inside, on a CUDA `device`; torch's setting put back on leaving."""
    if device.type != "cuda":
        yield
        return
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def _replace(linear: nn.Linear, name: str, weight: torch.Tensor | None) -> bool:
    """Put `weight` (on_linear's answer) in place of `linear`'s; whether there was one."""
    if weight is None:
        return False
    _check_shape(name, weight, linear.weight)
    linear.weight.copy_(weight)
    return True


def _check_shape(name: str, given: torch.Tensor, weight: torch.Tensor) -> None:
    if tuple(given.shape) != tuple(weight.shape):
        raise InternalError(f"the weight computed for {quoted(name)} has shape {list(given.shape)}, "
                            f"not {list(weight.shape)}")


def estimate_memory(config: PretrainedConfig, samples: int, seq_len: int, dtype: torch.dtype = torch.float32,
                    on_linear_bytes: Callable[[nn.Linear], int] | None = None) -> int:
    """Bytes a calibration run of `samples` windows of `seq_len` tokens holds on its device at most, computing
    in `dtype`: the activations of every window twice, with the larger of the embeddings (loaded while the
    first block's inputs are caught) and one block's weights and float64 Hessians (one an expert of fused
    experts), and what one window takes
    through a block (its widest activations, the float64 copy of a Linear's input, the attention scores),
    `SLACK` for the libraries' workspaces and the allocator's rounding, and what on_linear allocates (the
    quantizer's work on a Hessian): `on_linear_bytes(linear)` for the Linear that takes most. On an H200,
    Llamas of hidden size 512 to 4096 run on 8 x 128 to 128 x 512 windows, their weights rounded by
    on_linear, peaked within 3 % of the estimate less its slack."""
    module = build_model(config)
    _, blocks = repeated_blocks(module)
    size = dtype.itemsize
    embeddings = token_embedding(module)
    hidden = embeddings.embedding_dim
    linears = [sub for sub in blocks[0].modules() if isinstance(sub, nn.Linear)]
    weights = sum(p.numel() for p in blocks[0].parameters()) * size
    experts = [p for p in blocks[0].parameters() if p.dim() == 3]  # fused: a Hessian an expert
    hessians = (sum(linear.in_features**2 for linear in linears) + sum(p.shape[0] * p.shape[2]**2 for p in experts)) * 8
    widest = max((max(linear.in_features, linear.out_features) for linear in linears), default=hidden)
    heads = getattr(config.get_text_config(), "num_attention_heads", 1)
    window = seq_len * widest * (4 * size + 8) + heads * seq_len**2 * size
    activations = 2 * samples * seq_len * hidden * size
    quantizer = max((on_linear_bytes(linear) for linear in linears), default=0) if on_linear_bytes else 0
    return activations + max(weights + hessians, embeddings.weight.numel() * size) + window + quantizer + SLACK
