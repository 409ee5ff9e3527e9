"""`evaluate_file`: a burnpack file qcli wrote, scored against the checkpoint it was written from by what the
model predicts on a text.

transformers builds the model from config.json (`qcli.calibrate.checkpoint.Checkpoint`). It runs once with the
source's weights and once with the file's: QFloat tensors decoded, the others as stored, those written
`[in, out]` turned back. Each window of the text is scored in turn (`qcli.calibrate.evaluate`).

Every tensor of the file is paired with the source's tensor of its name before anything heavy loads (GPTQ's
`m.qweight` is written `m.weight`). A tensor either side lacks, or a shape that disagrees, is refused: a
pairing qcli is not sure of is never scored."""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qcli.calibrate.checkpoint import Checkpoint
from qcli.calibrate.inputs import SAMPLES, SEQ_LEN, TEXT_HINT, CalibrationInput
from qcli.errors import InputError, UsageError
from qcli.formats import detect
from qcli.formats.found import Encoded, Transcode
from qcli.io.burnpack import TensorEntry, metadata_json
from qcli.io.burnpack_index import BurnpackSet, is_container, standing_index
from qcli.io.dtypes import FLOAT_DTYPES, Plain, QFloat
from qcli.io.files import load_json, named_file
from qcli.io.readers import GGUF, Reader, locate, open_source, reader_of
from qcli.io.source import Names, Source, TensorInfo, checkpoint_folder
from qcli.output.folder import MODEL_FILE, RECORD_FILE
from qcli.output.metadata import written_transposed
from qcli.pipeline.device import require_device
from qcli.report.evaluate import EvalReport
from qcli.text import printable, quoted

if TYPE_CHECKING:
    import torch

QUANTIZED_HINT = "give the .bpk file or the model folder (-o DIR/) that `qcli quantize` wrote"
WRITTEN_FROM_HINT = "evaluate against the checkpoint the .bpk was written from"


@dataclass(frozen=True)
class Pair:
    """A tensor of the quantized file (`entry`), the source tensor it was written from (`source`), and whether
    it was written `[in, out]` (`transposed`), its source's `[out, in]`."""

    entry: TensorEntry
    source: str
    transposed: bool

    @property
    def shape(self) -> tuple[int, ...]:
        """Its shape as the source has it."""
        shape = tuple(self.entry.shape)
        return shape[::-1] if self.transposed else shape


def evaluate_file(quantized: str | Path, *, against: str | Path, text: str | Path, samples: int | None = None,
                  seq_len: int | None = None, names: str | None = None, device: str = "auto",
                  per_tensor: bool = False, progress=None) -> EvalReport:
    """Score `quantized` (a .bpk, the index of its shards, or a model folder holding `model.bpk`) against
    `against` (the checkpoint it was written from: safetensors, GGUF, or ORG/NAME in the local Hugging Face
    cache) on at most `samples` windows of `seq_len` tokens laid end to end from the start of `text`: the mean
    next-token KL(source || quantized), the top-1 agreement and both perplexities. The model is built from the
    config.json of the model folder, else the source's folder, and its tokenizer is the same folder's.
    `names`: a GGUF source's tensor names (`file` or `hf`); by default what a model folder's record says
    quantize read it with, else `file`. `per_tensor`: also score each tensor whose decoded values differ
    from the source's with it alone quantized (one more forward pass a window each). `progress(done, count,
    seconds)` is told each window scored."""
    data = Path(text)
    given = CalibrationInput(data, SAMPLES if samples is None else samples, SEQ_LEN if seq_len is None else seq_len)
    given.check_windows()
    named_file(data, "text", TEXT_HINT)  # before the slow imports
    device = require_device(device)
    started = time.perf_counter()
    bpk, folder = quantized_file(Path(quantized))
    source_path, _ = locate(against)
    names = Names(names) if names is not None else recorded_names(folder, reader_of(source_path))
    reader = BurnpackSet.open(bpk)
    transposed = transposed_names(reader)
    with open_source(source_path, names) as source, tempfile.TemporaryDirectory(prefix="qcli-eval-") as scratch:
        infos = {i.name: i for i in source.infos()}
        found = {n: f for n, f in detect(list(infos.values())).items() if isinstance(f, Transcode | Encoded)}
        pairs = paired(reader, infos, found, transposed, str(against), source.format, names)
        config, described = model_folder(folder, source_path, Path(scratch))
        checkpoint = Checkpoint(
            config, [_renamed(infos[p.source], name) for name, p in pairs.items()],
            lambda name: _source_values(source, pairs[name].source, found.get(pairs[name].source)), described)
        from qcli.calibrate.evaluate import evaluate_quantized

        result, each, chosen, windows = evaluate_quantized(checkpoint, lambda name: decoded(reader, pairs[name]),
                                                           given, device, progress, per_tensor)
    return EvalReport(
        quantized_path=str(quantized), source_path=str(against), config=checkpoint.described,
        text=windows.name, text_sha256=windows.sha256, seq_len=int(windows.tokens.shape[1]), scores=result,
        quantized=sum(isinstance(p.entry.dtype, QFloat) for p in pairs.values()),
        kept=sum(not isinstance(p.entry.dtype, QFloat) for p in pairs.values()),
        transposed=sum(p.transposed for p in pairs.values()), device=chosen,
        seconds=time.perf_counter() - started, shortfall=windows.shortfall, each=each)


