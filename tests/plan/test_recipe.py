"""Recipes: the issue's format parses into the rules written out here; every fault names its file and line."""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qcli.errors import RecipeError
from qcli.io.source import TensorInfo
from qcli.patterns import regex_matcher
from qcli.plan.decisions import make_plan
from qcli.recipe import RULE_KEYS, load_recipe, parse_recipe, read_recipe
from tests.cli_support import ROOT
from tests.hang_support import ends, never_hangs

ISSUE_EXAMPLE = """\
version = 1
[defaults]
on_indivisible = "keep"      # or "error": a tensor whose shape cannot take its scheme
[[rule]]                     # tried in order; the first rule whose `match` matches the tensor name wins
match = "*norm*"             # shell-style glob on the full name; "re:<regex>" for a regular expression
keep = true
[[rule]]
match = "*.weight"
value = "Q4S"                # Burn's QuantValue names
store = "PackedU32"          # default; also "Native" and "PackedNative"
mode = "Symmetric"           # default; "Lookup" is refused (below)
block = [32]                 # Burn's BlockSize, right-aligned; omit for a per-tensor scale
block_scale = "F16"          # scale dtype of the block level (required with block)
tensor_scale = "F32"         # per-tensor scale dtype; together with block it makes a two-level scheme
calibration = "MinMax"       # or "AbsMean"
transpose = false            # true writes a 2-D tensor as [in, out] for Burn's default LinearLayout::Row
[[rule]]
match = "re:.*\\\\.mlp\\\\..*"
preset = "fp4-b32"             # a preset instead of the fields above
"""

BLOCK32 = {"size": {"storage": [32, 1, 1, 1, 1], "len": 1}, "dtype": "F16"}


