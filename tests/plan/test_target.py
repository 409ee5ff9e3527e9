"""`qcli.plan.target` and `qcli.sensitivity`: the forms a target chooses among, the greedy allocation under a
budget, and the importance-weighted loss that orders it."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from qcli.burn_backends import BurnBackend, load_problem
from qcli.errors import UsageError
from qcli.io.readers import open_source
from qcli.plan.decisions import plan_by_name
from qcli.plan.options import PlanOptions, Target
from qcli.plan.target import allocate, budget, exact_names, forms, free_tensors, recipe_text
from qcli.recipe import parse_recipe
from qcli.sensitivity import measure_losses


@pytest.mark.parametrize("backend", [BurnBackend.flex, BurnBackend.wgpu, BurnBackend.ndarray, None])
def test_the_forms_are_two_to_eight_bits_the_backend_computes_with(backend):
    chosen = forms(backend, "0.22.1", None)
    assert chosen
    for preset in chosen:
        assert 2 <= preset.scheme.value.size_bits() <= 8
        assert load_problem(backend or BurnBackend.flex, preset.scheme, (), "0.22.1") is None
    names = {p.name for p in chosen}
    if backend is BurnBackend.ndarray:
        assert names == {"q8s", "q8s-native", "q8s-b32"}
    if backend is BurnBackend.wgpu:
        assert "q4f-b32-global" in names and "q4s-b32" not in names and "q2s-b32" not in names
    if backend in (BurnBackend.flex, None):
        assert {"q2s-b32", "q4s-b32"} <= names and "q4f-b32-global" not in names


def test_a_target_parses_one_budget_and_refuses_both_or_nonsense():
    assert Target.parse("4.5", None).bpw == 4.5
    assert Target.parse(None, "2MiB").size == 2 * 1024**2
    for bad in ("0", "-1", "nan", "x"):
        with pytest.raises(UsageError, match="--target-bpw"):
            Target.parse(bad, None)
    with pytest.raises(UsageError, match="cannot be used together"):
        Target.parse(4, "1MB")
    with pytest.raises(UsageError, match="--scheme and --target-bpw"):
        PlanOptions.parse(scheme="q4s-b32", target_bpw=5)


def _model(tmp_path, tensors):
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path))
    return path


def _choices(path, options=PlanOptions(), importance=None):
    source = open_source(path)
    plan = plan_by_name(source.infos(), None, options)
    choices = free_tensors(plan, forms(options.backend, options.burn_version, options.calibration),
                           options.backend, options.burn_version)
    measure_losses(choices, source, importance)
    return plan, choices


def test_channels_of_larger_importance_get_more_bits_than_the_same_weights_with_less(tmp_path):
    torch.manual_seed(0)
    w = torch.randn(64, 256)
    path = _model(tmp_path, {"a.layers.0.loud.weight": w.clone(), "a.layers.0.quiet.weight": w.clone()})
    importance = {"a.layers.0.loud.weight": torch.full((256,), 100.0, dtype=torch.float64),
                  "a.layers.0.quiet.weight": torch.full((256,), 0.01, dtype=torch.float64)}
    plan, choices = _choices(path, importance=importance)
    loud, quiet = sorted(choices, key=lambda c: c.name)
    assert loud.losses == pytest.approx([x * 1e4 for x in quiet.losses], rel=1e-4)
    target = Target(bpw=5.5, given="--target-bpw 5.5")  # room for one at 8.5 bits beside one at 2.5
    allocate(choices, budget(target, plan, choices), target, "flex")
    assert loud.nbytes[loud.chosen] > quiet.nbytes[quiet.chosen]
    assert loud.preset.scheme.value.size_bits() == 8 and quiet.preset.scheme.value.size_bits() == 2


def test_without_importance_the_loss_is_the_squared_error_and_falls_with_the_bits(tmp_path):
    torch.manual_seed(1)
    path = _model(tmp_path, {"m.weight": torch.randn(32, 128)})
    _, [choice] = _choices(path)
    by_name = dict(zip((p.name for p in choice.forms), choice.losses, strict=True))
    assert by_name["q2s-b32"] > by_name["q4s-b128"] > by_name["q4s-b32"] > by_name["q8s-b32"] > 0
    assert choice.nbytes == sorted(choice.nbytes)


@pytest.mark.parametrize("bpw", [2.5, 3.0, 4.4, 5.0, 6.3, 8.0, 9.0])
def test_the_allocation_spends_the_budget_and_never_more(tmp_path, bpw):
    torch.manual_seed(2)
    path = _model(tmp_path, {f"l.layers.{i}.p.weight": torch.randn(64, 256) * (i + 1) for i in range(12)})
    plan, choices = _choices(path)
    target = Target(bpw=bpw, given=f"--target-bpw {bpw}")
    allocate(choices, budget(target, plan, choices), target, "flex")
    bits = 8 * sum(c.nbytes[c.chosen] for c in choices)
    achieved = bits / sum(c.entry.numel for c in choices)
    assert achieved <= bpw
    assert achieved >= min(bpw, 8.5) - 0.3  # a step of one tensor of 12 is at most 6 / 12 bits
    if bpw >= 8.5:
        assert {c.preset.name for c in choices} == {"q8s-b32"}


def test_a_target_below_the_smallest_forms_is_refused_with_the_least_it_takes(tmp_path):
    path = _model(tmp_path, {"m.weight": torch.randn(32, 128)})
    plan, choices = _choices(path)
    target = Target(bpw=2.0, given="--target-bpw 2")
    with pytest.raises(UsageError, match=r"--target-bpw 2 is below the 2\.500 bits per weight") as caught:
        allocate(choices, budget(target, plan, choices), target, "flex")
    assert "--target-bpw 2.5" in caught.value.hint


def test_the_recipe_matches_each_name_exactly_and_reads_back(tmp_path):
    names = ["a.b[0].weight", "a.*.weight", "x.y.weight"]
    assert exact_names(names[:1]) == "a.b[[]0].weight"
    torch.manual_seed(3)
    path = _model(tmp_path, {n: torch.randn(32, 128) for n in names})
    plan, choices = _choices(path)
    target = Target(bpw=4.0, given="--target-bpw 4")
    allocate(choices, budget(target, plan, choices), target, "flex")
    recipe, faults = parse_recipe(recipe_text(choices, target, 4.0, None).encode())
    assert not faults
    for choice in choices:
        matching = [r for r in recipe.rules if r.matches(choice.name)]
        assert len(matching) == 1 and matching[0].preset == choice.preset.name
    assert not any(r.matches("a.x.weight") or r.matches("a.b0.weight") for r in recipe.rules)
