"""`qcli validate-scheme` through the real entry point: the three formats, exit codes, --model."""

from __future__ import annotations

import re

import pytest

from qcli.problem import Kind, Severity
from qcli.scheme import QuantValue, ScaleDtype
from tests.cli_support import ROOT, SCHEMA, SINGLE, assert_user_error, cli, validate_json

GOOD = """version = 1

[[rule]]
match = "*norm*"
keep = true

[[rule]]
match = "re:.*\\\\.mlp\\\\..*"
preset = "fp4-b32"

[[rule]]
match = "*"
value = "Q4S"
block = [32]
block_scale = "F16"
"""

LOOKUP = """version = 1

[[rule]]
match = "*.mlp.*"
value = "Q4S"
mode = "Lookup"
block = [32]
block_scale = "F16"

[[rule]]
match = "*.vision.*"
keep = true
"""
LOOKUP_RULE_LINES = range(3, 9)  # the first [[rule]] table
VISION_RULE_LINES = range(10, 12)

TYPO = """version = 1
[[rule]]
match = "*"
valu = "Q4S"
"""


@pytest.fixture
def recipe(tmp_path):
    def write(text: str, name: str = "recipe.toml"):
        path = tmp_path / name
        path.write_text(text)
        return path

    return write


def test_a_good_recipe_passes_in_every_format(recipe):
    path = recipe(GOOD)
    text = cli("validate-scheme", path)
    assert text.code == 0 and text.out.strip() == f"{path}: no problems"
    doc = cli("validate-scheme", path, "--format", "json")
    assert doc.code == 0
    validate_json(doc.json)
    assert doc.json["ok"] and doc.json["problems"] == []
    assert cli("validate-scheme", path, "--json").json == doc.json
    github = cli("validate-scheme", path, "--format", "github")
    assert github.code == 0 and "::error" not in github.out and "::warning" not in github.out


def test_lookup_rule_fails_in_every_format(recipe):
    path = recipe(LOOKUP)
    text = cli("validate-scheme", path)
    assert text.code == 1
    first = text.out.splitlines()[0]
    match = re.match(rf"{re.escape(str(path))}:(\d+): error: .*Lookup", first)
    assert match and int(match.group(1)) in LOOKUP_RULE_LINES, first
    assert "lookup quantization does not travel as a QFloat tensor" in first
    assert "  hint: " in text.out and "1 error(s)" in text.out

    doc = cli("validate-scheme", path, "--format", "json")
    assert doc.code == 1
    validate_json(doc.json)
    assert not doc.json["ok"] and doc.json["errors"] == 1
    (problem,) = doc.json["problems"]
    assert problem["kind"] == "lookup" and problem["line"] in LOOKUP_RULE_LINES

    github = cli("validate-scheme", path, "--format", "github")
    assert github.code == 1
    annotation = github.out.splitlines()[0]
    found = re.match(rf"::error file={re.escape(str(path))},line=(\d+),title=qcli lookup::(.*)$", annotation)
    assert found and int(found.group(1)) in LOOKUP_RULE_LINES, annotation
    assert "lookup quantization does not travel as a QFloat tensor" in found.group(2)


def test_with_a_model_every_unmatched_rule_and_uncovered_tensor_is_reported(recipe):
    path = recipe(LOOKUP)
    doc = cli("validate-scheme", path, "--model", SINGLE, "--json")
    assert doc.code == 1
    validate_json(doc.json)
    kinds = {p["kind"]: p for p in doc.json["problems"]}
    assert len(kinds["lookup"]["tensors"]) == 6  # gate, up, down of two layers
    unmatched = kinds["unmatched-rule"]
    assert unmatched["severity"] == "error" and unmatched["line"] in VISION_RULE_LINES
    assert kinds["uncovered"]["severity"] == "warning" and len(kinds["uncovered"]["tensors"]) == 15
    assert kinds["backend"]["severity"] == "warning" and "wgpu" in kinds["backend"]["message"]  # the 4-bit default
    github = cli("validate-scheme", path, "--model", SINGLE, "--format", "github").out
    assert github.count("::error ") == 2 and github.count("::warning ") == 2
    assert cli("validate-scheme", recipe(GOOD, "good.toml"), "--model", SINGLE).code == 0


def test_values_report_tensors_whose_scales_leave_the_scale_dtype_range(recipe, tmp_path):
    """Headers alone cannot see it (no problem without --values); with it, values near 1e-9 under F16 block
    scales (which need scales near 1e-10, below F16's smallest) are an error, and BF16 scales hold them."""
    import torch
    from safetensors.torch import save_file

    model = tmp_path / "tiny.safetensors"
    g = torch.Generator().manual_seed(2)
    save_file({"tiny.weight": torch.randn(64, 64, generator=g) * 1e-9,
               "fine.weight": torch.randn(64, 64, generator=g)}, str(model))
    f16 = recipe('version = 1\n[[rule]]\nmatch = "*"\npreset = "q4s-b32"\n')
    assert cli("validate-scheme", f16, "--model", model).code == 0
    # on flex, where Q4S blocks compute (the default warnings name wgpu's failure to compute them)
    doc = cli("validate-scheme", f16, "--model", model, "--values", "--burn-backend", "flex", "--json")
    assert doc.code == 1
    validate_json(doc.json)
    (problem,) = doc.json["problems"]
    assert (problem["kind"], problem["severity"], problem["tensors"]) == ("scale-range", "error", ["tiny.weight"])
    assert "128 of 128 blocks need a scale below F16's smallest" in problem["message"]
    assert "SQNR 0.0 dB" in problem["message"] and "BF16" in problem["hint"]
    bf16 = recipe('version = 1\n[[rule]]\nmatch = "*"\nvalue = "Q4S"\nblock = [32]\nblock_scale = "BF16"\n',
                  "bf16.toml")
    assert cli("validate-scheme", bf16, "--model", model, "--values").code == 0
    assert cli("validate-scheme", recipe(GOOD, "good.toml"), "--model", SINGLE, "--values").code == 0
    lines = assert_user_error(cli("validate-scheme", f16, "--values"), 2)
    assert "--values needs --model" in lines[0]


