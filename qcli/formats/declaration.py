"""A checkpoint's declaration of how it was quantized, and what qcli decides from it before a tensor is planned
(docs/input-formats.md, "The declaration rule").

Tools say how they quantized a checkpoint in its folder: `config.json`'s `quantization_config` (transformers,
vLLM, llm-compressor, optimum), or a side file of their own (`quantize_config.json`: AutoGPTQ;
`quant_config.json`: AutoAWQ; `hqq_config.json`: HQQ; `hf_quant_config.json`: TensorRT Model Optimizer).
The first that declares a method is the checkpoint's `Declaration`. Each format module says the methods it
reads (`METHODS`); a declared method none reads is refused, naming the method, the file and the tensors it
covers. Without a declaration (and beside one, for tensors no format module claimed) tensors that show packing
(integer words beside float scales or zero points, names only quantizers give) are refused the same way:
nothing quantized is ever planned as if it were float.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from qcli.errors import InputError
from qcli.formats.found import Encoded, Found, Load, Transcode
from qcli.io.files import load_json
from qcli.problem import Kind
from qcli.text import clipped, printable

if TYPE_CHECKING:
    import torch

    from qcli.io.source import TensorInfo

CONFIG = "config.json"
MAX_BYTES = 64 << 20  # a declaration is a few kB; a larger file is not one
# Side files other tools write, in the order they are read after config.json, with the method each implies
# when it names none.
SIDE_FILES = (("quantize_config.json", "gptq"), ("quant_config.json", "awq"), ("hqq_config.json", "hqq"),
              ("hf_quant_config.json", "modelopt"))
# Methods qcli knows and does not read, and why (a method it has never heard of is refused too, generically).
UNREAD = {
    "eetq": "EETQ's int8 weights with per-channel fp16 scales (weight_scales), stored in its CUDA kernel's "
            "shuffled layout, which is not documented outside its kernel",
    "torchao": "torchao's tensor subclasses (their codes, scales and zero points flattened into tensors whose "
               "layout depends on the subclass and torchao's version), which qcli does not read",
    "exl2": "exllama v2's variable-bit codes, permuted for its kernel (q_weight, q_scale, q_groups, q_perm), which "
            "qcli does not read",
    "aqlm": "AQLM's additive codebooks, which no Burn scheme holds",
    "vptq": "VPTQ's vector codebooks, which no Burn scheme holds",
    "spqr": "SpQR's sparse outliers beside 3-bit codes, which no Burn scheme holds",
    "higgs": "HIGGS' lattice codebooks, which no Burn scheme holds",
    "bitnet": "BitNet's packed ternary weights, which qcli does not read",
}
INTEGERS = ("I8", "U8", "I16", "U16", "I32", "U32")
# Leaf names only quantizers give: GPTQ, AWQ, bitsandbytes, HQQ, exllama v2, compressed-tensors, torchao.
PACKED_LEAVES = frozenset({"qweight", "qzeros", "g_idx", "SCB", "weight_format", "absmax", "quant_map", "W_q",
                           "q_weight", "q_scale", "q_scale_max", "q_groups", "q_perm", "q_invperm", "weight_packed",
                           "weight_zero_point", "weight_scales", "qdata", "_data", "int_data"})
# Words in the name of a float companion that turns integer codes beside it into evidence (Marlin's scale is `s`).
COMPANION_WORDS = ("scale", "zero", "absmax", "scb", "meta")
COMPANION_LEAVES = ("s",)
EVIDENCE = ("integer codes beside float scales or zero points, or tensors only quantizers write "
            "(qweight, qzeros, g_idx, SCB, absmax, W_q, ...)")


@dataclass(frozen=True)
class Declaration:
    """The method a checkpoint says it was quantized with, the file that says so, and what that file holds."""

    method: str  # lowercase, as `quant_method` spells it
    file: str  # config.json, or a side file's name
    raw: dict[str, Any]

    def describe(self) -> str:
        """`quant_method 'gptq' (checkpoint_format 'marlin') in config.json`."""
        form = self.raw.get("checkpoint_format", self.raw.get("version"))
        detail = f" ({'checkpoint_format' if 'checkpoint_format' in self.raw else 'version'} {form!r})" if (
            isinstance(form, str)) else ""
        return printable(f"quant_method {self.method!r}{detail} in {self.file}")

    def load_time(self) -> bool:
        """Whether it declares quantization applied when a model is loaded, over float weights on disk: vLLM's
        dynamic FP8 (`activation_scheme: dynamic`), bitsandbytes' `load_in_4bit` and `load_in_8bit`."""
        return (self.raw.get("activation_scheme") == "dynamic" and self.method == "fp8"
                or self.method == "bitsandbytes" and bool(self.raw.get("load_in_4bit") or self.raw.get("load_in_8bit")))


