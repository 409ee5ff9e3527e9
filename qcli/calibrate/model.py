"""The model a calibration runs, built by transformers from the checkpoint's config.json with no weights in it.

Its parameters sit on the meta device (no memory) and are loaded a block at a time as the runner reaches
them (`CalibrationModel.parameter`), so the whole model is never in memory at once; its buffers are real,
since they are computed from the config rather than stored (rotary frequencies, position ids). Parameter
names are the model's; `names` maps them to the checkpoint's, which may carry another base-model prefix
(`model.`, `bert.`: a task head's checkpoint under the base model, or the other way round), an old
spelling transformers renames on loading (BERT's `LayerNorm.gamma`), or one tensor for two tied parameters
(a `lm_head.weight` tied to the embeddings). A parameter transformers makes from several checkpoint tensors
(a MoE layer's experts fused into one [experts, out, in] tensor) is made by transformers' own conversion
operations from those tensors, read when its block is loaded.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from qcli.errors import InputError, InternalError, UsageError
from qcli.io.files import load_json
from qcli.plan.roles import EMBEDDING_MODULES
from qcli.text import clipped, printable, quoted

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

    from qcli.calibrate.checkpoint import Checkpoint
    from qcli.io.source import TensorInfo

CALIBRATE_HINT = "pip install 'qcli[calibrate]'"
FOLDER_HINT = "calibration needs the model's folder as Hugging Face saves it: config.json, the tokenizer's files"
# The files a tokenizer is loaded from: a fast tokenizer's, or a slow one's that transformers converts.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.txt", "vocab.json")
# The JSON files transformers reads for the tokenizer, read first by qcli's bounded reader (`load_json`).
TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                  "vocab.json")
CONFIG_HINT = "config.json does not describe the checkpoint beside it; use the config.json saved with these weights"
# config.json's counts and sizes that shape what transformers builds (`_size`, `_dim`, `_heads`, `_experts`,
# `_layers` and their `num_` forms): none is larger than the checkpoint's largest tensor axis or its count
# of tensors, or transformers would build modules (on the meta device, but each a Python object) to no end.
_COUNT = re.compile(r"(?:num_\w+|\w+_(?:size|dim|heads|experts|layers))")
MAX_POSITIONS = 1 << 24  # max_position_embeddings read at most: models may build buffers of that length
_BLOCK = re.compile(r"^(.*?)\.(\d{1,9})\.")  # a name's first numbered part: `model.layers.3.` -> model.layers, 3


@dataclass(frozen=True)
class Assembly:
    """How transformers makes one parameter from several checkpoint tensors: `sources`, their names, each
    under the pattern of `converter` (a transformers WeightConverter) it matched, in the order transformers
    collects them (expert 0 first); `build(tensor)` runs the converter's operations on them."""

    converter: object
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

    module: nn.Module
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
                                 f"{_first_line(err)}",
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


def transformers_module():
    """transformers, or a usage error saying how to install it."""
    try:
        import transformers
    except ImportError as err:
        raise UsageError("calibration builds the model with transformers, which is not installed",
                         hint=CALIBRATE_HINT) from err
    return transformers


def load_config(folder: Path | str, checkpoint: Sequence[TensorInfo] | None = None) -> PretrainedConfig:
    """The model's config, from `folder`'s config.json (nothing downloaded), read first by qcli's bounded
    reader; with the `checkpoint`'s tensors, checked against them (`check_config`) before anything is built
    from it."""
    folder = Path(folder)
    transformers = transformers_module()
    path = folder / "config.json"
    if not path.is_file():
        raise UsageError(printable(f"{folder} has no config.json, which calibration builds the model from"),
                         hint=FOLDER_HINT)
    load_json(path, FOLDER_HINT)
    try:
        config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    except ValueError as err:
        raise UsageError(printable(f"transformers {transformers.__version__} cannot build the model of "
                                   f"{path}: {_first_line(err)}"),
                         hint="upgrade transformers, or quantize without calibration") from err
    except (OSError, TypeError, AttributeError) as err:  # a value of the wrong type where transformers reads it
        raise InputError(printable(f"cannot read {path}: {_first_line(err)}"), hint=FOLDER_HINT) from err
    if checkpoint is not None:
        check_config(path, config, checkpoint)
    return config


