"""How far a quantized model's next-token predictions are from its source's, on windows of text: the one
evaluator `qcli eval` and the benchmarks score with.

For each window the model runs twice, with the source's weights and with the quantized ones swapped into
the same modules (`SwappedWeights`: both sets held, put in place by reference, nothing copied), so only one
window's log-probabilities of each are held at a time, never every window's over the whole vocabulary.
Each prediction (position `t` predicting token `t + 1`) gives KL(source || quantized) of the two next-token
distributions, whether their most likely tokens agree, and both models' negative log-likelihood of the
token that follows (`Scores`); the mean KL, the top-1 agreement and both perplexities are over every
prediction of every window (`Evaluation`).

Each tensor's contribution, where asked (`Evaluator.evaluate_each`), is measured exactly, not by a
proxy: the same scores of the model with that one tensor's quantized values swapped in and every other at
the source's, against the same source log-probabilities of the window, so a window costs one more forward
pass a tensor. With one tensor quantized, its contribution is the whole model's scores; with several, the
contributions need not add up to the whole (errors of two tensors can compound or cancel).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from torch import nn

from qcli.errors import InputError, UsageError
from qcli.report.evaluate import Evaluation
from qcli.text import printable, quoted

if TYPE_CHECKING:
    from qcli.calibrate.checkpoint import Checkpoint
    from qcli.calibrate.data import CalibrationSet
    from qcli.calibrate.inputs import CalibrationInput
    from qcli.calibrate.model import CalibrationModel


class Scores:
    """The sums `Evaluation` is made of, window by window (`add`), in float64."""

    def __init__(self) -> None:
        self.windows = self.tokens = self.same = 0
        self.kl = self.kl_max = self.nll = self.source_nll = 0.0

    def add(self, source: torch.Tensor, quantized: torch.Tensor, targets: torch.Tensor) -> None:
        """One window: `source` and `quantized` log-probabilities ([predictions, vocabulary]) and the token
        each prediction is of (`targets`, [predictions])."""
        quantized = quantized.to(source.device)
        targets = targets.to(source.device)[:, None]
        kl = torch.sum(source.exp() * (source - quantized), dim=-1, dtype=torch.float64)
        self.windows += 1
        self.tokens += targets.shape[0]
        self.kl += float(kl.sum())
        self.kl_max = max(self.kl_max, float(kl.max()))
        self.same += int((source.argmax(-1) == quantized.argmax(-1)).sum())
        self.nll -= float(quantized.gather(-1, targets).sum(dtype=torch.float64))
        self.source_nll -= float(source.gather(-1, targets).sum(dtype=torch.float64))

    def result(self) -> Evaluation:
        n = max(self.tokens, 1)
        # KL is never below 0: a sum that is, by a few ulps, is f32 rounding where the two models all but agree
        return Evaluation(self.windows, self.tokens, max(self.kl / n, 0.0), self.kl_max, self.same / n,
                          _exp(self.nll / n), _exp(self.source_nll / n))


def _exp(x: float) -> float:
    """e^x, infinite past a float's range (a perplexity of a model that predicts nothing)."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


class SwappedWeights:
    """Other values for some of a module's parameters (`values`: parameter name -> tensor of its shape),
    put in place of the module's own while `swapped()` lasts. A parameter tied to another (the same
    `nn.Parameter` under two names) is swapped under both."""

    def __init__(self, module: nn.Module, values: Mapping[str, torch.Tensor]) -> None:
        places: dict[int, list[tuple[nn.Module, str]]] = {}
        by_name: dict[str, nn.Parameter] = {}
        for name, param in module.named_parameters(remove_duplicate=False):
            owner, _, leaf = name.rpartition(".")
            places.setdefault(id(param), []).append((module.get_submodule(owner), leaf))
            by_name[name] = param
        self._swaps: dict[str, tuple[list[tuple[nn.Module, str]], nn.Parameter, nn.Parameter]] = {}
        done: set[int] = set()
        for name, value in values.items():
            own = by_name[name]
            if id(own) in done:
                continue
            done.add(id(own))
            if tuple(value.shape) != tuple(own.shape):
                raise ValueError(f"{name}: shape {list(value.shape)} for a parameter of {list(own.shape)}")
            other = nn.Parameter(value.to(own.device, own.dtype), requires_grad=False)
            self._swaps[name] = (places[id(own)], own, other)

    def __len__(self) -> int:
        return len(self._swaps)

    @property
    def names(self) -> list[str]:
        """The parameters swapped, by the name `values` gave each (one of a tied group)."""
        return list(self._swaps)

    @contextmanager
    def swapped(self, only: str | None = None) -> Iterator[None]:
        """Every parameter swapped in, or `only` that one (a name of `names`)."""
        swaps = list(self._swaps.values()) if only is None else [self._swaps[only]]
        for places, _, other in swaps:
            for owner, leaf in places:
                owner._parameters[leaf] = other
        try:
            yield
        finally:
            for places, own, _ in swaps:
                for owner, leaf in places:
                    owner._parameters[leaf] = own


