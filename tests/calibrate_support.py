"""Tiny checkpoints for calibration tests: a Llama and a BERT with random weights, saved by transformers itself
(config.json, model.safetensors) beside a tokenizer trained with the tokenizers package on `TEXT` (byte-level
BPE for the Llama, WordPiece for BERT), as AutoTokenizer loads it."""

from __future__ import annotations

from pathlib import Path

import torch

TEXT = """The river runs past the old mill, where the miller keeps his grain in sacks of rough cloth.
Every morning the baker walks to the mill and buys flour for the bread she sells in the market square.

A small boat carries wood down the river to the town, and the carpenter builds tables and chairs from it.
The children of the town watch the boats from the bridge and count the sacks, the logs and the barrels.

In winter the river freezes and the mill stands still; the miller mends his wheel and the baker bakes less.
When spring returns the ice breaks, the wheel turns again, and the market fills with bread, wood and fish.
"""

VOCAB = 300
LLAMA_SPECIAL = ["<s>", "</s>"]
BERT_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def llama_tokenizer(folder: Path, text: str = TEXT) -> None:
    """A byte-level BPE tokenizer of `VOCAB` tokens trained on `text`, with <s> and </s>, saved in `folder`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=LLAMA_SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([text], trainer)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>").save_pretrained(folder)


def bert_tokenizer(folder: Path, text: str = TEXT) -> None:
    """A lower-casing WordPiece tokenizer of at most `VOCAB` tokens trained on `text`, with BERT's special
    tokens, saved in `folder`."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.train_from_iterator([text], trainers.WordPieceTrainer(vocab_size=VOCAB, special_tokens=BERT_SPECIAL))
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]",
                            cls_token="[CLS]", mask_token="[MASK]").save_pretrained(folder)


def tiny_llama(folder: Path, seed: int = 0, tie: bool = False, **sizes: int) -> Path:
    """A LlamaForCausalLM of 2 layers, hidden 64, 4 heads (2 key-value heads), or the LlamaConfig `sizes`
    given, its weights drawn with `seed`, saved in `folder` with its tokenizer; with `tie` its head is the
    embeddings (no lm_head.weight)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2} | sizes
    config = LlamaConfig(**shape, vocab_size=VOCAB, max_position_embeddings=256, tie_word_embeddings=tie,
                         bos_token_id=0, eos_token_id=1)
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(folder)
    llama_tokenizer(folder)
    return folder


def tiny_bert(folder: Path, seed: int = 0, head: bool = False) -> Path:
    """A BertModel of 2 layers, hidden 64, 4 heads (its pooler included), its weights drawn with `seed`,
    saved in `folder` with its tokenizer; with `head` a BertForMaskedLM (its names under `bert.`, no
    pooler)."""
    from transformers import BertConfig, BertForMaskedLM, BertModel

    config = BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        vocab_size=VOCAB, max_position_embeddings=256, pad_token_id=0)
    torch.manual_seed(seed)
    (BertForMaskedLM if head else BertModel)(config).save_pretrained(folder)
    bert_tokenizer(folder)
    return folder


# Tiny decoders of the kinds calibration runs besides the Llama: layers of two kinds (sliding-window attention
# of 8 tokens beside full attention, each kind with its own rotary base in Gemma 3) and MoE blocks (experts
# that transformers fuses from the checkpoint's per-expert tensors, a shared expert in Qwen2-MoE).
KINDS = ("gemma2", "gemma3", "qwen2-sliding", "mixtral", "qwen2-moe", "qwen3-moe")
SLIDING = 8


def tiny_decoder(folder: Path, kind: str, seed: int = 0) -> Path:
    """A causal LM of `kind` (one of KINDS) of 4 layers, hidden 64, 4 heads (2 key-value heads), its weights
    drawn with `seed`, saved by transformers in `folder` with the Llama's tokenizer."""
    import transformers as t

    shape = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": VOCAB, "max_position_embeddings": 256, "bos_token_id": 0,
             "eos_token_id": 1, "pad_token_id": 1}
    alternate = ["sliding_attention", "full_attention"] * 2
    moe = {"num_experts_per_tok": 2, "moe_intermediate_size": 32}
    config = {
        "gemma2": lambda: t.Gemma2Config(**shape, head_dim=16, sliding_window=SLIDING),
        "gemma3": lambda: t.Gemma3TextConfig(
            **shape, head_dim=16, sliding_window=SLIDING, layer_types=alternate,
            rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
        "qwen2-sliding": lambda: t.Qwen2Config(**shape, layer_types=alternate, use_sliding_window=True,
                                               sliding_window=SLIDING),
        "mixtral": lambda: t.MixtralConfig(**shape, num_local_experts=4, num_experts_per_tok=2),
        "qwen2-moe": lambda: t.Qwen2MoeConfig(**shape, **moe, num_experts=4, shared_expert_intermediate_size=64),
        "qwen3-moe": lambda: t.Qwen3MoeConfig(**shape, **moe, num_experts=4),
    }[kind]()
    torch.manual_seed(seed)
    t.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    llama_tokenizer(folder)
    return folder
