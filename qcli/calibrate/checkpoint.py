"""The model a calibrated run builds, resolved once and carried through the run (`Checkpoint`).

Its folder is found once from the input; its config.json and tokenizer are parsed on first use and kept, so
a run that plans, estimates and calibrates reads them once. Importing this module imports neither torch nor
transformers, so the quantize command can make the record before it knows whether it calibrates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from qcli.io.source import checkpoint_folder

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

    from qcli.io.source import Source, TensorInfo


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
        """config.json, parsed and checked against the tensors once (`model.load_config`)."""
        from qcli.calibrate.model import load_config

        return load_config(self.folder, self.tensors)

    @cached_property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The checkpoint's own tokenizer, loaded once (`model.load_tokenizer`)."""
        from qcli.calibrate.model import load_tokenizer

        return load_tokenizer(self.folder)