WindowDone = Callable[[int, int, float], None]  # (windows done, of all, seconds since the first began)


class Evaluator:
    """A causal language model (`module`, its parameters real, on its device) and the token windows it is
    scored on (`windows`, int64 [count, length])."""

    def __init__(self, module: nn.Module, windows: torch.Tensor) -> None:
        self.module = module.eval()
        self.windows = windows
        self.device = next(module.parameters()).device

    def logprobs(self, window: torch.Tensor) -> torch.Tensor:
        """The model's next-token log-probabilities (f32, [length - 1, vocabulary]) at every position of
        `window` but the last."""
        with torch.inference_mode():
            logits = self.module(window.to(self.device)[None]).logits[0, :-1]
            return logits.float().log_softmax(-1)

    def evaluate(self, weights: SwappedWeights, source: Callable[[int], torch.Tensor] | None = None,
                 progress: WindowDone | None = None) -> Evaluation:
        """The scores of the model with `weights` swapped in against the model as it is, window by window;
        `source`, where given, gives the source's log-probabilities of window `i` instead (computed once
        for many evaluations)."""
        return self._scored(weights, source, progress, [])[0]

    def evaluate_each(self, weights: SwappedWeights, progress: WindowDone | None = None
                      ) -> tuple[Evaluation, dict[str, Evaluation]]:
        """`evaluate`'s scores, and those of each parameter of `weights` swapped in alone (by its name in
        `weights.names`), against the same source log-probabilities: one more forward pass a window each."""
        return self._scored(weights, None, progress, weights.names)

    def _scored(self, weights: SwappedWeights, source: Callable[[int], torch.Tensor] | None,
                progress: WindowDone | None, alone: Sequence[str]) -> tuple[Evaluation, dict[str, Evaluation]]:
        scores = Scores()
        each = {name: Scores() for name in alone}
        count = self.windows.shape[0]
        started = time.perf_counter()
        if progress is not None:
            progress(0, count, 0.0)
        for i, window in enumerate(self.windows):
            reference = self.logprobs(window) if source is None else source(i)
            with weights.swapped():
                scores.add(reference, self.logprobs(window), window[1:])
            for name, own in each.items():
                with weights.swapped(only=name):
                    own.add(reference, self.logprobs(window), window[1:])
            del reference
            if progress is not None:
                progress(i + 1, count, time.perf_counter() - started)
        return scores.result(), {name: own.result() for name, own in each.items()}