def check_config(path: Path, config: PretrainedConfig, checkpoint: Sequence[TensorInfo]) -> None:
    """InputError where config.json (at `path`) does not describe the checkpoint's tensors, found before a
    model is built from it: a layer count that is not the checkpoint's count of blocks (more would build
    layers without weights, an absurd count until memory runs out; fewer would leave blocks uncalibrated),
    a vocabulary or hidden size that is not its token embedding's shape, a `max_position_embeddings` that is
    not its position embedding's rows (or past MAX_POSITIONS), or any count or size (`_COUNT`) larger
    than anything the checkpoint holds."""
    text = config.get_text_config()
    largest = max([len(checkpoint), *(max(i.shape, default=0) for i in checkpoint)])
    for key, value in sorted(vars(text).items()):
        if _COUNT.fullmatch(key) and isinstance(value, int) and not isinstance(value, bool) and value > largest:
            raise _not_described(path, f"gives {key} {value}, larger than any axis or count of the checkpoint's "
                                 f"{len(checkpoint)} tensors (at most {largest})")
    layers = getattr(text, "num_hidden_layers", None)
    blocks = _block_counts(checkpoint)
    if isinstance(layers, int) and layers not in blocks.values():
        prefix, count = max(blocks.items(), key=lambda item: item[1], default=("", 0))
        held = f"{count} blocks ({clipped(prefix)}.0 to .{count - 1})" if count else "no numbered blocks"
        raise _not_described(path, f"gives num_hidden_layers {layers}, but the checkpoint holds {held}")
    embedding = _embedding(checkpoint, EMBEDDING_MODULES)
    width = "embedding_size" if isinstance(getattr(text, "embedding_size", None), int) else "hidden_size"
    for key, axis in (("vocab_size", 0), (width, 1)):  # ALBERT's embeddings are narrower than its blocks
        value = getattr(text, key, None)
        if embedding is not None and isinstance(value, int) and value != embedding.shape[axis]:
            raise _not_described(path, f"gives {key} {value}, but the token embedding {quoted(embedding.name)} "
                                 f"has shape {list(embedding.shape)}")
    positions = getattr(text, "max_position_embeddings", None)
    learned = _embedding(checkpoint, ("position_embeddings", "wpe", "embed_positions"))
    if isinstance(positions, int) and (positions > MAX_POSITIONS or learned is not None
                                       and positions > learned.shape[0]):
        rows = f"the position embedding {quoted(learned.name)} has {learned.shape[0]} rows" if learned else \
            f"qcli reads at most {MAX_POSITIONS}"
        raise _not_described(path, f"gives max_position_embeddings {positions}, but {rows}")


def _not_described(path: Path, problem: str) -> InputError:
    return InputError(printable(f"{path} {problem}"), hint=CONFIG_HINT)


def _block_counts(checkpoint: Sequence[TensorInfo]) -> dict[str, int]:
    """The numbered blocks of the checkpoint, by the path before their number (`model.layers`): how many
    (the largest number + 1)."""
    counts: dict[str, int] = {}
    for info in checkpoint:
        found = _BLOCK.match(info.name)
        if found:
            counts[found[1]] = max(counts.get(found[1], 0), int(found[2]) + 1)
    return counts


def _embedding(checkpoint: Sequence[TensorInfo], modules: Sequence[str]) -> TensorInfo | None:
    """The checkpoint's 2-D `weight` of a module named one of `modules` (outside the numbered blocks)."""
    return next((i for i in checkpoint if len(i.shape) == 2 and i.name.endswith(".weight")
                 and i.name.rsplit(".", 2)[-2] in modules and not _BLOCK.match(i.name)), None)