def quantization_config(declared: Declaration | None) -> dict[str, Any]:
    """What `config.json`'s `quantization_config` says ({} where there is none, or a side file declares)."""
    return declared.raw if declared is not None and declared.file == CONFIG else {}


def declaration(folder: Path) -> Declaration | None:
    """The first declaration of `folder`: config.json's `quantization_config`, else a side file; None where
    none declares one (a file that is not JSON declares nothing, as config.json's absence)."""
    config = _json(folder / CONFIG)
    quantization = config.get("quantization_config") if isinstance(config, dict) else None
    if isinstance(quantization, dict):
        return Declaration(_method(quantization, ""), CONFIG, quantization)
    for name, implied in SIDE_FILES:
        raw = _json(folder / name)
        if isinstance(raw, dict):
            return Declaration(_method(raw, implied), name, raw)
    return None


def _json(path: Path) -> object:
    """The JSON in `path` (`load_json`: a regular file of at most MAX_BYTES, shallow), or None for a missing
    file or one `load_json` refuses: a file that is not a declaration declares nothing."""
    if not path.exists():
        return None
    try:
        return load_json(path, "", MAX_BYTES)
    except InputError:
        return None


def _method(raw: dict[str, Any], implied: str) -> str:
    """`quant_method` in lowercase; bitsandbytes' older configs name none but say `load_in_4bit`/`_8bit`."""
    method = raw.get("quant_method")
    if isinstance(method, str) and method:
        return clipped(method.lower())  # every message names it: a megabyte-long one is cut
    if "load_in_4bit" in raw or "load_in_8bit" in raw:
        return "bitsandbytes"
    return implied  # "" for a config.json that names none: its tensors decide


@dataclass(frozen=True)
class Refused(Encoded):
    """A tensor of a checkpoint qcli cannot read as any Burn scheme and has no decoder for: refused with its
    reason (`cause`) and what to do (`way_out`), even under `--requantize`."""

    cause: str = ""
    way_out: str = ""

    kind: ClassVar[Kind] = Kind.dtype
    encoding: ClassVar[str] = "not read by qcli"
    requantizable: ClassVar[bool] = False

    @property
    def why(self) -> str:
        return self.cause

    def hint(self, preset: str | None = None) -> str:
        return self.way_out

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.weight.shape)

    @property
    def dtype(self) -> str:
        return self.weight.dtype

    def dequantize(self, load: Load) -> torch.Tensor:
        raise AssertionError("a refused tensor is never requantized (`requantizable`)")