def evaluate_quantized(checkpoint: Checkpoint, quantized: Callable[[str], torch.Tensor], given: CalibrationInput,
                       device: str, progress: WindowDone | None = None, each: bool = False
                       ) -> tuple[Evaluation, dict[str, Evaluation] | None, str, CalibrationSet]:
    """The checkpoint's model (its tensors named as the file writes them) in f32 on `device` (auto, cpu or
    cuda), scored with `quantized(name)` swapped in on windows of `given`'s text cut by its tokenizer (a
    parameter transformers makes of several tensors, as fused experts are, made of theirs by its conversion);
    with `each`, also every tensor whose quantized values differ from the source's scored alone (by the name
    it is written with, a made parameter by the model's; `Evaluator.evaluate_each`); with the device it ran
    on and the windows."""
    from qcli.calibrate.checkpoint import check_positions
    from qcli.calibrate.data import consecutive_tokens, framed, read_calibration_text, special_frame
    from qcli.calibrate.model import open_model, token_embedding

    assert given.data is not None
    text = read_calibration_text(given.data, "text")
    folder = checkpoint.folder
    model = open_model(checkpoint)
    module = model.module
    if not type(module).__name__.endswith("ForCausalLM"):
        raise UsageError(printable(f"{folder / 'config.json'} describes a {type(module).__name__}, which predicts no "
                                   "next token"), hint="qcli eval scores causal language models (architectures "
                                   "ending in ForCausalLM in config.json)")
    unmapped = sorted(n for n, _ in module.named_parameters() if n not in model.names and n not in model.assembled)
    if unmapped:
        raise UsageError(printable(f"the checkpoint has no tensor for {len(unmapped)} of the parameters of the model "
                                   f"{folder / 'config.json'} describes: {quoted(unmapped[0])}"),
                         hint="evaluate the checkpoint that config.json describes; for a GGUF source, quantize it "
                              "with --names hf and pass --names hf")
    check_positions(module.config, given.seq_len)
    tokenizer = checkpoint.tokenizer
    before, after = special_frame(tokenizer)
    body = given.seq_len - len(before) - len(after)
    if body < 1:
        raise UsageError(f"--seq-len {given.seq_len} leaves no room for text beside the tokenizer's "
                         f"{len(before) + len(after)} special tokens", hint="pass a longer --seq-len")
    windows = framed(consecutive_tokens(text, tokenizer, given.samples, body), tokenizer)
    rows = token_embedding(module).num_embeddings
    if int(windows.tokens.max()) >= rows:
        raise InputError(printable(f"the tokenizer of {folder} gives token id {int(windows.tokens.max())} on the "
                                   f"text, past the {rows} rows of the model's token embedding"),
                         hint="the tokenizer's files and the weights are of different models")
    chosen = "cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu"
    swapped = _loaded(model, quantized, torch.device(chosen))
    evaluator = Evaluator(module, windows.tokens)
    if not each:
        return evaluator.evaluate(swapped, progress=progress), None, chosen, windows
    scores, alone = evaluator.evaluate_each(swapped, progress)
    return scores, {model.names.get(name, name): own for name, own in alone.items()}, chosen, windows


def _loaded(model: CalibrationModel, quantized: Callable[[str], torch.Tensor], device: torch.device
            ) -> SwappedWeights:
    """The model's parameters loaded in f32 on `device` (a tied one once), and the quantized values of those
    that differ, to swap in."""
    module = model.module
    groups: dict[int, list[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    values = {}
    for group in groups.values():
        name = group[0]
        meta = module.get_parameter(name)
        reference = model.parameter(name, meta).to(device, torch.float32)
        param = nn.Parameter(reference, requires_grad=False)
        for alias in group:
            owner, _, leaf = alias.rpartition(".")
            module.get_submodule(owner)._parameters[leaf] = param
        assembly = model.assembled.get(name)
        if assembly is None:
            checkpoint = quoted(model.names[name])
            value = quantized(model.names[name])
        else:  # fused experts: made of the file's tensors as of the source's, by transformers' conversion
            checkpoint = f"{quoted(assembly.names[0])} and {len(assembly.names) - 1} more"
            value = assembly.build(name, quantized, module)
        if tuple(value.shape) != tuple(meta.shape):
            raise UsageError(printable(f"tensor {checkpoint} of the quantized file decodes to "
                                       f"{list(value.shape)}; the model has {list(meta.shape)} for {quoted(name)}"),
                             hint="evaluate against the checkpoint the .bpk was written from")
        value = value.to(device, torch.float32)
        if not torch.equal(value, reference):
            values[name] = value
    module.to(device)  # type: ignore[arg-type]  # transformers' wrapper of `to` types its self as the argument
    return SwappedWeights(module, values)
