"""The calibration text and the token windows cut from it, which the model runs on to show each layer's inputs.

A text file is one document; JSON lines (every non-empty line an object with a string `text`) are one document
a line. The documents are tokenized with the checkpoint's own tokenizer and laid end to end, the tokenizer's
end-of-sequence (or separator) token between them, and `samples` windows of `seq_len` tokens are cut from
that stream at offsets drawn from a generator seeded with `seed`, as GPTQ and llm-compressor sample theirs:
the same text, tokenizer and seed give the same windows on every machine.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from qcli.calibrate.inputs import SAMPLES, SEED, SEQ_LEN, TEXT_HINT
from qcli.errors import InputError, UsageError
from qcli.io.files import NOT_REGULAR_HINT, checked_json, named_file, not_regular_problem, read_bounded
from qcli.text import printable

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from qcli.calibrate.inputs import CalibrationInput

MIN_WINDOWS = 2  # fewer whole windows than this in the text is an error, not a warning
# Bytes of calibration text read at most: the default windows take 65,536 tokens, a few hundred kB of text,
# and the whole text is tokenized (a token id is a Python int), so a larger file is cut by its user.
MAX_TEXT_BYTES = 64 << 20


@dataclass(frozen=True)
class CalibrationText:
    """The documents of a calibration file, with the file's name and the sha256 of its bytes (for reports)."""

    documents: list[str]
    name: str
    sha256: str


@dataclass(frozen=True)
class CalibrationSet:
    """The windows the model runs on: `tokens` (int64 [windows, seq_len]); `available`, the tokens the text
    gave; `shortfall`, the warning to show when the text holds fewer tokens than the windows asked for
    (None when it holds enough); and the file's `name` and `sha256`."""

    tokens: torch.Tensor
    available: int
    name: str
    sha256: str
    shortfall: str | None = None

    @property
    def used(self) -> int:
        """Tokens the windows hold (those that overlap counted in each)."""
        return self.tokens.numel()


def read_calibration_text(path: Path | str, role: str = "calibration text") -> CalibrationText:
    """The documents of the calibration file at `path`: JSON lines with a string `text` each, else the whole
    file as one text; `role` names the file in errors (`qcli eval`'s is the text it scores on)."""
    path = Path(path)
    kind = not_regular_problem(path)
    if kind is not None:
        raise UsageError(printable(f"cannot read {role} {path}: not a regular file ({kind})"),
                         hint=NOT_REGULAR_HINT)
    named_file(path, role, TEXT_HINT)
    data = read_bounded(path, MAX_TEXT_BYTES, role,
                        hint=f"calibration reads at most {MAX_TEXT_BYTES >> 20} MiB of text, far more than its windows "
                        "take: give a part of the file (head -c 10M FILE > part.txt)")
    text = _decoded(path, data, role)
    lines = [(number, line) for number, line in enumerate(text.split("\n"), 1) if line.strip()]
    objects = _json_objects(path, lines)
    documents = [text] if objects is None else _texts(path, objects)
    if not any(document.strip() for document in documents):
        raise InputError(printable(f"{role} {path} is empty"), hint=TEXT_HINT)
    return CalibrationText(documents, path.name, hashlib.sha256(data).hexdigest())


def _decoded(path: Path, data: bytes, role: str) -> str:
    if b"\0" in data:
        raise InputError(printable(f"{role} {path} is binary: a NUL byte at offset {data.index(0)}"),
                         hint=TEXT_HINT)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise InputError(printable(f"{role} {path} is not UTF-8: byte {err.start} cannot be decoded"),
                         hint=TEXT_HINT) from err


def _json_objects(path: Path, lines: list[tuple[int, str]]) -> list[tuple[int, dict]] | None:
    """`(line number, object)` for each line, where every line is a JSON object (each shallow and holding no
    lone surrogate, `checked_json`); else None (plain text)."""
    objects = []
    for number, line in lines:
        if not line.lstrip().startswith("{"):
            return None
        try:
            value = json.loads(line)
        except RecursionError:  # `{"text": [[[[...`: JSON lines, but nested past the interpreter's stack
            raise InputError(printable(f"{path}:{number}: a JSON line nested too deeply"), hint=TEXT_HINT) from None
        except ValueError:
            return None
        if not isinstance(value, dict):
            return None
        objects.append((number, checked_json(path, value, TEXT_HINT, f"JSON line {number}")))
    return objects


def _texts(path: Path, objects: list[tuple[int, dict]]) -> list[str]:
    for number, value in objects:
        if not isinstance(value.get("text"), str):
            raise InputError(printable(f"{path}:{number}: a JSON line without a string \"text\" field"),
                             hint='give every line a "text" field, or pass plain text')
    return [value["text"] for _, value in objects]