def check_positions(config: PretrainedConfig, seq_len: int) -> None:
    """UsageError for windows longer than the model's positions (`max_position_embeddings`): a model of
    learned positions cannot run them, one of rotary positions was never trained on them."""
    positions = getattr(config.get_text_config(), "max_position_embeddings", None)
    if isinstance(positions, int) and seq_len > positions:
        raise UsageError(f"--seq-len {seq_len} is longer than the model's {positions} positions "
                         "(max_position_embeddings in config.json)", hint=f"pass --seq-len {positions} or less")


def load_tokenizer(folder: Path | str) -> PreTrainedTokenizerBase:
    """The checkpoint's own tokenizer, from `folder` (nothing downloaded), its JSON files read first by
    qcli's bounded reader."""
    folder = Path(folder)
    transformers = transformers_module()
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise UsageError(printable(f"{folder} has no tokenizer ({', '.join(TOKENIZER_FILES)})"),
                         hint=FOLDER_HINT)
    for name in TOKENIZER_JSON:
        if (folder / name).exists():
            load_json(folder / name, TOKENIZER_HINT)
    try:
        return transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except Exception as err:  # noqa: BLE001 - whatever transformers or tokenizers raise on files they cannot take
        raise InputError(printable(f"cannot load the tokenizer of {folder}: {_first_line(err)}"),
                         hint=TOKENIZER_HINT) from err


def describe_gguf(path: Path, folder: Path) -> Path:
    """`folder` given the config.json and tokenizer files that transformers' GGUF loader makes from the metadata
    of the GGUF file at `path` (already read by qcli's own reader, which refuses what that loader would hang on)."""
    transformers = transformers_module()
    try:
        config = transformers.AutoConfig.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
        tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    except Exception as err:  # noqa: BLE001 - whatever transformers or gguf raise on metadata they cannot take
        raise UsageError(printable(f"transformers cannot describe the model of {path} from its metadata: "
                                   f"{_first_line(err)}"),
                         hint="put the model's config.json and tokenizer files in the model folder") from err
    if not getattr(config, "architectures", None):
        # The loader names no class; a GGUF file holds a language model: transformers' causal one of its type.
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        causal = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
        config.architectures = [causal] if causal is not None else None
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


TOKENIZER_HINT = ("check the tokenizer's files; without a tokenizer.json, transformers may need sentencepiece or "
                  "tiktoken to convert them")


def build_model(config: PretrainedConfig) -> nn.Module:
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
                                   f"for model_type {config.model_type!r}: {type(err).__name__}: {_first_line(err)}"),
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

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def open_model(checkpoint: Checkpoint) -> CalibrationModel:
    """The model of the checkpoint's config.json (checked against its tensors), its parameters mapped to their
    names and read as the runner needs them."""
    module = build_model(checkpoint.config)
    names, assembled = parameter_names(module, [info.name for info in checkpoint.tensors])
    return CalibrationModel(module, names, checkpoint.tensor, assembled)


def parameter_names(module: nn.Module, checkpoint: Iterable[str]) -> tuple[dict[str, str], dict[str, Assembly]]:
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
        if converter is not None:
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
        names.update({name: found or shared for name, found in own.items() if (found or shared) is not None})
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


def _renaming(module: nn.Module) -> Callable[[str], tuple[str, object, str | None]]:
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
    renamings = [t for t in transforms if not isinstance(t, WeightConverter)]

    def rename(name: str) -> tuple[str, object, str | None]:
        target, pattern = rename_source_key(name, renamings, converters)
        if pattern is None:
            return target, None, None
        return target, next(c for c in converters if pattern in c.source_patterns), pattern

    return rename


def _first_line(err: BaseException) -> str:
    """Another library's message, its first line cut short (`clipped`): it may quote a config's values."""
    return clipped((str(err).strip().splitlines() or [type(err).__name__])[0])
