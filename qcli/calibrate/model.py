"""The model a calibration runs, built by transformers from the checkpoint's config.json with no weights in it.

Its parameters sit on the meta device (no memory) and are loaded a block at a time as the runner reaches
them (`CalibrationModel.parameter`), so the whole model is never in memory at once; its buffers are real,
since they are computed from the config rather than stored (rotary frequencies, position ids). Parameter
names are the model's; `names` maps them to the checkpoint's, which may carry another base-model prefix
(`model.`, `bert.`: a task head's checkpoint under the base model, or the other way round), an old
spelling transformers renames on loading (BERT's `LayerNorm.gamma`), or one tensor for two tied parameters
(a `lm_head.weight` tied to the embeddings).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from qcli.errors import InputError, UsageError
from qcli.text import printable, quoted

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

CALIBRATE_HINT = "pip install 'qcli[calibrate]'"
FOLDER_HINT = "calibration needs the model's folder as Hugging Face saves it: config.json, the tokenizer's files"
# The files a tokenizer is loaded from: a fast tokenizer's, or a slow one's that transformers converts.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.txt", "vocab.json")


@dataclass(frozen=True)
class CalibrationModel:
    """A model built from config.json (`module`, its parameters on the meta device), the checkpoint tensor
    each of its parameters is (`names`: parameter name -> checkpoint name), how to read one (`tensor`:
    checkpoint name -> the tensor on the CPU), and the parameters transformers makes from several of the
    checkpoint's tensors (`assembled`: parameter name -> their names), which calibration does not do."""

    module: nn.Module
    names: dict[str, str]
    tensor: Callable[[str], torch.Tensor]
    assembled: dict[str, list[str]] = field(default_factory=dict)

    def parameter(self, name: str, like: torch.Tensor) -> torch.Tensor:
        """The checkpoint's tensor for the model's parameter `name`, checked against its meta tensor `like`."""
        if name in self.assembled:
            sources = self.assembled[name]
            raise UsageError(f"transformers makes the model's parameter {quoted(name)} from {len(sources)} of the "
                             f"checkpoint's tensors ({quoted(sources[0])}, ...), which calibration does not do",
                             hint="quantize without calibration (fused experts are no nn.Linear to calibrate)")
        if name not in self.names:
            raise InputError(f"the checkpoint has no tensor for the model's parameter {quoted(name)}",
                             hint="calibrate the checkpoint that config.json describes, unquantized")
        value = self.tensor(self.names[name])
        if tuple(value.shape) != tuple(like.shape):
            raise InputError(f"tensor {quoted(self.names[name])} has shape {list(value.shape)}; the model "
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


def load_config(folder: Path | str) -> PretrainedConfig:
    """The model's config, from `folder`'s config.json (nothing downloaded)."""
    folder = Path(folder)
    transformers = transformers_module()
    if not (folder / "config.json").is_file():
        raise UsageError(printable(f"{folder} has no config.json, which calibration builds the model from"),
                         hint=FOLDER_HINT)
    try:
        return transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    except ValueError as err:
        raise UsageError(printable(f"transformers {transformers.__version__} cannot build the model of "
                                   f"{folder / 'config.json'}: {_first_line(err)}"),
                         hint="upgrade transformers, or quantize without calibration") from err
    except OSError as err:
        raise InputError(printable(f"cannot read {folder / 'config.json'}: {_first_line(err)}"),
                         hint=FOLDER_HINT) from err


def load_tokenizer(folder: Path | str) -> PreTrainedTokenizerBase:
    """The checkpoint's own tokenizer, from `folder` (nothing downloaded)."""
    folder = Path(folder)
    transformers = transformers_module()
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise UsageError(printable(f"{folder} has no tokenizer ({', '.join(TOKENIZER_FILES)})"),
                         hint=FOLDER_HINT)
    try:
        return transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError) as err:
        raise InputError(printable(f"cannot load the tokenizer of {folder}: {_first_line(err)}"),
                         hint="check the tokenizer's files; without a tokenizer.json, transformers may need "
                              "sentencepiece or tiktoken to convert them") from err


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


def open_model(folder: Path | str, checkpoint: Iterable[str], tensor: Callable[[str], torch.Tensor]
               ) -> CalibrationModel:
    """The model of `folder`'s config.json, its parameters mapped to the names of the checkpoint's tensors
    (`checkpoint`), read through `tensor` as the runner needs them."""
    module = build_model(load_config(folder))
    names, assembled = parameter_names(module, checkpoint)
    return CalibrationModel(module, names, tensor, assembled)


def parameter_names(module: nn.Module, checkpoint: Iterable[str]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """The checkpoint name of each parameter of `module` that the checkpoint holds: by transformers' own
    renaming of the checkpoint's names, with the base-model prefix added or dropped where only that
    differs; a parameter tied to another (the same tensor under two names) takes the other's tensor where
    the checkpoint holds only one of them. Then the parameters that transformers' conversions make from
    checkpoint tensors (merged, split or permuted: experts fused into one), with those tensors' names."""
    renamed: dict[str, str] = {}
    converted: dict[str, list[str]] = {}
    rename = _renaming(module)
    for name in checkpoint:
        target, assembled = rename(name)
        if assembled:
            converted.setdefault(target, []).append(name)
        else:
            renamed.setdefault(target, name)
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


def _renaming(module: nn.Module) -> Callable[[str], tuple[str, bool]]:
    """transformers' renaming of a checkpoint name to the model's on loading, and whether its conversions
    make the tensor into another (merged, split, permuted), which a tensor read as it is cannot be."""
    try:  # transformers 5: the model's conversion mapping
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, rename_source_key
    except ImportError:  # transformers 4: the legacy names only, by its loader's own method where it has it
        legacy = getattr(module, "_fix_state_dict_key_on_load", None)
        if legacy is None:  # neither: the checkpoint's names are taken as the model's
            return lambda name: (name, False)
        return lambda name: (legacy(name)[0], False)
    transforms = get_model_conversion_mapping(module)
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    renamings = [t for t in transforms if not isinstance(t, WeightConverter)]

    def rename(name: str) -> tuple[str, bool]:
        target, converted = rename_source_key(name, renamings, converters)
        return target, converted is not None

    return rename


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
