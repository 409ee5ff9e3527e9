"""The calibration text (plain or JSON lines, and the files refused) and the token windows cut from it, held to
hand-worked token streams and to the tokenizers package's own encoding."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from qcli.calibrate.data import (
    CalibrationText,
    calibration_tokens,
    read_calibration_text,
)
from qcli.errors import InputError, UsageError
from tests.calibrate_support import TEXT, llama_tokenizer


def word_tokenizer(eos: bool = True, sep: bool = False):
    """Words t0 ... t19 as ids 2 ... 21 (`</s>` is 1, `[SEP]` 22), and a <s> (23) that it puts before every
    sequence it encodes with its special tokens: a token stream to work out by hand."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "</s>": 1, **{f"t{i}": i + 2 for i in range(20)}, "[SEP]": 22, "<s>": 23}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 23)])
    special = {"eos_token": "</s>"} if eos else {}
    special |= {"sep_token": "[SEP]"} if sep else {}
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", bos_token="<s>", **special)


def whole_stream(text: CalibrationText, tokenizer) -> list[int]:
    """The token stream of `text`: far more windows of one token than it holds are all of its tokens, in order."""
    return calibration_tokens(text, tokenizer, samples=10**6, seq_len=1).tokens.flatten().tolist()


DOCUMENTS = CalibrationText(["t0 t1 t2 t3 t4", "t5 t6 t7"], "words.txt", "0" * 64)
STREAM = [2, 3, 4, 5, 6, 1, 7, 8, 9]  # the two documents' ids, </s> between them


def write(tmp_path: Path, data: bytes | str, name: str = "calib.txt") -> Path:
    path = tmp_path / name
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def test_a_text_file_is_one_document_with_its_name_and_sha256(tmp_path):
    path = write(tmp_path, "first paragraph\n\nsecond paragraph\n")
    text = read_calibration_text(path)
    assert text.documents == ["first paragraph\n\nsecond paragraph\n"]
    assert (text.name, text.sha256) == ("calib.txt", hashlib.sha256(path.read_bytes()).hexdigest())


def test_json_lines_are_a_document_each(tmp_path):
    lines = [json.dumps({"text": "one\ntwo", "id": 1}), "", json.dumps({"text": "three \u2028 four"}), "  "]
    text = read_calibration_text(write(tmp_path, "\r\n".join(lines), "calib.jsonl"))
    assert text.documents == ["one\ntwo", "three \u2028 four"]


def test_a_byte_order_mark_is_not_part_of_the_text(tmp_path):
    assert read_calibration_text(write(tmp_path, b"\xef\xbb\xbfhello")).documents == ["hello"]


def test_lines_not_all_json_objects_are_plain_text(tmp_path):
    data = '{"text": "a"}\nnot json\n[1, 2]\n'
    assert read_calibration_text(write(tmp_path, data)).documents == [data]


def test_a_json_line_without_a_string_text_is_an_input_error_naming_the_line(tmp_path):
    path = write(tmp_path, '{"text": "a"}\n\n{"content": "b"}\n')
    with pytest.raises(InputError, match=r"calib.txt:3: a JSON line without a string \"text\" field"):
        read_calibration_text(path)
    with pytest.raises(InputError, match=r":1: a JSON line"):
        read_calibration_text(write(tmp_path, '{"text": 5}\n'))


@pytest.mark.parametrize(("data", "message"), [
    (b"", "is empty"),
    (b" \n\n\t\n", "is empty"),
    ('{"text": ""}\n{"text": "  "}\n', "is empty"),
    (b"text\x00more", "is binary: a NUL byte at offset 4"),
    (b"caf\xe9 au lait", "is not UTF-8: byte 3 cannot be decoded"),
])
def test_empty_and_binary_files_are_input_errors(tmp_path, data, message):
    with pytest.raises(InputError, match=message) as caught:
        read_calibration_text(write(tmp_path, data))
    assert "UTF-8 text file" in caught.value.hint


def test_a_missing_file_or_a_folder_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        read_calibration_text(tmp_path / "absent.txt")
    with pytest.raises(UsageError, match=r"not a regular file \(a directory\)"):
        read_calibration_text(tmp_path)


def test_windows_are_slices_of_the_documents_laid_end_to_end():
    windows = calibration_tokens(DOCUMENTS, word_tokenizer(), samples=3, seq_len=3, seed=0)
    assert windows.tokens.dtype == torch.int64 and windows.tokens.shape == (3, 3)
    slices = [STREAM[start : start + 3] for start in range(len(STREAM) - 2)]
    assert all(row in slices for row in windows.tokens.tolist())
    assert (windows.available, windows.used, windows.shortfall) == (9, 9, None)
    assert (windows.name, windows.sha256) == (DOCUMENTS.name, DOCUMENTS.sha256)


