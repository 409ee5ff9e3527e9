"""The files that describe the model a calibrated run builds, and `Checkpoint`, the record that resolves them once.

The folder holding config.json and the tokenizer is found once from the input, and both are parsed on first
use and kept: a run that plans, estimates and calibrates reads each once. config.json is checked against the
checkpoint's tensors before transformers builds anything from it. This module imports neither torch nor
transformers at load, so the quantize command makes the record before it knows whether it calibrates.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from qcli.errors import InputError, UsageError
from qcli.io.files import load_json
from qcli.io.source import checkpoint_folder
from qcli.plan.roles import EMBEDDING_MODULES
from qcli.text import clipped, printable, quoted

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

    from qcli.io.source import Source, TensorInfo

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


@dataclass(frozen=True, eq=False)
class Checkpoint:
    """The folder holding the model's config.json and tokenizer files, the checkpoint's tensors the model is
    built over (by the names its parameters take), and how to read one of them on the CPU."""

    folder: Path
    tensors: Sequence[TensorInfo]
    tensor: Callable[[str], torch.Tensor]
    # Where the config came from, as `qcli eval` reports it: the config.json, or a GGUF file's metadata.
    described: str = ""

    @classmethod
    def beside(cls, input: Path, source: Source) -> Checkpoint:
        """The checkpoint at `input` (a file, an index or a folder), opened as `source`, with the config.json
        and tokenizer in its folder."""
        folder = checkpoint_folder(input)
        return cls(folder, source.infos(), source.load, str(folder / "config.json"))

    @cached_property
    def config(self) -> PretrainedConfig:
        """config.json, parsed and checked against the tensors once (`load_config`)."""
        return load_config(self.folder, self.tensors)

    @cached_property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The checkpoint's own tokenizer, loaded once (`load_tokenizer`)."""
        return load_tokenizer(self.folder)


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
                                   f"{path}: {first_line(err)}"),
                         hint="upgrade transformers, or quantize without calibration") from err
    except (OSError, TypeError, AttributeError) as err:  # a value of the wrong type where transformers reads it
        raise InputError(printable(f"cannot read {path}: {first_line(err)}"), hint=FOLDER_HINT) from err
    if checkpoint is not None:
        check_config(path, config, checkpoint)
    return config


def check_config(path: Path, config: PretrainedConfig, checkpoint: Sequence[TensorInfo]) -> None:
    """InputError where config.json (at `path`) does not describe the checkpoint's tensors, found before a model
    is built from it.

    The layer count must be the checkpoint's count of blocks: more would build layers without weights, fewer
    would leave blocks uncalibrated. The vocabulary and hidden size must be the token embedding's shape, and
    `max_position_embeddings` at most the position embedding's rows (and MAX_POSITIONS). No count or size
    (`_COUNT`) may exceed everything the checkpoint holds, or transformers would build modules to no end."""
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
        raise InputError(printable(f"cannot load the tokenizer of {folder}: {first_line(err)}"),
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
                                   f"{first_line(err)}"),
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


def first_line(err: BaseException) -> str:
    """Another library's message, its first line cut short (`clipped`): it may quote a config's values."""
    return clipped((str(err).strip().splitlines() or [type(err).__name__])[0])