def model_folder(folder: Path | None, source: Path, scratch: Path) -> tuple[Path, str]:
    """The folder the model is built from (config.json, the tokenizer's files) and where its config came from:
    the model folder, else the source's folder, else, for a GGUF source, `scratch` given what transformers
    makes of the file's metadata."""
    beside = checkpoint_folder(source)
    for candidate in (folder, beside):
        if candidate is not None and (candidate / "config.json").is_file():
            return candidate, str(candidate / "config.json")
    if reader_of(source) is GGUF:
        from qcli.calibrate.checkpoint import describe_gguf

        return describe_gguf(source, scratch), f"{source} (its metadata)"
    where = f"{folder} nor {beside}" if folder is not None else f"{beside}"
    raise UsageError(printable(f"no config.json in {where}, which the model is built from"),
                     hint="evaluate the model folder `qcli quantize -o DIR/` wrote, or a source whose folder "
                          "holds config.json and the tokenizer's files")


def quantized_file(path: Path) -> tuple[Path, Path | None]:
    """The burnpack file (or index) `path` gives, and the model folder it is in where `path` is one."""
    if path.is_dir():
        model = path / MODEL_FILE
        if not model.is_file() and standing_index(model) is None:
            raise UsageError(printable(f"{path} holds no {MODEL_FILE} (nor its index)"), hint=QUANTIZED_HINT)
        return model, path
    if not path.exists() and standing_index(path) is None:
        raise UsageError(printable(f"cannot read {path}: no such file or folder"), hint=QUANTIZED_HINT)
    if not is_container(path):
        raise UsageError(printable(f"{path} is not a burnpack (.bpk) file"),
                         hint="the first argument is what `qcli quantize` wrote; the checkpoint goes to --against")
    return path, None


def recorded_names(folder: Path | None, source: Reader) -> Names:
    """The `--names` a model folder's record says quantize read its source with; `file` without one, or for a
    source whose own names are kept (a safetensors checkpoint's are Hugging Face's, as `hf` gave a GGUF's)."""
    record = folder / RECORD_FILE if folder is not None else None
    if record is None or not record.is_file():
        return Names.file
    document = load_json(record, QUANTIZED_HINT, what=RECORD_FILE)
    options = document.get("options") if isinstance(document, dict) else None
    value = options.get("names") if isinstance(options, dict) else None
    return Names(value) if value in {n.value for n in Names} and source.hf_names is not None else Names.file


def transposed_names(reader: BurnpackSet) -> set[str]:
    """The tensors the file says were written `[in, out]` (its `transposed` metadata); a file qcli did not
    write, which does not say, is refused."""
    metadata = reader.metadata
    if metadata.get("producer") != "qcli" or "transposed" not in metadata:
        raise UsageError(printable(f"{reader.path} was not written by qcli: which of its tensors are written "
                                   "[in, out] is not recorded"), hint=QUANTIZED_HINT)
    return written_transposed(reader.path, metadata)