def write(tmp_path: Path, text: str, name: str = "recipe.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def faults_of(tmp_path: Path, text: str) -> list[tuple[int, str, str]]:
    _, faults = read_recipe(write(tmp_path, text))
    return [(f.line, f.message, f.hint) for f in faults]


def single_fault(tmp_path: Path, text: str) -> tuple[int, str, str]:
    faults = faults_of(tmp_path, text)
    assert len(faults) == 1, faults
    return faults[0]


def rule_of(tmp_path: Path, body: str):
    recipe = load_recipe(write(tmp_path, f'version = 1\n[[rule]]\nmatch = "*"\n{body}'))
    assert len(recipe.rules) == 1
    return recipe.rules[0]


def test_the_issue_example_parses_into_its_three_rules(tmp_path: Path) -> None:
    path = write(tmp_path, ISSUE_EXAMPLE)
    recipe = load_recipe(path)
    assert recipe.path == path
    assert recipe.on_indivisible == "keep"
    assert recipe.sha256 == hashlib.sha256(ISSUE_EXAMPLE.encode()).hexdigest()
    norm, weight, mlp = recipe.rules
    assert (norm.match, norm.line, norm.keep, norm.scheme, norm.file) == ("*norm*", 4, True, None, str(path))
    assert (weight.match, weight.line, weight.keep, weight.transpose) == ("*.weight", 7, False, False)
    assert weight.scheme.to_serde() == {
        "value": "Q4S",
        "store": {"PackedU32": 0},
        "mode": "Symmetric",
        "tensor": "F32",
        "block": BLOCK32,
    }
    assert weight.calibration.value == "MinMax"
    assert weight.refusals == ()
    assert (mlp.match, mlp.line, mlp.preset) == (r"re:.*\.mlp\..*", 17, "fp4-b32")
    assert mlp.scheme.to_serde()["value"] == "E2M1"


def test_match_is_a_full_name_glob_or_a_full_regex(tmp_path: Path) -> None:
    norm, weight, mlp = load_recipe(write(tmp_path, ISSUE_EXAMPLE)).rules
    assert norm.matches("model.layers.0.input_layernorm.weight")
    assert weight.matches("lm_head.weight")
    assert not weight.matches("lm_head.weight_scale")
    assert not weight.matches("model.layers.0.mlp.up_proj.WEIGHT")  # globs are case-sensitive
    assert mlp.matches("model.layers.0.mlp.up_proj.weight")
    assert not mlp.matches("mlp.weight")  # needs a dot on both sides of "mlp"


def test_scheme_keys_default_to_packed_u32_symmetric_minmax_per_tensor_f32(tmp_path: Path) -> None:
    rule = rule_of(tmp_path, 'value = "Q8S"\n')
    assert rule.scheme.to_serde() == {
        "value": "Q8S",
        "store": {"PackedU32": 0},
        "mode": "Symmetric",
        "tensor": "F32",
        "block": None,
    }
    assert rule.calibration is None  # not said: the plan takes --calibration's, else MinMax
    recipe = load_recipe(write(tmp_path, 'version = 1\n[[rule]]\nmatch = "*"\nvalue = "Q8S"\n'))
    (entry,) = make_plan([TensorInfo("w", "F32", (4, 32), 512, Path("m.safetensors"))], recipe).entries
    assert entry.decision.calibration.value == "MinMax"


def test_names_are_accepted_in_any_case_and_reported_canonical(tmp_path: Path) -> None:
    rule = rule_of(
        tmp_path,
        'value = "q4s"\nstore = "packedu32"\nblock = 32\nblock_scale = "f16"\n'
        'calibration = "absmean"\nmode = "symmetric"\n',
    )
    assert rule.scheme.to_serde() == {
        "value": "Q4S",
        "store": {"PackedU32": 0},
        "mode": "Symmetric",
        "tensor": None,
        "block": BLOCK32,
    }
    assert rule.calibration.value == "AbsMean"
    assert rule_of(tmp_path, 'preset = "FP4-B32"\n').preset == "fp4-b32"


@pytest.mark.parametrize(
    ("store", "serde"),
    [("Native", "Native"), ("PackedNative", {"PackedNative": 0}), ("PackedU32", {"PackedU32": 0})],
)
def test_the_three_stores(tmp_path: Path, store: str, serde: object) -> None:
    rule = rule_of(tmp_path, f'value = "E2M1"\nstore = "{store}"\n')
    assert rule.scheme.to_serde()["store"] == serde


def test_a_scheme_burn_refuses_parses_with_its_refusals(tmp_path: Path) -> None:
    native_q4 = rule_of(tmp_path, 'value = "Q4S"\nstore = "Native"\n')
    assert any("sub-byte" in r.message for r in native_q4.refusals)
    outer = rule_of(tmp_path, 'value = "Q8S"\nstore = "PackedU32(2)"\n')
    assert outer.scheme.to_serde()["store"] == {"PackedU32": 2}
    assert any("outer axis" in r.message for r in outer.refusals)
    # PackedU32(1) is Burn 0.23's (the plan refuses it for another release: tests/plan/test_outer_packing.py)
    assert not rule_of(tmp_path, 'value = "Q8S"\nstore = "PackedU32(1)"\n').refusals


def test_mode_lookup_is_parsed_and_refused(tmp_path: Path) -> None:
    rule = rule_of(tmp_path, 'value = "Q4S"\nmode = "Lookup"\nblock = [32]\nblock_scale = "F16"\n')
    assert rule.mode == "Lookup"
    assert rule.scheme.to_serde()["mode"] == "Lookup"
    assert "lookup quantization does not travel as a QFloat tensor" in rule.refusals[0].message
    assert "Symmetric" in rule.refusals[0].hint and "keep = true" in rule.refusals[0].hint


def test_a_codebook_preset_is_a_lookup_refusal(tmp_path: Path) -> None:
    rule = rule_of(tmp_path, 'preset = "nf4"\n')
    assert rule.mode == "Lookup"
    assert rule.scheme is None
    assert "lookup quantization does not travel as a QFloat tensor" in rule.refusals[0].message


@pytest.mark.parametrize("name", ["q4_k", "Q4_K_M", "q2_k", "q5_k_s"])
def test_a_k_quant_with_mins_is_a_zero_point_refusal(tmp_path: Path, name: str) -> None:
    """Q2_K, Q4_K and Q5_K store a min per sub-block (llama.cpp's ggml-quants.c): a zero point, not a codebook."""
    rule = rule_of(tmp_path, f'preset = "{name}"\n')
    assert rule.mode == "Asymmetric" and rule.scheme is None
    (refusal,) = rule.refusals
    assert "has no zero point" in refusal.message and "Lookup" not in refusal.message
    assert "Symmetric" in refusal.hint


@pytest.mark.parametrize("name", ["q3_k", "q6_k"])
def test_a_symmetric_k_quant_is_refused_for_its_integer_scales(tmp_path: Path, name: str) -> None:
    rule = rule_of(tmp_path, f'preset = "{name}"\n')
    assert rule.mode == "Symmetric" and rule.scheme is None
    (refusal,) = rule.refusals
    assert "integer sub-block scales" in refusal.message and "Lookup" not in refusal.message


@pytest.mark.parametrize(
    "body",
    [
        'value = "Q4S"\nzero_point = 8\n',
        'value = "Q4S"\nasymmetric = true\n',
        'value = "Q4S"\nsymmetric = false\n',
        'value = "Q4S"\nmode = "Asymmetric"\n',
        'value = "Q4S"\nmode = "affine"\n',
        "zero_point = true\n",
        'preset = "q4_1"\n',
    ],
)
def test_zero_point_requests_are_refused(tmp_path: Path, body: str) -> None:
    rule = rule_of(tmp_path, body)
    assert rule.mode in ("Asymmetric", "Affine")
    assert "zero point" in rule.refusals[0].message
    assert "Q4S" in rule.refusals[0].hint and "keep = true" in rule.refusals[0].hint


def test_symmetric_true_is_no_request(tmp_path: Path) -> None:
    rule = rule_of(tmp_path, 'value = "Q8S"\nsymmetric = true\nasymmetric = false\n')
    assert (rule.mode, rule.refusals) == ("Symmetric", ())


def test_a_zero_point_request_suggests_a_symmetric_value_of_the_same_width(tmp_path: Path) -> None:
    assert "Q8S" in rule_of(tmp_path, 'value = "Q8F"\nasymmetric = true\n').refusals[0].hint


def test_keep_and_transpose(tmp_path: Path) -> None:
    rule = rule_of(tmp_path, "keep = true\ntranspose = true\n")
    assert (rule.keep, rule.transpose, rule.scheme) == (True, True, None)


def test_syntax_error_reports_tomls_line(tmp_path: Path) -> None:
    line, message, _ = single_fault(tmp_path, 'version = 1\n[[rule]]\nmatch = "*"\nkeep = yes\n')
    assert line == 4
    assert message.startswith("invalid TOML")
    assert "(at line" not in message


def test_unknown_key_suggests_the_known_one(tmp_path: Path) -> None:
    line, message, hint = single_fault(
        tmp_path,
        'version = 1\n\n[[rule]]\nmatch = "*"\nkeep = true\n\n[[rule]]\n# ints\nmatch = "x"\n'
        'valeu = "Q4S"\nvalue = "Q4S"\n',
    )
    assert line == 10
    assert message == "unknown key 'valeu' in rule 2"
    assert hint.startswith("did you mean 'value'?")


def test_unknown_top_level_key_suggests_rule(tmp_path: Path) -> None:
    line, message, hint = single_fault(tmp_path, 'version = 1\n[[rules]]\nmatch = "*"\nkeep = true\n')
    assert (line, message) == (2, "unknown key 'rules' in the recipe")
    assert "did you mean 'rule'?" in hint


@pytest.mark.parametrize(
    ("body", "line", "message", "hint"),
    [
        ('keep = "yes"\n', 4, "keep must be true or false, got a string 'yes'", "keep = true"),
        ('value = "Q4S"\ntranspose = 1\n', 5, "transpose must be true or false", "transpose = true"),
        ("value = 4\n", 4, "value must be a string, got an integer 4", "quotes"),
        ('value = "Q5S"\n', 4, "unknown value 'Q5S'", "Q4S"),
        (
            'value = "Q4S"\nblock = [32]\nblock_scale = "FP16"\n',
            6,
            "unknown block_scale 'FP16'",
            "did you mean 'F16'?",
        ),
        (
            'value = "Q4S"\ncalibration = "MinMaxx"\n',
            5,
            "unknown calibration 'MinMaxx'",
            "did you mean 'MinMax'?",
        ),
        ('value = "Q4S"\nstore = "PackedU64"\n', 5, "unknown store 'PackedU64'", "did you mean 'PackedU32'?"),
        ('value = "Q4S"\nmode = "Lookupp"\n', 5, "unknown mode 'Lookupp'", "did you mean 'Lookup'?"),
        ('preset = "q4s-b23"\n', 4, "unknown preset 'q4s-b23'", "did you mean 'q4s-b32'?"),
        ('value = "Q4S"\nblock = [32]\n', 5, "block needs block_scale", 'block_scale = "F16"'),
        ('value = "Q4S"\nblock_scale = "F16"\n', 5, "block_scale needs block", "block = [32]"),
        (
            'value = "Q4S"\nblock = [0]\nblock_scale = "F16"\n',
            5,
            "block extent 0 in [0] is not between 1 and 255",
            "u8",
        ),
        ('value = "Q4S"\nblock = [256]\nblock_scale = "F16"\n', 5, "block extent 256", "u8"),
        (
            'value = "Q4S"\nblock = [2, 2, 2, 2, 2, 2]\nblock_scale = "F16"\n',
            5,
            "a block has at most 5 axes",
            "trailing axes",
        ),
        (
            'value = "Q4S"\nblock = []\nblock_scale = "F16"\n',
            5,
            "block must be an integer or an array",
            "[32]",
        ),
        (
            'value = "Q4S"\nblock = ["32"]\nblock_scale = "F16"\n',
            5,
            "block must be an integer or an array",
            "[32]",
        ),
        ('keep = true\nvalue = "Q4S"\n', 5, "keep = true cannot be combined with value", "remove keep"),
        ('keep = true\npreset = "q8s"\n', 5, "keep = true cannot be combined with preset", "remove keep"),
        (
            'preset = "q8s"\nblock = [32]\nblock_scale = "F16"\n',
            5,
            "preset cannot be combined with block, block_scale",
            "either preset",
        ),
        ("transpose = true\n", 2, "the rule says neither keep = true, a preset, nor a value", "keep = true"),
        ('value = "Q4S"\nsymmetric = "no"\n', 5, "symmetric must be true or false", "symmetric"),
    ],
)
def test_rule_faults_name_their_line(tmp_path: Path, body: str, line: int, message: str, hint: str) -> None:
    found = single_fault(tmp_path, f'version = 1\n[[rule]]\nmatch = "*"\n{body}')
    assert found[0] == line
    assert message in found[1]
    assert hint in found[2]


def test_match_faults(tmp_path: Path) -> None:
    assert single_fault(tmp_path, "version = 1\n[[rule]]\nkeep = true\n")[:2] == (2, "the rule has no match")
    line, message, _ = single_fault(tmp_path, 'version = 1\n[[rule]]\nkeep = true\nmatch = "re:(("\n')
    assert line == 4
    assert message.startswith("invalid regular expression 're:(('")
    assert single_fault(tmp_path, 'version = 1\n[[rule]]\nmatch = ""\nkeep = true\n')[0] == 3


def test_version_is_required_and_must_be_1(tmp_path: Path) -> None:
    assert single_fault(tmp_path, '[[rule]]\nmatch = "*"\nkeep = true\n')[:2] == (
        1,
        "the recipe has no version",
    )
    line, message, hint = single_fault(tmp_path, "# qcli recipe\nversion = 2\n")
    assert (line, message) == (2, "unsupported recipe version 2")
    assert "version = 1" in hint


def test_defaults_on_indivisible(tmp_path: Path) -> None:
    recipe = load_recipe(write(tmp_path, 'version = 1\n[defaults]\non_indivisible = "error"\n'))
    assert (recipe.on_indivisible, recipe.rules) == ("error", [])
    assert load_recipe(write(tmp_path, "version = 1\n")).on_indivisible == "keep"
    line, message, _ = single_fault(tmp_path, 'version = 1\n[defaults]\n\non_indivisible = "skip"\n')
    assert line == 4 and 'on_indivisible must be "keep" or "error", got \'skip\'' in message
    line, message, hint = single_fault(tmp_path, 'version = 1\n[defaults]\non_indivisable = "keep"\n')
    assert (line, message) == (3, "unknown key 'on_indivisable' in [defaults]")
    assert "did you mean 'on_indivisible'?" in hint


def test_rule_must_be_an_array_of_tables(tmp_path: Path) -> None:
    line, message, hint = single_fault(tmp_path, 'version = 1\n[rule]\nmatch = "*"\nkeep = true\n')
    assert (line, message) == (2, "`rule` must be an array of tables")
    assert "[[rule]]" in hint


def test_inline_rules_are_read_too(tmp_path: Path) -> None:
    recipe = load_recipe(write(tmp_path, 'version = 1\nrule = [{ match = "*", keep = true }]\n'))
    assert recipe.rules[0].keep and recipe.rules[0].line == 2


def test_every_fault_is_collected_and_good_rules_survive(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'version = 1\n[[rule]]\nmatch = "a"\nvalue = "Q9S"\n[[rule]]\nmatch = "b"\nkeep = true\n'
        '[[rule]]\nmatch = "c"\nkep = true\n',
    )
    recipe, faults = read_recipe(path)
    assert [f.line for f in faults] == [4, 10]
    assert [r.match for r in recipe.rules] == ["b"]
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert info.value.message == f"{path}:4: unknown value 'Q9S'"
    assert "1 more problem: run qcli validate-scheme" in info.value.hint


def test_a_recipe_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "recipe.toml"
    path.write_bytes(b"version = 1\n# caf\xe9\n")
    _, faults = read_recipe(path)
    assert [(f.line, f.message) for f in faults] == [(2, "the recipe is not UTF-8 text")]


def test_a_missing_recipe_file_is_a_recipe_error(tmp_path: Path) -> None:
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path / "nope.toml")
    assert "cannot read recipe" in info.value.message
    assert info.value.hint


