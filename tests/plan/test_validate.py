"""validate-scheme: every problem of a recipe, alone and against a model, each with its file and line."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from qcli.commands.validate_scheme import recipe_problems
from qcli.errors import RecipeError
from qcli.io.source import TensorInfo
from tests.plan.test_plan import own_problems

MODEL = [
    TensorInfo(name, "BF16", shape, math.prod(shape) * 2, Path("model.safetensors"))
    for name, shape in [
        ("model.embed_tokens.weight", (1000, 128)),
        ("model.layers.0.self_attn.q_proj.weight", (128, 128)),
        ("model.layers.0.mlp.down_proj.weight", (128, 352)),
        ("model.layers.0.input_layernorm.weight", (128,)),
        ("model.odd.weight", (4, 36)),
        ("lm_head.weight", (1000, 128)),
    ]
]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.toml"
    path.write_text(text)
    return path


def summary(problems) -> list[tuple[str, str, int | None]]:
    return [(p.severity, p.kind, p.line) for p in problems]


def test_a_good_recipe_has_no_problems(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'version = 1\n[[rule]]\nmatch = "*norm*"\nkeep = true\n[[rule]]\nmatch = "*"\npreset = "q4s-b32"\n',
    )
    assert recipe_problems(path) == []
    assert own_problems(recipe_problems(path, MODEL)) == []  # model.odd.weight is kept: on_indivisible defaults to keep


def test_every_fault_is_reported_at_once_with_its_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "version = 1\n"
        '[[rule]]\nmatch = "*norm*"\nkep = true\n'  # 2, 4: unknown key
        '[[rule]]\nmatch = "*proj*"\nvalue = "Q4S"\nmode = "Lookup"\n'  # 5: a Lookup refusal
        '[[rule]]\nmatch = "lm_head*"\nvalue = "Q4S"\nblock = [32]\n'  # 9, 12: block without block_scale
        '[[rule]]\nmatch = "*embed*"\nvalue = "Q4S"\nblock = [32]\nblock_scale = "UE8M0"\n'  # 13: refused,
        'tensor_scale = "F32"\n',  # a two-level scheme needs block scales no wider than f16
    )
    problems = recipe_problems(path)
    assert summary(problems) == [
        ("error", "recipe", 4),
        ("error", "recipe", 12),
        ("error", "lookup", 5),
        ("error", "scheme", 13),
    ]
    assert all(p.file == str(path) for p in problems)
    assert problems[0].message == "unknown key 'kep' in rule 1"
    assert "did you mean 'keep'?" in problems[0].hint
    assert "lookup quantization does not travel as a QFloat tensor" in problems[2].message
    assert "would have covered" not in problems[2].message  # no model: no tensors to name
    assert "UE8M0" in problems[3].message


def test_a_syntax_error_is_one_problem_at_tomls_line(tmp_path: Path) -> None:
    problems = recipe_problems(write(tmp_path, 'version = 1\n[[rule]]\nmatch = "*\n'))
    assert summary(problems) == [("error", "recipe", 3)]
    assert problems[0].message.startswith("invalid TOML")


def test_with_a_model_unmatched_rules_are_errors_and_uncovered_tensors_warnings(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'version = 1\n[defaults]\non_indivisible = "error"\n'
        '[[rule]]\nmatch = "*.bias"\nkeep = true\n'  # 4: matches nothing
        '[[rule]]\nmatch = "model.*.weight"\npreset = "q4s-b32"\n',  # 7: model.odd.weight [4, 36] cannot
    )
    problems = own_problems(recipe_problems(path, MODEL))
    assert summary(problems) == [
        ("error", "shape", 7),
        ("error", "unmatched-rule", 4),
        ("warning", "uncovered", None),
    ]
    shape, unmatched, uncovered = problems
    assert shape.tensors == ("model.odd.weight",)
    assert "last dim 36 is not a multiple of 32 (block [32])" in shape.message
    assert "matches no tensor" in unmatched.message
    assert uncovered.tensors == ("lm_head.weight",)
    assert uncovered.file == str(path)
    assert "no rule covers 1 tensor (lm_head.weight)" in uncovered.message


def test_with_a_model_a_lookup_refusal_names_the_tensors(tmp_path: Path) -> None:
    path = write(tmp_path, 'version = 1\n[[rule]]\nmatch = "*"\npreset = "nf4"\n')
    (problem,) = recipe_problems(path, MODEL)
    assert (problem.kind, problem.line, len(problem.tensors)) == ("lookup", 2, 6)
    assert "it would have covered 6 tensors (model.embed_tokens.weight, " in problem.message


def test_an_unreadable_recipe_is_raised(tmp_path: Path) -> None:
    with pytest.raises(RecipeError):
        recipe_problems(tmp_path / "missing.toml")


def test_with_a_model_a_rule_that_quantizes_nothing_is_an_error_naming_why(tmp_path: Path) -> None:
    path = write(tmp_path, 'version = 1\n[[rule]]\nmatch = "model.odd.*"\npreset = "q4s-b32"\n')
    problems = recipe_problems(path, MODEL)
    assert summary(problems)[0] == ("error", "unquantized-rule", 2)
    assert problems[0].file == str(path)
    assert problems[0].message == (
        "rule (match 'model.odd.*') matches 1 tensor (model.odd.weight) but quantizes none of them with "
        "preset q4s-b32: model.odd.weight [4, 36]: last dim 36 is not a multiple of 32 (block [32])"
    )


def test_with_a_model_a_shadowed_rule_says_which_rule_takes_its_tensors(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'version = 1\n[[rule]]\nmatch = "*"\npreset = "q4s-b32"\n'
        '[[rule]]\nmatch = "*norm*"\nkeep = true\n'
        '[[rule]]\nmatch = "*.bias"\nkeep = true\n',
    )
    shadowed, unmatched = own_problems(recipe_problems(path, MODEL))
    assert summary([shadowed, unmatched]) == [("error", "unmatched-rule", 5), ("error", "unmatched-rule", 8)]
    assert f"is shadowed by rule 1 ({path}:2)" in shadowed.message
    assert "matches no tensor" not in shadowed.message
    assert unmatched.message == "rule (match '*.bias') matches no tensor"


def test_with_a_model_a_plan_that_quantizes_nothing_is_a_warning(tmp_path: Path) -> None:
    path = write(tmp_path, 'version = 1\n[[rule]]\nmatch = "*"\nkeep = true\n')
    (problem,) = recipe_problems(path, MODEL)
    assert (problem.severity, problem.kind) == ("warning", "nothing-quantized")
    assert problem.message.startswith("nothing is quantized: all 6 tensors (")
