"""`--names hf`: a GGUF file's llama.cpp tensor names back to Hugging Face's, from the gguf package's own
tables (`gguf.get_tensor_name_map` for the file's `general.architecture` and block count), with the Q and K
projection rows put back in Hugging Face's order where llama.cpp's converter permuted them.

The tables map every name a converter reads (each model family's) to the one GGUF name; the Hugging Face
name is the one of transformers' decoder layout, `model.…` for the base model and `lm_head` for the head,
which each architecture here uses. For llama, the converter (`LlamaModel.permute` in
convert_hf_to_gguf.py) reorders the rows of `q_proj` (with the head count) and `k_proj` (with the KV head
count), weight and bias, from Hugging Face's rotate-half layout into llama.cpp's interleaved one:
`W.reshape(heads, 2, rows // heads // 2, ...).swapaxes(1, 2).reshape(W.shape)`. Hugging Face's row
`h * d + j * d/2 + i` (head `h` of `d` rows) is therefore GGUF's row `h * d + 2 i + j`; each row is whole
blocks, so codes and their scales move together and the tensor stays exactly what the file holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qcli.errors import UsageError
from qcli.io.gguf import GgufSource
from qcli.text import printable, shown

if TYPE_CHECKING:
    import gguf

    from qcli.io.source import Source

# The architectures whose Hugging Face layout is known here, and whether llama.cpp's converter permuted
# their Q and K rows (convert_hf_to_gguf.py: LlamaModel does, Qwen2Model does not). Not qwen3: the first
# `model.` name the tables give its Q and K norms is another family's (`q_layernorm`, not `q_norm`).
ARCHITECTURES = {"llama": True, "qwen2": False}
HF_PREFIXES = ("model.", "lm_head")
SUFFIXES = (".weight", ".bias")
_HINT = "drop --names to keep llama.cpp's names"


def hf_names(source: Source) -> GgufSource:
    """`source` with its tensors under Hugging Face's names (those the tables do not know kept as they are),
    and the permuted Q and K rows read in Hugging Face's order."""
    import gguf

    assert isinstance(source, GgufSource)  # the GGUF reader's `hf_names`: it is given what that reader opened

    path, metadata = source.files[0], source.metadata
    arch = metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise UsageError(printable(f"{path}: --names hf maps the names of {', '.join(ARCHITECTURES)} models; this "
                                   f"file's general.architecture is {shown(arch)}"), hint=_HINT)
    table = name_table(arch, _count(source, f"{arch}.block_count"))
    hf = hf_bases(table)
    names, rows = {}, {}
    permuted = (gguf.MODEL_TENSOR.ATTN_Q, gguf.MODEL_TENSOR.ATTN_K) if ARCHITECTURES[arch] else ()
    for info in source.infos():
        base, suffix = split_suffix(info.name)
        if base not in hf:
            continue
        names[info.name] = hf[base] + suffix
        kind = table.get_type(base)
        if kind in permuted:
            heads_key = "head_count" if kind is gguf.MODEL_TENSOR.ATTN_Q else "head_count_kv"
            heads = _count(source, f"{arch}.attention.{heads_key}", f"{arch}.attention.head_count")
            rows[info.name] = hf_rows(info.shape[0] if info.shape else 0, heads, info.name, path)
    taken: dict[str, str] = {}
    for info in source.infos():
        new = names.get(info.name, info.name)
        if new in taken:
            raise UsageError(printable(f"{path}: --names hf gives {taken[new]} and {info.name} the one name {new}"),
                             hint=_HINT)
        taken[new] = info.name
    return source.renamed(names, rows)


def hf_rows(rows: int, heads: int, name: str, path: object) -> tuple[int, ...]:
    """The GGUF row each Hugging Face row of a permuted Q or K projection is read from."""
    if heads <= 0 or rows % (2 * heads):
        raise UsageError(printable(f"{path}: {name} has {rows} rows, not an even number per head for {heads} heads, "
                                   "so its rows cannot be put back in Hugging Face's order"), hint=_HINT)
    size = rows // heads
    return tuple(h * size + 2 * i + j for h in range(heads) for j in range(2) for i in range(size // 2))


def gguf_architecture(model_type: str) -> str | None:
    """The gguf package's architecture (a `general.architecture` value) of transformers' `model_type`: the
    one of the same name, `_` and `-` aside (`qwen2_moe` is `qwen2moe`), or of that name less `_text`
    (`gemma3_text`, Gemma 3's text model, is `gemma3`); None where the package names none."""
    import gguf

    def spelt(name: str) -> str:
        return name.lower().replace("_", "").replace("-", "")

    known = {spelt(name): name for name in gguf.MODEL_ARCH_NAMES.values()}
    for candidate in (model_type, model_type.removesuffix("_text")):
        if spelt(candidate) in known:
            return known[spelt(candidate)]
    return None


def architectures() -> list[str]:
    """Every architecture the gguf package has a name table of."""
    import gguf

    return sorted(gguf.MODEL_ARCH_NAMES.values())


def name_table(arch: str, blocks: int) -> gguf.TensorNameMap:
    """The gguf package's name table of `arch` (a `general.architecture` value) for `blocks` blocks."""
    import gguf

    model_arch = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == arch)
    # The package's constructor updates its class-wide block table with an architecture's own entries
    # (arctic's ffn_norm), which every table built after it would keep: each is built on a copy.
    shared = gguf.TensorNameMap.block_mappings_cfg
    gguf.TensorNameMap.block_mappings_cfg = dict(shared)
    try:
        return gguf.get_tensor_name_map(model_arch, blocks)
    finally:
        gguf.TensorNameMap.block_mappings_cfg = shared


def hf_bases(table: gguf.TensorNameMap) -> dict[str, str]:
    """GGUF base name (`blk.0.attn_q`) -> the first Hugging Face name the table gives it
    (`model.layers.0.self_attn.q_proj`): the table lists every family's names, transformers' among them."""
    hf: dict[str, str] = {}
    for key, (_, name) in table.mapping.items():
        if key.startswith(HF_PREFIXES):
            hf.setdefault(name, key)
    return hf


def split_suffix(name: str) -> tuple[str, str]:
    """`blk.0.attn_q.weight` -> (`blk.0.attn_q`, `.weight`); a name with none of SUFFIXES -> (name, "")."""
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)], suffix
    return name, ""


def _count(source: GgufSource, key: str, fallback: str | None = None) -> int:
    """A positive integer of the metadata (`fallback`'s where `key` is absent); one value for every layer."""
    value = source.metadata.get(key, source.metadata.get(fallback) if fallback else None)
    if isinstance(value, tuple) and value and len(set(value)) == 1:
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UsageError(printable(f"{source.files[0]}: --names hf needs {key}, one positive count, but the file "
                                   f"has {value!r}"), hint=_HINT)
    return value