def test_keep_false_alone_asks_for_nothing(tmp_path: Path) -> None:
    line, message, _ = single_fault(tmp_path, 'version = 1\n[[rule]]\nmatch = "*"\nkeep = false\n')
    assert (line, message) == (2, "the rule says neither keep = true, a preset, nor a value")


def test_every_example_in_docs_recipes_parses_and_is_accepted() -> None:
    docs = (ROOT / "docs" / "recipes.md").read_text()
    examples = re.findall(r"```toml\n(.*?)```", docs, re.S)
    assert len(examples) >= 4
    for example in examples:
        recipe, faults = parse_recipe(example.encode(), "docs/recipes.md")
        assert faults == [], example
        assert recipe.rules and all(rule.refusals == () for rule in recipe.rules), example


VALUES = st.one_of(
    st.booleans(),
    st.integers(-300, 300),
    st.sampled_from(
        [
            "Q4S",
            "q8s",
            "E2M1",
            "Lookup",
            "Asymmetric",
            "PackedU32(1)",
            "Native",
            "F16",
            "UE8M0",
            "AbsMean",
            "nvfp4",
            "nf4",
            "q4_1",
            "",
            "re:((",
            "*",
        ]
    ),
    st.lists(st.integers(-2, 300), max_size=7),
)
FUZZ_MODEL = [
    TensorInfo(name, dtype, shape, math.prod(shape) * 2, Path("m.safetensors"))
    for name, dtype, shape in [
        ("a.weight", "BF16", (64, 96)),
        ("a.norm", "F16", (33,)),
        ("b.weight", "F16", (6, 20)),
        ("ids", "I16", (2, 32)),
        ("s", "BF16", ()),
    ]
]
RULES = st.lists(st.dictionaries(st.sampled_from(list(RULE_KEYS) + ["blok"]), VALUES, max_size=6), max_size=4)


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value + '"'
    return repr(value)


