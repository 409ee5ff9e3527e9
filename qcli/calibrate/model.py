"""The model a calibration runs: built by transformers from a `Checkpoint`'s config, with no weights in it.

Its parameters sit on the meta device and are loaded a block at a time as the runner reaches them, so the
whole model is never in memory at once. Its buffers are real, as the config computes them (rotary
frequencies, position ids). `names` maps each parameter to the checkpoint's tensor, whose name may differ by a
base-model prefix (`model.`, `bert.`), an old spelling transformers renames (BERT's `LayerNorm.gamma`), or a
tie (`lm_head.weight` and the embeddings). A parameter made from several tensors (a MoE layer's experts fused
into one) is made by transformers' own conversions when its block is loaded.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from qcli.calibrate.checkpoint import Checkpoint, first_line, transformers_module
from qcli.errors import InputError, InternalError, UsageError
from qcli.text import printable, quoted

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel
    from transformers.core_model_loading import WeightConverter, WeightRenaming


@dataclass(frozen=True)
class Assembly:
    """How transformers makes one parameter from several checkpoint tensors: `sources`, their names, each
    under the pattern of `converter` (a transformers WeightConverter) it matched, in the order transformers
    collects them (expert 0 first); `build(tensor)` runs the converter's operations on them."""

    converter: WeightConverter
    sources: list[tuple[str, str]]  # (source pattern, checkpoint name)

    @property
    def names(self) -> list[str]:
        return [name for _, name in self.sources]

    def build(self, target: str, tensor: Callable[[str], torch.Tensor], module: nn.Module) -> torch.Tensor:
        collected: dict[str, list[torch.Tensor]] = {}
        for pattern, name in self.sources:
            collected.setdefault(pattern, []).append(tensor(name))
        converter = self.converter
        values: dict = collected
        for op in converter.operations:
            values = op.convert(values, source_patterns=converter.source_patterns,
                                target_patterns=converter.target_patterns, full_layer_name=target,
                                model=module, config=getattr(module, "config", None), missing_keys=None)
        if len(values) == 1:
            return next(iter(values.values()))
        # one tensor split into several parameters (a fused QKV): the one whose pattern `target` ends with
        found = [key for key in values if target.endswith(key) or f".{key}." in f".{target}."]
        if not found:
            raise InternalError(f"transformers' conversion gives {', '.join(values)}, none of them {quoted(target)}")
        return values[max(found, key=len)]


@dataclass(frozen=True)
class CalibrationModel:
    """A model built from config.json (`module`, its parameters on the meta device), the checkpoint tensor
    each of its parameters is (`names`: parameter name -> checkpoint name), how to read one (`tensor`:
    checkpoint name -> the tensor on the CPU), and the parameters transformers makes from several of the
    checkpoint's tensors (`assembled`: parameter name -> how), made as transformers makes them."""

    module: PreTrainedModel
    names: dict[str, str]
    tensor: Callable[[str], torch.Tensor]
    assembled: dict[str, Assembly] = field(default_factory=dict)

    def parameter(self, name: str, like: torch.Tensor) -> torch.Tensor:
        """The checkpoint's tensor for the model's parameter `name` (or the one transformers makes from
        several), checked against its meta tensor `like`."""
        if name in self.assembled:
            assembly = self.assembled[name]
            try:
                value = assembly.build(name, self.tensor, self.module)
            except (RuntimeError, ValueError) as err:  # torch.cat or stack of tensors of unlike shapes
                raise InputError(f"transformers cannot make the model's parameter {quoted(name)} from the "
                                 f"checkpoint's {len(assembly.sources)} tensors {quoted(assembly.names[0])}, ...: "
                                 f"{first_line(err)}",
                                 hint="calibrate the checkpoint that config.json describes, unquantized") from err
            source = f"made from {quoted(assembly.names[0])} and {len(assembly.sources) - 1} more"
        elif name not in self.names:
            raise InputError(f"the checkpoint has no tensor for the model's parameter {quoted(name)}",
                             hint="calibrate the checkpoint that config.json describes, unquantized")
        else:
            value = self.tensor(self.names[name])
            source = f"tensor {quoted(self.names[name])}"
        if tuple(value.shape) != tuple(like.shape):
            raise InputError(f"{source} has shape {list(value.shape)}; the model "
                             f"config.json describes has {list(like.shape)} for {quoted(name)}",
                             hint="calibrate the checkpoint that config.json describes, unquantized")
        return value


def token_embedding(module: PreTrainedModel) -> nn.Embedding:
    """The model's token embedding (transformers types it a Module), one row a token of the vocabulary."""
    return cast("nn.Embedding", module.get_input_embeddings())