def test_every_offset_can_be_drawn_the_last_one_too():
    tokenizer = word_tokenizer()
    rows = [row for seed in range(200) for row in calibration_tokens(DOCUMENTS, tokenizer, 3, 3, seed).tokens.tolist()]
    assert {STREAM.index(row[0]) for row in rows} == set(range(len(STREAM) - 2))  # each id is once in STREAM


def test_the_same_seed_gives_the_same_windows_and_another_seed_others():
    tokenizer = word_tokenizer()
    first, again = (calibration_tokens(DOCUMENTS, tokenizer, samples=3, seq_len=2, seed=7) for _ in range(2))
    assert torch.equal(first.tokens, again.tokens)
    others = [calibration_tokens(DOCUMENTS, tokenizer, samples=3, seq_len=2, seed=seed).tokens for seed in range(5)]
    assert any(not torch.equal(first.tokens, other) for other in others)


def test_the_separator_is_eos_else_sep_else_none_and_no_bos():
    assert whole_stream(DOCUMENTS, word_tokenizer(eos=True, sep=True)) == STREAM
    assert whole_stream(DOCUMENTS, word_tokenizer(eos=False, sep=True)) == [2, 3, 4, 5, 6, 22, 7, 8, 9]
    assert whole_stream(DOCUMENTS, word_tokenizer(eos=False)) == [2, 3, 4, 5, 6, 7, 8, 9]
    assert word_tokenizer()("t0")["input_ids"] == [23, 2]  # what the stream leaves out


def test_documents_without_tokens_add_no_separator():
    text = CalibrationText(["", "t0 t1", "", "t2"], "x", "")
    assert whole_stream(text, word_tokenizer()) == [2, 3, 1, 4]


def test_a_short_text_gives_fewer_windows_end_to_end_with_a_warning():
    windows = calibration_tokens(DOCUMENTS, word_tokenizer(), samples=5, seq_len=3)
    assert windows.tokens.tolist() == [STREAM[0:3], STREAM[3:6], STREAM[6:9]]
    assert windows.shortfall == ("calibration text words.txt gives 9 tokens, fewer than 5 windows of 3 hold (15): "
                                 "calibrating on 3 windows, laid end to end")


def test_a_text_of_fewer_than_two_windows_is_an_input_error():
    with pytest.raises(InputError, match="gives 9 tokens, fewer than 2 windows of 5"):
        calibration_tokens(DOCUMENTS, word_tokenizer(), samples=4, seq_len=5)
    assert calibration_tokens(DOCUMENTS, word_tokenizer(), samples=4, seq_len=4).tokens.shape == (2, 4)


@pytest.mark.parametrize(("samples", "seq_len"), [(0, 8), (4, 0)])
def test_no_windows_or_empty_windows_are_a_usage_error(samples, seq_len):
    with pytest.raises(UsageError, match=f"not {samples} of {seq_len}"):
        calibration_tokens(DOCUMENTS, word_tokenizer(), samples=samples, seq_len=seq_len)


def test_a_trained_tokenizer_streams_what_the_tokenizers_package_encodes(tmp_path):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    llama_tokenizer(tmp_path)
    documents = TEXT.split("\n\n")
    reference = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    eos = reference.token_to_id("</s>")
    expected = [i for k, doc in enumerate(documents) for i in [eos] * bool(k) + reference.encode(doc).ids]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert whole_stream(CalibrationText(documents, "text", ""), tokenizer) == expected


def test_windows_are_framed_by_the_special_tokens_the_tokenizer_puts_around_every_sequence():
    from qcli.calibrate.data import framed, special_frame, windows
    from qcli.calibrate.inputs import CalibrationInput

    tokenizer = word_tokenizer()  # its template: "<s> $A"
    assert special_frame(tokenizer) == ([23], [])
    cut = calibration_tokens(DOCUMENTS, tokenizer, samples=3, seq_len=4, seed=0)
    assert framed(cut, tokenizer).tokens.tolist() == [[23, *row] for row in cut.tokens.tolist()]
    # within --seq-len: the frame takes its place from the text's
    made = windows(DOCUMENTS, tokenizer, CalibrationInput(samples=3, seq_len=5, seed=0))
    assert made.tokens.tolist() == [[23, *row] for row in cut.tokens.tolist()]