@settings(max_examples=300, deadline=None)
@given(RULES)
def test_any_rule_table_parses_into_rules_or_located_faults(rules: list[dict]) -> None:
    text = "version = 1\n" + "".join(
        "[[rule]]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in rule.items()) for rule in rules
    )
    recipe, faults = parse_recipe(text.encode(), "r.toml")
    lines = text.count("\n")
    assert all(1 <= f.line <= lines and f.message and f.hint for f in faults)
    for rule in recipe.rules:
        assert rule.keep or rule.scheme is not None or rule.refusals
    # Whatever parsed, the plan gives every tensor exactly one decision with a reason.
    plan = make_plan(FUZZ_MODEL, recipe)
    assert [e.info.name for e in plan.entries] == [i.name for i in FUZZ_MODEL]
    assert all(e.decision.reason and e.out_nbytes > 0 for e in plan.entries)


def test_cast_on_a_keep_rule_parses_in_any_case(tmp_path: Path) -> None:
    recipe = load_recipe(write(tmp_path, 'version = 1\n[[rule]]\nmatch = "*norm*"\nkeep = true\ncast = "bf16"\n'))
    (rule,) = recipe.rules
    assert (rule.keep, rule.cast, rule.number) == (True, "BF16", 1)
    assert recipe.cast_kept is None