def build_model(config: PretrainedConfig) -> PreTrainedModel:
    """The model `config` describes, its parameters on the meta device: a causal language model where the
    config's architectures name one (its head included), else the base model (an encoder such as BERT).
    In eval mode: no dropout."""
    transformers = transformers_module()
    causal = any(name.endswith("ForCausalLM") for name in config.architectures or ())
    auto = transformers.AutoModelForCausalLM if causal else transformers.AutoModel
    try:
        with _parameters_on_meta():
            model = auto.from_config(config)
    except Exception as err:  # whatever a model's constructor raises on a config it cannot take
        raise UsageError(printable(f"transformers {transformers.__version__} cannot build a {auto.__name__} "
                                   f"for model_type {config.model_type!r}: {type(err).__name__}: {first_line(err)}"),
                         hint="check config.json, upgrade transformers, or quantize without calibration") from err
    return model.eval()


@contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Every parameter a module registers goes to the meta device, as it is registered; its initialization
    after that touches no memory. Buffers stay where they are made (torch.device("meta") would take them
    too, and with them the values the config gives them)."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign, assignment]  # patched for the block
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def open_model(checkpoint: Checkpoint) -> CalibrationModel:
    """The model of the checkpoint's config.json (checked against its tensors), its parameters mapped to their
    names and read as the runner needs them."""
    module = build_model(checkpoint.config)
    names, assembled = parameter_names(module, [info.name for info in checkpoint.tensors])
    return CalibrationModel(module, names, checkpoint.tensor, assembled)


def parameter_names(module: PreTrainedModel, checkpoint: Iterable[str]) -> tuple[dict[str, str], dict[str, Assembly]]:
    """The checkpoint name of each parameter of `module` that the checkpoint holds: by transformers' own
    renaming of the checkpoint's names, with the base-model prefix added or dropped where only that
    differs; a parameter tied to another (the same tensor under two names) takes the other's tensor where
    the checkpoint holds only one of them. Then the parameters that transformers' conversions make from
    checkpoint tensors (merged, split or permuted: experts fused into one), with how they are made."""
    renamed: dict[str, str] = {}
    converted: dict[str, Assembly] = {}
    rename = _renaming(module)
    for name in checkpoint:
        target, converter, pattern = rename(name)
        if converter is not None and pattern is not None:  # a converter's match has its pattern
            assembly = converted.setdefault(target, Assembly(converter, []))
            assembly.sources.append((pattern, name))
            first, *others = converter.target_patterns
            for other in others:  # one tensor split into several: each parameter made from the same tensors
                converted.setdefault(target.replace(first, other, 1), assembly)
        else:
            renamed.setdefault(target, name)
    for assembly in {id(a): a for a in converted.values()}.values():  # expert 10 after expert 9, stacked in order
        assembly.sources.sort(key=lambda source: _natural(source[1]))
    prefix = getattr(module, "base_model_prefix", "") + "."

    def lookup(table: dict, name: str):
        return next((table[c] for c in _spellings(name, prefix) if c in table), None)

    tied: dict[int, list[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        tied.setdefault(id(param), []).append(name)
    names = {}
    for group in tied.values():
        own = {name: lookup(renamed, name) for name in group}
        shared = next((found for found in own.values() if found is not None), None)
        names.update({name: chosen for name, found in own.items() if (chosen := found or shared) is not None})
    parameters = [name for group in tied.values() for name in group if name not in names]
    return names, {name: lookup(converted, name) for name in parameters if lookup(converted, name) is not None}


def _spellings(name: str, prefix: str) -> list[str]:
    """`name`, then with the base-model prefix dropped or added."""
    if prefix == ".":
        return [name]
    return [name, name.removeprefix(prefix) if name.startswith(prefix) else prefix + name]


def _natural(name: str) -> list:
    """A sort key that orders a name's numbers by value: `experts.2.` before `experts.10.`."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name)]


def _renaming(module: PreTrainedModel) -> Callable[[str], tuple[str, WeightConverter | None, str | None]]:
    """transformers' renaming of a checkpoint name to the model's on loading, and where its conversions
    make the tensor into another (merged, split, permuted), the converter that does and the pattern the
    name matched in it (else None, None)."""
    try:  # transformers 5: the model's conversion mapping
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, rename_source_key
    except ImportError:  # transformers 4: the legacy names only, by its loader's own method where it has it
        legacy = getattr(module, "_fix_state_dict_key_on_load", None)
        if legacy is None:  # neither: the checkpoint's names are taken as the model's
            return lambda name: (name, None, None)
        return lambda name: (legacy(name)[0], None, None)
    transforms = get_model_conversion_mapping(module)
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    # every other transform renames only (a WeightRenaming), as transformers' own loader takes them
    renamings = cast("list[WeightRenaming]", [t for t in transforms if not isinstance(t, WeightConverter)])

    def rename(name: str) -> tuple[str, WeightConverter | None, str | None]:
        target, pattern = rename_source_key(name, renamings, converters)
        if pattern is None:
            return target, None, None
        return target, next(c for c in converters if pattern in c.source_patterns), pattern

    return rename