def decide(infos: Sequence[TensorInfo], found: Mapping[str, Found], declared: Declaration | None,
           handled: Collection[str]) -> dict[str, Refused]:
    """The tensors refused by the declaration rule: every tensor a declared method no format module reads
    (`handled`) covers, and the tensors no module claimed in `found` that show packing."""
    claimed = _claimed(found)
    evidence = _evidence(infos, claimed)
    if declared is not None and declared.method and declared.method not in handled:
        covered = evidence or [i for i in infos if i.name not in claimed and i.dtype in INTEGERS] or [
            i for i in infos if i.name not in claimed and len(i.shape) >= 2]
        why = UNREAD.get(declared.method, "a method qcli has never heard of, so what its tensors hold is unknown")
        cause = printable(f"{why}; qcli reads the methods {', '.join(sorted(handled))}")
        way_out = (f"dequantize the checkpoint to BF16 or F32 with {printable(declared.method)}'s own tools first, "
                   "then run qcli; where its weights on disk are float (a method applied at load time), remove "
                   f"quantization_config from {declared.file} (docs/input-formats.md, \"The declaration rule\")")
        format = declared.describe()
    elif evidence:
        cause = (f"{EVIDENCE}, which no qcli format module reads" + (
            f" as {printable(declared.method)}" if declared is not None else
            "; and no config.json quantization_config or side file declares the method that wrote them"))
        way_out = ("dequantize the checkpoint to BF16 or F32 with the tool that quantized it first, then run qcli "
                   "(docs/input-formats.md lists the formats qcli reads)")
        format = (f"codes of an unread layout ({declared.describe()})" if declared is not None
                  else "undeclared packed codes")
        covered = evidence
    else:
        return {}
    return {i.name: Refused(i, format, (), cause, way_out) for i in covered}


def verdict(found: Mapping[str, Found], declared: Declaration | None, handled: Collection[str]) -> str:
    """What the declaration decides, in words, for `inspect`."""
    if declared is None:
        refused = any(isinstance(f, Refused) for f in found.values())
        return ("no declaration; tensors show packing: refused" if refused
                else "no declaration: every tensor is planned from its dtype and name")
    if not declared.method:
        return f"{declared.file} names no quant_method: every tensor is planned from its dtype and name"
    if declared.method not in handled:
        return f"{declared.describe()}: a method qcli does not read, refused"
    if any(not isinstance(f, Refused) for f in found.values()):
        return f"{declared.describe()}: read by its format module"
    if found:
        return f"{declared.describe()}: its tensors are not that method's layout, refused"
    why = "quantization applied at load time" if declared.load_time() else "no tensor of that method on disk"
    return f"{declared.describe()}: {why}, the weights on disk are float, so what is on disk decides"


def _claimed(found: Mapping[str, Found]) -> set[str]:
    """The tensors a format module spoke for, and the modules they are in (whose other tensors it saw)."""
    names = set(found) | {c.name for f in found.values() if isinstance(f, Transcode | Encoded) for c in f.companions}
    return names | {n.rpartition(".")[0] + "." for n in names}


def _evidence(infos: Sequence[TensorInfo], claimed: set[str]) -> list[TensorInfo]:
    """The tensors, in modules no format module spoke for, that show packing: a leaf name only quantizers give,
    or integer codes beside a float tensor named as a scale or zero point."""
    coded = {i.name.rpartition(".")[0] + "." for i in infos if i.dtype in INTEGERS and len(i.shape) >= 1}
    modules: dict[str, list[TensorInfo]] = {}
    for info in infos:  # only the modules that hold integer codes: a float checkpoint passes in one look
        module = info.name.rpartition(".")[0] + "."
        if module in coded and info.name not in claimed and module not in claimed:
            modules.setdefault(module, []).append(info)
    shown = []
    for tensors in modules.values():
        codes = [i.dtype in INTEGERS and len(i.shape) >= 1 for i in tensors]
        named = [_companion(leaf) or leaf in PACKED_LEAVES for leaf in (i.name.rpartition(".")[2] for i in tensors)]
        if any(codes) and any(named):
            shown += [i for i, code, name in zip(tensors, codes, named, strict=True) if code or name]
    return shown


def _companion(leaf: str) -> bool:
    return leaf in COMPANION_LEAVES or any(w in leaf.lower() for w in COMPANION_WORDS)