def test_cast_needs_keep_and_a_known_dtype(tmp_path: Path) -> None:
    line, message, hint = single_fault(
        tmp_path, 'version = 1\n[[rule]]\nmatch = "*"\npreset = "q4s-b32"\ncast = "F32"\n'
    )
    assert (line, message) == (5, "cast needs keep = true: it sets the dtype a kept tensor is written in")
    assert "remove cast" in hint
    line, message, hint = single_fault(tmp_path, 'version = 1\n[[rule]]\nmatch = "*"\nkeep = true\ncast = "FP32"\n')
    assert (line, message) == (5, "unknown cast 'FP32'")
    assert hint.startswith("did you mean 'F32'? one of F32, F16, BF16")
    line, message, _ = single_fault(tmp_path, 'version = 1\n[[rule]]\nmatch = "*"\nkeep = true\ncast = 32\n')
    assert (line, message) == (5, "cast must be a string, got an integer 32")
    with pytest.raises(RecipeError) as raised:
        load_recipe(write(tmp_path, 'version = 1\n[[rule]]\nmatch = "*"\nvalue = "Q8S"\ncast = "F16"\n'))
    assert raised.value.exit_code == 2


def test_cast_kept_in_defaults(tmp_path: Path) -> None:
    recipe = load_recipe(write(tmp_path, 'version = 1\n[defaults]\ncast_kept = "F32"\n'))
    assert recipe.cast_kept == "F32"
    line, message, hint = single_fault(tmp_path, 'version = 1\n[defaults]\n\ncast_kept = "F8"\n')
    assert (line, message) == (4, "unknown cast_kept 'F8'")
    assert "one of F32, F16, BF16" in hint


