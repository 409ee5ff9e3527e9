"""The readers of checkpoints, as rows in the order `open_source` tries them (`READERS`).

A row holds the format's name (`Source.format`, which inspect reports), how the help names it, the suffixes
of its files, whether a path is its own, and how to open one. A GGUF row also maps its names to Hugging Face's
(`--names hf`).

A new input format is its reader module beside these and its row here (docs/design.md, "Adding an input
format"); nothing else picks a reader."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from qcli.errors import UsageError
from qcli.io.burnpack_index import is_container
from qcli.io.gguf import SUFFIX, GgufSource, is_gguf
from qcli.io.gguf_names import hf_names
from qcli.io.hf_cache import is_model_name, snapshot
from qcli.io.safetensors import SafetensorsSource
from qcli.io.source import Names, Source
from qcli.text import printable


@dataclass(frozen=True)
class Reader:
    """One input format's reader."""

    name: str  # the format, as its sources' `format` gives it
    title: str  # the format as help texts name it
    given: str  # how a checkpoint of it is given, as an input's help says
    suffixes: tuple[str, ...]  # what its files' names end with: such an input is a path, never a model ORG/NAME
    sniff: Callable[[Path], bool]  # whether a path is this format's, asked after the readers before it declined
    open: Callable[[Path], Source]  # the source, every header checked (InputError naming the file and tensor)
    side_files: bool  # whether the files beside one (config.json, the tokenizer's) describe it: -o DIR/ copies them
    hf_names: Callable[[Source], Source] | None = None  # `--names hf`; None: the format's names are kept


def _the_rest(path: Path) -> bool:
    """The last reader's: safetensors takes every path the readers before it declined (a file, a folder, an
    index), and says what is wrong with one that holds no checkpoint."""
    return True


# A GGUF file holds its model's description: files beside it may be another model's.
GGUF = Reader(GgufSource.format, "GGUF", f"a {SUFFIX} file", (SUFFIX,), is_gguf, GgufSource.open, side_files=False,
              hf_names=hf_names)
READERS = (
    GGUF,
    Reader(SafetensorsSource.format, "safetensors",
           "a .safetensors file, a directory (model.safetensors or an index with shards), an index",
           (".safetensors", ".json"), _the_rest, SafetensorsSource.open, side_files=True),
)
SUFFIXES = tuple(suffix for reader in READERS for suffix in reader.suffixes)


def titles() -> str:
    """The formats read, as help texts list them: `GGUF or safetensors`."""
    *rest, final = [reader.title for reader in READERS]
    return f"{', '.join(rest)} or {final}" if rest else final


def given() -> str:
    """How a checkpoint is given, each reader's way in turn, as an input's help lists them."""
    return ", ".join(reader.given for reader in READERS)


def locate(input: str | Path, revision: str | None = None) -> tuple[Path, str | None]:
    """The checkpoint `input` names, as every command that reads one takes it: the path to read, and the model
    name when `input` named one in the local Hugging Face cache (`ORG/NAME`, read at `revision`: its
    snapshot folder). A path that exists always wins, and a name with a checkpoint's suffix is a path. A
    burnpack file is refused: it is qcli's output, not a checkpoint."""
    path = Path(input)
    named = str(input)
    if is_container(path):
        raise UsageError(printable(f"{named} is a burnpack (.bpk) file, which qcli writes; a checkpoint to read "
                                   "is a safetensors file, folder or index, or a GGUF file"),
                         hint=printable(f"`qcli inspect {named}` shows what it holds; give the checkpoint it was "
                                        "written from instead"))
    if path.exists() or not is_model_name(named) or named.lower().endswith(SUFFIXES):
        if revision is not None:
            raise UsageError(printable(f"--revision picks a revision of a model in the Hugging Face cache; "
                                       f"{named} is a path"),
                             hint="drop --revision, or give the model's ORG/NAME")
        return path, None
    return snapshot(named, revision), named


def reader_of(path: Path) -> Reader:
    """The first reader in `READERS` that takes `path`."""
    return next(reader for reader in READERS if reader.sniff(path))


def open_source(path: Path | str, names: Names | str = Names.file) -> Source:
    """The checkpoint at `path`, by its reader (`reader_of`); with `names` hf a GGUF file's tensors under
    Hugging Face's names."""
    path, names = Path(path), Names(names)
    reader = reader_of(path)
    rename = reader.hf_names if names is Names.hf else None
    if names is Names.hf and rename is None:
        raise UsageError(f"--names hf maps the llama.cpp names of a GGUF file; this input is {reader.name}",
                         hint=f"drop --names: a {reader.name} checkpoint's names are kept as they are")
    source = reader.open(path)
    return rename(source) if rename is not None else source
