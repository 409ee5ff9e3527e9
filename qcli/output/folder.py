"""A model folder (`-o DIR/`): the weights as MODEL_FILE, the source's config and tokenizer files, and a record
of the run (RECORD_FILE).

The folder is created only when a run commits. The files an earlier run wrote there are read from its record."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from qcli import __version__
from qcli.errors import InputError, OutputError, UsageError
from qcli.formats.declaration import SIDE_FILES as DECLARATIONS
from qcli.io.files import load_json
from qcli.io.temporary import left_by_killed_run
from qcli.text import printable

if TYPE_CHECKING:
    from qcli.report.quantize import QuantizeReport

MODEL_FILE = "model.bpk"  # a model folder's weights (or the name its shards and index take)
RECORD_FILE = "qcli.json"  # a model folder's record of the run (docs/output.md)
# What a Burn user needs beside the weights to build and run the model, copied from the source's folder
# unchanged where it has them: Hugging Face's config files, the tokenizer files transformers reads and writes
# (tokenization_utils_base's, and the vocabularies of the Llama, GPT-2, BERT and T5 families), and the chat
# template (transformers' `chat_template.jinja`, or the older `chat_template.json`).
SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "added_tokens.json", "tokenizer.model", "spiece.model", "vocab.txt",
              "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json")
# The names of the weights qcli writes into a model folder: MODEL_FILE, its shards and their index.
_OWN_WEIGHTS = re.compile(r"model(-\d{5,}-of-\d{5,})?\.bpk|model\.bpk\.index\.json")


def side_files(folder: Path) -> list[Path]:
    """The SIDE_FILES `folder` has, as regular files (after links: a Hugging Face cache links to blobs)."""
    return [path for path in (folder / name for name in SIDE_FILES) if path.is_file()]


def read_beside(folder: Path) -> list[Path]:
    """The files beside a checkpoint in `folder` that a run may open: its config and tokenizer files (a
    calibration builds the model from them, a model folder copies them) and the side files that declare how
    it was quantized (`qcli.formats.declaration`)."""
    return side_files(folder) + [path for path in (folder / name for name, _ in DECLARATIONS) if path.is_file()]


class ModelFolder(NamedTuple):
    """A Burn user's model folder: the weights as MODEL_FILE (or its shards and index), `copies` (files of
    the source's folder) beside them unchanged, and `record` as RECORD_FILE."""

    path: Path
    copies: list[Path]
    record: dict

    def staged(self, weights: list[Path]) -> list[tuple[Path, bytes | Path]]:
        """Each file beside the `weights` (the burnpack files and index), and what it holds: a copy's
        source, or the record's bytes, which list both."""
        record = {**self.record, "weights": [path.name for path in weights], "copied": [c.name for c in self.copies]}
        text = json.dumps(record, indent=2, ensure_ascii=False) + "\n"
        return [(self.path / c.name, c) for c in self.copies] + [(self.path / RECORD_FILE, text.encode())]


def folder_record(report: QuantizeReport, source: Path, options: Mapping[str, object]) -> dict:
    """RECORD_FILE's document (docs/json-schema.json, `model_folder`): which qcli and Burn, the source and
    its files, the options that shaped the plan, the files written and how many tensors took each decision."""
    totals = report.totals
    return {
        "producer": "qcli",
        "producer_version": __version__,
        "burn_version": report.burn_version,
        "burn_backend": report.burn_backend,
        "source": {"input": report.input, "path": str(source.resolve()),
                   "files": [f.to_json() for f in report.source_files]},
        "options": {"scheme": report.preset, "recipe_sha256": report.recipe_sha256, **options},
        "tensors": {"total": totals.tensors, "quantized": totals.quantized, "kept": totals.kept,
                    "transposed": totals.transposed},
    }


def recorded_files(folder: Path) -> list[Path]:
    """The files an earlier run's RECORD_FILE in `folder` lists that qcli writes there: weights by the names
    it gives them (MODEL_FILE, its shards and index), copies among SIDE_FILES. Any other name in the record
    is not qcli's to remove, whoever wrote it there."""
    try:
        record: Any = load_json(folder / RECORD_FILE, "")  # not an object: .get raises, as caught below
        weights, copied = record.get("weights", []), record.get("copied", [])
        own = [*(n for n in weights if isinstance(n, str) and _OWN_WEIGHTS.fullmatch(n)),
               *(n for n in copied if isinstance(n, str) and n in SIDE_FILES)]
    except (InputError, AttributeError, TypeError):
        return []
    return [folder / name for name in own]


def check_folder(folder: Path, force: bool) -> None:
    """A model folder is written into a new or empty folder (the temporary files of a killed run aside),
    or with `force` into one that has files (those qcli writes are replaced, the others left as they are);
    never onto a file. A dry run refuses what the run would."""
    if folder.exists() and not folder.is_dir():
        raise UsageError(printable(f"{folder} is not a folder; -o DIR/ writes a model folder"),
                         hint="give -o the path of a folder, or of a .bpk file without the trailing /")
    if folder.is_dir() and not force and not all(map(left_by_killed_run, folder.iterdir())):
        raise UsageError(printable(f"{folder} already exists and is not empty"),
                         hint="pass --force to replace the files qcli writes there, or -o to write somewhere else")


@contextmanager
def created(folder: Path) -> Iterator[None]:
    """`folder` created if it is missing, and removed again if the block raises while it is empty: a run
    that does not commit leaves no folder of its own behind (its files' temporaries are removed inside the
    block), and an interrupt after the commit leaves the complete folder."""
    if folder.is_dir():
        yield
        return
    try:
        folder.mkdir()
    except OSError as exc:
        raise OutputError(printable(f"cannot create {folder}: {exc.strerror or exc}"),
                          hint=f"check that {folder.parent} is writable; nothing was written") from None
    try:
        yield
    except BaseException:
        try:
            folder.rmdir()
        except OSError:
            pass  # not empty: committed, or another process wrote into it
        raise