def test_rules_know_their_number_in_the_recipe_even_after_a_faulty_one(tmp_path: Path) -> None:
    recipe, faults = read_recipe(write(
        tmp_path, 'version = 1\n[[rule]]\nmatch = "a"\nkep = true\n[[rule]]\nmatch = "b"\nkeep = true\n'
    ))
    assert len(faults) == 1
    assert [(r.match, r.number) for r in recipe.rules] == [("b", 2)]


# -- hostile recipes: linear-time scanning and matching ---------------------------------------------------
#
# Held by counts and by RE2's guarantee, or as refusals that end (tests/hang_support.py); bench/hostile.py
# times them.


def long_lines(length: int) -> tuple[str, ...]:
    """Lines with runs of `length` spaces where a table header's parts would overlap."""
    spaces = " " * length
    return ('["' + spaces + '!"]', "[" + spaces, "[[" + spaces + "x]] # " + " " * 1000, spaces + "= 1",
            "version" + spaces + "x")


def with_rules(count: int) -> bytes:
    return ("version = 1\n" + "[[rule]]\nmatch = 'x'\nkeep = true\n" * count).encode()


def qcli_lines_run(fn, *args) -> int:  # type: ignore[no-untyped-def]
    """How many lines of qcli's own source `fn(*args)` runs: a count of its steps that no load on the machine
    changes (the standard library's steps, tomllib's among them, are not counted)."""
    import sys

    import qcli

    folder = str(Path(qcli.__file__).parent)
    count = 0

    def local(frame, event, arg):  # type: ignore[no-untyped-def]
        nonlocal count
        count += event == "line"
        return local

    previous = sys.gettrace()
    sys.settrace(lambda frame, event, arg: local if frame.f_code.co_filename.startswith(folder) else None)
    try:
        fn(*args)
    finally:
        sys.settrace(previous)
    return count


