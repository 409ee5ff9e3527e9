"""What a tensor is to a model, from its name and shape: the token embedding, the output head, a Linear
layer's weight. The plan quantizes the first two wider and the summary says which LinearLayout the rest
need; a Burn backend whose Linear computes wrong in one layout is checked with it too."""

from __future__ import annotations

from collections.abc import Sequence

from qcli.formats import FORMAT_EMBEDDINGS

# The token embedding and the output head, by the module names common checkpoints give them (Llama and
# most Hugging Face models, GPT-2, Meta's Llama, BERT, GPT-NeoX; a format's own, as llama.cpp's GGUF files,
# from `qcli.formats`).
EMBEDDING_MODULES = ("embed_tokens", "wte", "tok_embeddings", "word_embeddings", "embed_in", *FORMAT_EMBEDDINGS)
HEAD_MODULES = ("lm_head", "embed_out")
HEAD_NAMES = ("output.weight",)  # Meta's Llama: a top-level `output` module
# Lookup tables besides the token embedding, which no Linear reads: positions (GPT-2's `wpe`, BERT's
# `position_embeddings`, llama.cpp's `position_embd`) and token types, named so wherever they appear.
TABLE_MARKS = ("embed", "embd", "wpe", "token_types")
# GPT-2's Conv1D keeps its weight [in, out], Burn's Row already, under names that other models (Qwen's
# first release) give Linear weights [out, in]: the name cannot tell which a tensor holds.
CONV1D_MODULES = ("c_attn", "c_proj", "c_fc", "q_attn")


def tensor_role(name: str) -> str | None:
    """"token embedding" or "output head" for the names checkpoints give them (`model.embed_tokens.weight`,
    `transformer.wte.weight`, `tok_embeddings.weight`, `lm_head.weight`, Meta's `output.weight`), else None."""
    if name in HEAD_NAMES:
        return "output head"
    parts = name.split(".")
    module = parts[-2] if len(parts) > 1 and parts[-1] == "weight" else parts[-1]
    if module in EMBEDDING_MODULES:
        return "token embedding"
    return "output head" if module in HEAD_MODULES else None


def linear_weight(name: str, shape: Sequence[int]) -> bool | None:
    """Whether `name` is a Linear layer's weight, PyTorch's `[out, in]` (a 2-D `*.weight` of a module that
    is no lookup table: the output head is one, the token and position embeddings are not); None where its
    name is GPT-2's Conv1D's (`CONV1D_MODULES`), which holds `[in, out]` in GPT-2 and `[out, in]` elsewhere."""
    parts = name.split(".")
    if len(shape) != 2 or len(parts) < 2 or parts[-1] != "weight":
        return False
    role = tensor_role(name)
    if role is not None:
        return role == "output head"
    module = parts[-2]
    if any(mark in module for mark in TABLE_MARKS):
        return False
    return None if module in CONV1D_MODULES else True