def paired(reader: BurnpackSet, infos: dict[str, TensorInfo], found: dict, transposed: set[str], against: str,
           source_format: str, names: Names) -> dict[str, Pair]:
    """Each tensor of the file (by its name) paired with its source tensor; a UsageError where a tensor of
    either has none in the other, or a shape disagrees, and an InputError where the file's `transposed`
    metadata names a tensor it does not hold as a matrix."""
    entries = reader.entries()
    sources = {f.name: n for n, f in found.items()}  # a weight's name as written -> its source's
    consumed = {c.name for f in found.values() for c in f.companions}
    by_name = {e.name: e for e in entries}
    odd = sorted(n for n in transposed if n not in by_name or len(by_name[n].shape) != 2)
    if odd:
        raise InputError(printable(f"{reader.path}: metadata 'transposed' names {quoted(odd[0])}, which the file "
                                   "does not hold as a matrix"),
                         hint="the file was not written by qcli, or was edited; write it again from its source")
    unknown = [e.name for e in entries if sources.get(e.name, e.name) not in infos]
    if unknown:
        raise UsageError(printable(f"{len(unknown)} of the {len(entries)} tensors of {reader.path} are not in "
                                   f"{against}: {quoted(unknown[0])}" + (", ..." if len(unknown) > 1 else "")),
                         hint=_names_hint(reader, source_format, names))
    written = {sources.get(e.name, e.name) for e in entries}
    missing = sorted(set(infos) - consumed - written)
    if missing:
        raise UsageError(printable(f"{reader.path} lacks {len(missing)} of the tensors of {against}: "
                                   f"{quoted(missing[0])}" + (", ..." if len(missing) > 1 else "")),
                         hint=_names_hint(reader, source_format, names))
    pairs = {e.name: Pair(e, sources.get(e.name, e.name), e.name in transposed) for e in entries}
    for name, pair in pairs.items():
        source = infos[pair.source]
        if pair.source in found or tuple(source.shape) == pair.shape:
            continue  # an already-quantized source's shape is its values', checked once dequantized
        turned = " (turned back from [in, out])" if pair.transposed else ""
        hint = (f"its shape is the source's transposed, which the file's 'transposed' metadata does not say; "
                f"{WRITTEN_FROM_HINT}" if not pair.transposed and pair.shape[::-1] == tuple(source.shape)
                else WRITTEN_FROM_HINT)
        raise UsageError(printable(f"tensor {quoted(name)} is {list(pair.shape)}{turned} in {reader.path} but "
                                   f"{list(source.shape)} in {against}"), hint=hint)
    return pairs


def _names_hint(reader: BurnpackSet, source_format: str, names: Names) -> str:
    if source_format == "gguf" and names is Names.file:
        return ("a GGUF source's tensors are named as llama.cpp names them: for a .bpk written with --names hf, "
                "pass --names hf")
    files = reader.metadata.get("source_files", "")
    written_from = ""
    try:
        listed = metadata_json(reader.path, "source_files", files) if files else []
        if isinstance(listed, list):
            written_from = ", ".join(str(f.get("name")) for f in listed if isinstance(f, dict))
    except InputError:
        pass
    return printable(WRITTEN_FROM_HINT + (f" ({written_from})" if written_from else ""))


def _renamed(info: TensorInfo, name: str) -> TensorInfo:
    """`info` under the name its weight is written with."""
    from dataclasses import replace

    return info if info.name == name else replace(info, name=name)


def _source_values(source: Source, name: str, found) -> torch.Tensor:
    """A source tensor's values: its own, or what its already-quantized format dequantizes it to."""
    x = source.load(name)
    if isinstance(found, Transcode):
        return found.dequantize(x, source.load)
    if isinstance(found, Encoded):
        if not found.requantizable:
            raise UsageError(printable(f"qcli cannot dequantize {quoted(name)} ({found.format}) to run the source"),
                             hint="evaluate against a float checkpoint")
        return found.with_state(source.load).dequantize(source.load)
    return x


def decoded(reader: BurnpackSet, pair: Pair) -> torch.Tensor:
    """A tensor of the file as the model takes it: a QFloat decoded to f32, a floating one as stored, turned
    back to the source's `[out, in]` where it was written `[in, out]`."""
    import torch

    from qcli.io.dtypes import torch_dtype

    entry, data = pair.entry, reader.read(pair.entry.name)
    shape = tuple(entry.shape)
    if isinstance(entry.dtype, QFloat):
        from qcli.codec import decode

        values = decode(data, entry.dtype.scheme, shape)
    elif isinstance(entry.dtype, Plain) and entry.dtype.value in FLOAT_DTYPES:
        values = torch.frombuffer(bytearray(data), dtype=torch_dtype(entry.dtype.value)).reshape(shape)
    else:
        raise UsageError(printable(f"tensor {quoted(entry.name)} of {reader.path} is {entry.dtype}, which a "
                                   "model's parameter cannot be"), hint=WRITTEN_FROM_HINT)
    return values.t() if pair.transposed else values