def test_the_line_scanner_ends_on_a_1_mb_line() -> None:
    """`RecipeLines` found headers with a regex that backtracked over runs of spaces, in time cubic in the line
    (about 30 s on a 100 kB line): on a 1 MB line that is days, which the child's limit turns into a failure.
    In a child process, since a backtracking regex holds the interpreter inside C, where no alarm reaches."""
    ends("""
from qcli.recipe import RecipeLines
from tests.plan.test_recipe import long_lines
for line in long_lines(1_000_000):
    lines = RecipeLines(f"version = 1\\n{line}\\n[[rule]]\\nmatch = 'x'\\n")
    assert ("rule", 3) in lines.headers, line[:10]
    assert lines.key("match", lines.table("rule")) == 4, line[:10]
""")


def test_header_scanner_agrees_with_the_old_regex() -> None:
    from qcli.recipe import _header_name

    old = re.compile(r"^\s*\[\[?\s*([\w.\-\"' ]+?)\s*\]\]?\s*(?:#.*)?$")
    for line in ("[rule]", "[[rule]]", "  [ defaults ]  # x", "[[rule]] x", "[a.b-c]", "['q']", "[]", "[[rule]",
                 "[rule]]", "x = [1]", "[a\tb]", "[é]", "[[ rule ]]#", "[a]]]"):
        match = old.match(line)
        assert _header_name(line) == (match.group(1).strip("\"'") if match else None), line


def test_reading_a_recipe_is_linear_in_its_rule_count() -> None:
    """Finding each rule's lines once searched from the top of the text, quadratic in the rules (minutes
    for 20,000): twice the rules must take twice qcli's steps, not four times."""
    small, large = (qcli_lines_run(parse_recipe, with_rules(count)) for count in (1000, 2000))
    assert large < 2.2 * small, (small, large)
    recipe, faults = parse_recipe(with_rules(20_000))
    assert not faults and len(recipe.rules) == 20_000 and recipe.rules[-1].line == 1 + 3 * 19_999 + 1


def test_a_byte_order_mark_is_not_part_of_the_recipe() -> None:
    plain = b'version = 1\n[[rule]]\nmatch = "*"\nkeep = true\n'
    recipe, faults = parse_recipe(b"\xef\xbb\xbf" + plain)
    assert not faults and recipe.rules == parse_recipe(plain)[0].rules
    assert recipe.sha256 == hashlib.sha256(b"\xef\xbb\xbf" + plain).hexdigest()  # of the file as it is


HOSTILE_RECIPES = [
    ("version = 1\nx = " + "[" * 100_000 + "]" * 100_000 + "\n", 2, "nested too deeply"),
    ("version = 1\nx = " + "{a = " * 5000 + "1" + "}" * 5000 + "\n", 2, "nested too deeply"),
    ("version = 1\n[[rule]]\nmatch = 'x'\nblock = [" + "1" * 5000 + "]\n", 4, "more than 4300 digits"),
    ("version = 1\n[[rule]]\nmatch = 'x'\nvalue = 'Q4S'\nstore = 'PackedU32(" + "9" * 5000 + ")'\n", 5,
     "unknown store"),
    ("version = 1\n[[rule]]\nmatch = 'x'\nvalue = 'Q4S'\nstore = 'Native" + " " * 100_000 + "x'\n", 5,
     "unknown store"),
    ("version = 1\n[[rule]]\nmatch = " + "[" * 200 + "]" * 200 + "\nkeep = true\n", 3, "match must be"),
    # what RE2 refuses, in its own words (qcli.patterns)
    ("version = 1\n[[rule]]\nmatch = 're:(a{100}){100}'\nkeep = true\n", 3, "invalid repetition size"),
    ("version = 1\n[[rule]]\nmatch = 're:(a)\\1'\nkeep = true\n", 3, "invalid escape sequence: \\1"),
    ("version = 1\n[[rule]]\nmatch = 're:(?<=x)a'\nkeep = true\n", 3, "invalid perl operator: (?<"),
    ("version = 1\n[[rule]]\nmatch = 're:a*+'\nkeep = true\n", 3, "bad repetition operator: *+"),
]


@pytest.mark.parametrize(("text", "line", "message"), HOSTILE_RECIPES)
def test_hostile_recipes_are_located_faults(text: str, line: int, message: str) -> None:
    with never_hangs():
        _, faults = parse_recipe(text.encode(), "r.toml")
    assert faults and faults[0].line == line and message in faults[0].message, faults
    assert len(faults[0].message) < 400 and "\n" not in faults[0].message