def calibration_tokens(text: CalibrationText, tokenizer: PreTrainedTokenizerBase, samples: int = SAMPLES,
                       seq_len: int = SEQ_LEN, seed: int = SEED) -> CalibrationSet:
    """`samples` windows of `seq_len` tokens cut from `text`'s documents, at offsets drawn uniformly by a generator
    seeded with `seed`.

    The documents are tokenized by `tokenizer` and laid end to end, its end-of-sequence token (or separator)
    between them. Windows may overlap, as GPTQ's do. A text too short for them gives fewer windows, laid end to
    end from its first token, and says so in `shortfall`; one shorter than `MIN_WINDOWS` windows is an error."""
    if samples < 1 or seq_len < 1:
        raise UsageError(f"calibration needs at least one window of one token, not {samples} of {seq_len}",
                         hint=f"the defaults are {SAMPLES} windows of {SEQ_LEN} tokens")
    stream = torch.tensor(_stream(text.documents, tokenizer), dtype=torch.int64)
    available = stream.numel()
    whole = available // seq_len
    if whole < MIN_WINDOWS:
        raise InputError(printable(f"calibration text {text.name} gives {available:,} tokens, fewer than "
                                   f"{MIN_WINDOWS} windows of {seq_len}"),
                         hint="give a longer text, or shorter windows")
    if available < samples * seq_len:
        shortfall = (f"calibration text {text.name} gives {available:,} tokens, fewer than {samples} windows of "
                     f"{seq_len} hold ({samples * seq_len:,}): calibrating on {whole} windows, laid end to end")
        return CalibrationSet(stream[: whole * seq_len].view(whole, seq_len), available, text.name, text.sha256,
                              printable(shortfall))
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, available - seq_len + 1, (samples,), generator=generator)
    windows = stream[starts[:, None] + torch.arange(seq_len)]
    return CalibrationSet(windows, available, text.name, text.sha256)


def consecutive_tokens(text: CalibrationText, tokenizer: PreTrainedTokenizerBase, samples: int = SAMPLES,
                       seq_len: int = SEQ_LEN) -> CalibrationSet:
    """At most `samples` windows of `seq_len` tokens laid end to end from the first token of `text`'s
    documents (tokenized and joined as `calibration_tokens` does): what an evaluation scores, each token in
    one window at most. A text too short for them gives fewer, and says so in `shortfall`; one shorter than
    one window is an error."""
    if samples < 1 or seq_len < 1:
        raise UsageError(f"an evaluation needs at least one window of one token, not {samples} of {seq_len}",
                         hint=f"the defaults are {SAMPLES} windows of {SEQ_LEN} tokens")
    stream = torch.tensor(_stream(text.documents, tokenizer), dtype=torch.int64)
    available = stream.numel()
    whole = min(available // seq_len, samples)
    if whole < 1:
        raise InputError(printable(f"text {text.name} gives {available:,} tokens, fewer than one window of {seq_len}"),
                         hint="give a longer text, or a shorter --seq-len")
    shortfall = None if whole == samples else printable(
        f"text {text.name} gives {available:,} tokens, fewer than {samples} windows of {seq_len} hold "
        f"({samples * seq_len:,}): scoring {whole} windows")
    return CalibrationSet(stream[: whole * seq_len].view(whole, seq_len), available, text.name, text.sha256,
                          shortfall)


def _stream(documents: list[str], tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The token ids of `documents`, without the special tokens the tokenizer adds to a sequence (BOS,
    [CLS]), one document after another with the separator between them."""
    encoded = tokenizer(documents, add_special_tokens=False, verbose=False)["input_ids"]
    separator = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    stream: list[int] = []
    for ids in filter(None, encoded):  # a document of no tokens (an empty JSON line's) adds no separator
        if stream and separator is not None:
            stream.append(separator)
        stream.extend(ids)
    return stream


def special_frame(tokenizer: PreTrainedTokenizerBase) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts around every sequence it encodes (BERT's [CLS] before and [SEP]
    after, a Llama's BOS before): what the model always sees around its input, and so its windows too."""
    word = "a"
    bare = tokenizer(word, add_special_tokens=False, verbose=False)["input_ids"]
    whole = tokenizer(word, verbose=False)["input_ids"]
    at = next((i for i in range(len(whole) - len(bare) + 1) if whole[i : i + len(bare)] == bare), None)
    if at is None:  # a tokenizer whose specials change the word's own tokens: nothing put around
        return [], []
    return whole[:at], whole[at + len(bare) :]


def framed(windows: CalibrationSet, tokenizer: PreTrainedTokenizerBase) -> CalibrationSet:
    """`windows` with the tokenizer's special tokens around each (`special_frame`), as the model sees text."""
    before, after = special_frame(tokenizer)
    if not before and not after:
        return windows
    count = windows.tokens.shape[0]
    pieces = [torch.tensor(ids, dtype=torch.int64).expand(count, len(ids)) for ids in (before, after)]
    return replace(windows, tokens=torch.cat([pieces[0], windows.tokens, pieces[1]], dim=1))


def windows(text: CalibrationText, tokenizer, calibrating: CalibrationInput) -> CalibrationSet:
    """The windows the model runs on: `seq_len` tokens each, the tokenizer's special tokens around the text
    it cuts (`data.framed`), as the model sees every input."""
    before, after = special_frame(tokenizer)
    body = calibrating.seq_len - len(before) - len(after)
    if body < 1:
        raise UsageError(f"--seq-len {calibrating.seq_len} leaves no room for text beside the tokenizer's "
                         f"{len(before) + len(after)} special tokens", hint="pass a longer --seq-len")
    return framed(calibration_tokens(text, tokenizer, calibrating.samples, body, calibrating.seed), tokenizer)