def test_recipe_errors_are_problems_with_their_line(recipe):
    path = recipe(TYPO)
    text = cli("validate-scheme", path)
    assert text.code == 1
    assert f"{path}:4: error:" in text.out and "did you mean 'value'" in text.out
    github = cli("validate-scheme", path, "--format", "github").out
    assert github.startswith(f"::error file={path},line=4,")


def test_github_annotations_escape_newlines_and_commas():
    from qcli.cli.validate_scheme import _escape_data, _escape_property

    assert _escape_data("a\nb%c") == "a%0Ab%25c"
    assert _escape_property("a,b:c") == "a%2Cb%3Ac"


def test_missing_recipe_is_a_usage_error(tmp_path):
    lines = assert_user_error(cli("validate-scheme", tmp_path / "none.toml"), 2)
    assert "none.toml" in lines[0]


def test_json_conflicts_with_another_format(recipe):
    assert cli("validate-scheme", recipe(GOOD), "--json", "--format", "github").code == 2
    assert cli("validate-scheme", recipe(GOOD), "--format", "yaml").code == 2


def test_several_recipes_are_checked_together(recipe):
    """As a pre-commit hook passes them: every recipe's problems, exit 1 if any has an error."""
    good, bad = recipe(GOOD, "good.toml"), recipe(LOOKUP, "bad.toml")
    assert cli("validate-scheme", good, good).code == 0
    doc = cli("validate-scheme", good, bad, "--json")
    assert doc.code == 1
    validate_json(doc.json)
    assert doc.json["recipes"] == [str(good), str(bad)]
    assert {p["file"] for p in doc.json["problems"]} == {str(bad)}


def test_scheme_sets_the_preset_for_uncovered_tensors(recipe):
    path = recipe(LOOKUP)
    doc = cli("validate-scheme", path, "--model", SINGLE, "--scheme", "q8s-b32", "--json").json
    (uncovered,) = [p for p in doc["problems"] if p["kind"] == "uncovered"]
    assert "q8s-b32" in uncovered["message"]
    assert cli("validate-scheme", path, "--scheme", "q4s-b33").code == 2


SHADOWED = """version = 1

[[rule]]
match = "*"
preset = "q4s-b32"

[[rule]]
match = "*norm*"
keep = true
"""


def test_a_shadowed_rule_is_an_error_naming_the_rule_that_shadows_it(recipe):
    path = recipe(SHADOWED)
    text = cli("validate-scheme", path, "--model", SINGLE)
    assert text.code == 1
    line = next(row for row in text.out.splitlines() if "shadowed" in row)
    assert line.startswith(f"{path}:7: error: rule (match '*norm*') is shadowed by rule 1 ({path}:3): ")
    assert "matches no tensor" not in text.out


def test_a_plan_that_quantizes_nothing_is_a_warning_with_a_model(recipe):
    doc = cli("validate-scheme", recipe('version = 1\n[[rule]]\nmatch = "*"\nkeep = true\n'), "--model", SINGLE,
              "--json")
    assert doc.code == 0
    validate_json(doc.json)
    (problem,) = doc.json["problems"]
    assert (problem["kind"], problem["severity"]) == ("nothing-quantized", "warning")
    assert problem["message"].startswith("nothing is quantized: all 21 tensors")


def test_a_llama_cpp_scheme_name_is_a_usage_error_naming_the_preset(recipe):
    lines = assert_user_error(cli("validate-scheme", recipe(GOOD), "--model", SINGLE, "--scheme", "q8_0"), 2)
    assert lines[0] == "error: 'q8_0' is llama.cpp's name, not a qcli preset"
    assert lines[-1].startswith("hint: use q8s-b32: 8-bit, blocks of 32 with F16 scales, as Q8_0")


def test_the_json_schema_names_every_kind_and_severity_of_a_problem():
    problem = SCHEMA["$defs"]["problem"]["properties"]
    assert problem["kind"]["enum"] == list(Kind)
    assert problem["severity"]["enum"] == list(Severity)


def test_the_json_schema_names_every_value_and_scale_dtype():
    scheme = SCHEMA["$defs"]["scheme"]["properties"]
    assert scheme["value"]["enum"] == list(QuantValue)
    assert scheme["tensor"]["enum"] == [*ScaleDtype, None]
    assert scheme["block"]["oneOf"][1]["properties"]["dtype"]["enum"] == list(ScaleDtype)


def test_docs_recipes_names_every_value_and_scale_dtype():
    docs = (ROOT / "docs" / "recipes.md").read_text()
    for key, members in (("value", QuantValue), ("block_scale", ScaleDtype)):
        row = re.search(rf"^\| `{key}` \|.*$", docs, re.M).group()
        assert set(re.findall(r"`([A-Z0-9]+)`", row)) == set(members), key


def test_docs_recipes_describes_every_kind_of_problem():
    section = (ROOT / "docs" / "recipes.md").read_text().split("## Problem kinds")[1].split("\n## ")[0]
    assert re.findall(r"^\| `([a-z-]+)` \|", section, re.M) == list(Kind)