def test_control_characters_in_faults_are_escaped() -> None:
    _, faults = parse_recipe(b'version = 1\n[[rule]]\nmatch = "x"\n"\\u001b[31mblok" = 1\nkeep = true\n', "r\n.toml")
    assert faults and "\x1b" not in faults[0].message and "\\x1b[31mblok" in faults[0].message
    assert faults[0].file == "r\\n.toml"


# On tensor names (no newline; \d, \w and \s taken as ASCII classes) RE2 matches as Python's re.fullmatch
# does, and in time linear in the name.
REGEX_ATOMS = st.sampled_from(["a", "b", ".", "\\.", "[ab]", "[^a]", "\\d", "\\w", "\\W", "\\s", "\\b", "\\B", "^",
                               "$", "\\A", "(?i:A)", "x", "\\n", "(?s:.)", "_", "[a-z_]"])


def _regexes() -> st.SearchStrategy[str]:
    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.tuples(inner, inner).map("".join),
            st.tuples(inner, inner).map(lambda p: f"(?:{p[0]}|{p[1]})"),
            st.tuples(inner, st.sampled_from(["*", "+", "?", "*?", "{2}", "{0,2}", "{1,}", "{2,3}?"]))
            .map(lambda p: f"(?:{p[0]}){p[1]}"),
            inner.map(lambda p: f"({p})"),
        )

    return st.recursive(REGEX_ATOMS, extend, max_leaves=8)


@settings(max_examples=300, deadline=None, database=None)
@given(_regexes(), st.lists(st.text("ab.1x A_", min_size=1, max_size=7), min_size=1, max_size=8),
       st.sampled_from(["", "(?m)", "(?i)", "(?s)"]))
def test_the_linear_matcher_agrees_with_re_on_names(pattern: str, names: list[str], flags: str) -> None:
    pattern = flags + pattern
    matcher = regex_matcher(pattern)
    for name in names:
        assert matcher(name) == (re.fullmatch(pattern, name, re.ASCII) is not None), (pattern, name)


CATASTROPHIC_PATTERNS = [r"(a+)+$", r"(.*\.)*mlp\..*", r"(a|aa)*b", r"(\w+\s?)*$", r".*\.mlp\..*weight", r"(.*a){12}",
                         r"(?:a*)*b", r"(x+x+)+y", r"^(([a-z])+.)+[A-Z]([a-z])+$"]
CATASTROPHIC_NAMES = ["model.layers.10.mlp.down_proj.weight", "a" * 100_000 + "!", "model." * 20_000 + "x",
                      ".mlp." * 20_000, "x" * 100_000]
RE2_PROGRAM_LIMIT = 200  # instructions: RE2 takes at most that many steps a character of the name


@pytest.mark.parametrize("pattern", CATASTROPHIC_PATTERNS)
def test_catastrophic_patterns_run_in_linear_time(pattern: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exponential or quadratic for a backtracking engine on these names. RE2 matches in time linear in the
    name times its program's size, whatever the pattern: each is compiled by RE2, to a small program, and
    Python's backtracking `re` is never asked, to compile or to match."""
    import re2

    from qcli import patterns

    programs, compile_re2 = [], re2.compile

    def compiled(*args: object) -> object:
        programs.append(compile_re2(*args))
        return programs[-1]

    def backtracking(*_: object) -> None:
        raise AssertionError("Python's backtracking re was asked")

    regex_matcher.cache_clear()
    with monkeypatch.context() as patch:
        patch.setattr(patterns.re2, "compile", compiled)
        for name in ("compile", "match", "fullmatch", "search", "finditer", "findall"):
            patch.setattr(re, name, backtracking)
        matcher = regex_matcher(pattern)
        found = [matcher(name) for name in CATASTROPHIC_NAMES]
    regex_matcher.cache_clear()
    assert len(programs) == 1 and programs[0].programsize < RE2_PROGRAM_LIMIT, [p.programsize for p in programs]
    assert found[0] == bool(re.fullmatch(pattern, CATASTROPHIC_NAMES[0]))


def test_a_pattern_nested_past_pythons_recursion_limit_is_matched():
    matcher = regex_matcher("(" * 5000 + "a" + ")" * 5000)  # Python's re raises RecursionError on it
    assert matcher("a") and not matcher("aa") and not matcher("b")
