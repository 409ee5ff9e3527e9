"""The plan: decisions, reasons, sizes and problems for a Llama-like checkpoint, worked out by hand."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from qcli.errors import PlanError
from qcli.io.source import TensorInfo
from qcli.plan.decisions import make_plan, shape_problem
from qcli.plan.entries import CHUNK_WORKING_BYTES, Decision
from qcli.plan.options import PlanOptions
from qcli.presets import PRESETS
from qcli.recipe import load_recipe
from qcli.scheme import Calibration, QuantScheme, QuantValue, ScaleDtype

ITEM = {"F32": 4, "BF16": 2, "F16": 2, "I64": 8, "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1}
SOURCE = Path("model.safetensors")

def own_problems(problems):
    """`problems` less the warning that wgpu on an NVIDIA GPU cannot run the default 4-bit preset, which
    every default plan carries (tests/io/test_burn_backends.py holds it to Burn)."""
    return [p for p in problems if not (p.kind == "backend" and p.severity == "warning" and "wgpu" in p.message)]



def info(name: str, dtype: str, shape: list[int]) -> TensorInfo:
    return TensorInfo(name, dtype, tuple(shape), math.prod(shape) * ITEM[dtype], SOURCE)


LAYER = "model.layers.0"
LLAMA = [
    info("model.embed_tokens.weight", "BF16", [32000, 4096]),
    info(f"{LAYER}.self_attn.q_proj.weight", "BF16", [4096, 4096]),
    info(f"{LAYER}.self_attn.k_proj.weight", "BF16", [1024, 4096]),
    info(f"{LAYER}.mlp.up_proj.weight", "BF16", [11008, 4096]),
    info(f"{LAYER}.mlp.down_proj.weight", "BF16", [4096, 11008]),
    info(f"{LAYER}.input_layernorm.weight", "BF16", [4096]),
    info("model.norm.weight", "BF16", [4096]),
    info("lm_head.weight", "BF16", [32000, 4096]),
    info("model.rotary.position_ids", "I64", [1, 2048]),
]
FP8 = [
    info("model.layers.1.mlp.gate_proj.weight", "F8_E4M3", [11008, 4096]),
    info("model.layers.1.mlp.gate_proj.weight_scale", "F32", [86, 32]),
    info("model.layers.1.mlp.gate_proj.input_scale", "F32", []),
    info("model.layers.1.self_attn.o_proj.weight", "F8_E5M2", [4096, 4096]),
    info("model.layers.1.self_attn.o_proj.weight_scale_inv", "F32", [32, 64]),  # not 128x128 blocks
]
Q4S_B32 = {
    "value": "Q4S",
    "store": {"PackedU32": 0},
    "mode": "Symmetric",
    "tensor": None,
    "block": {"size": {"storage": [32, 1, 1, 1, 1], "len": 1}, "dtype": "F16"},
}


def recipe(tmp_path: Path, text: str):
    path = tmp_path / "recipe.toml"
    path.write_text("version = 1\n" + text)
    return load_recipe(path)


def by_name(plan) -> dict:
    return {e.info.name: e for e in plan.entries}


def test_default_policy_on_a_llama_checkpoint() -> None:
    plan = make_plan(LLAMA)
    assert [e.info.name for e in plan.entries] == [i.name for i in LLAMA]
    entries = by_name(plan)
    q = entries[f"{LAYER}.self_attn.q_proj.weight"]
    assert q.decision.scheme.to_serde() == Q4S_B32
    assert q.decision.reason == "default: BF16 tensor of rank 2 -> q4s-b32"
    assert q.out_dtype.to_serde() == {"QFloat": Q4S_B32}
    # The token embedding and the output head take 8 bits (q8s-b32) under a narrower preset.
    for name, role in (("model.embed_tokens.weight", "token embedding"), ("lm_head.weight", "output head")):
        assert entries[name].decision.scheme is PRESETS["q8s-b32"].scheme
        assert entries[name].decision.reason == f"default: {role}, 8 bits -> q8s-b32"
    norm = entries[f"{LAYER}.input_layernorm.weight"]
    assert norm.decision.scheme is None
    assert norm.decision.reason == "default: keep, 1-D tensor (norm/bias)"
    assert (norm.out_dtype, norm.out_nbytes, norm.bits_per_weight) == ("BF16", 8192, 16.0)
    ids = entries["model.rotary.position_ids"]
    assert (ids.decision.reason, ids.out_dtype) == ("default: keep, integer tensor (I64)", "I64")
    assert own_problems(plan.problems) == []
    (wgpu,) = [p for p in plan.problems if p not in own_problems(plan.problems)]
    assert "73728 bytes" in wgpu.message
    assert wgpu.hint == ('use --scheme q4f-b32-global, which wgpu loads, or keep 4 bits with tensor_scale = "F32" in a '
                         "recipe rule; --burn-backend flex|ndarray|wgpu checks only the one you load with")
    assert plan.preset is PRESETS["q4s-b32"]


@pytest.mark.parametrize("backend", ["flex", "ndarray", "wgpu"])
@pytest.mark.parametrize("preset", list(PRESETS))
def test_a_backend_hint_names_a_preset_that_backend_loads(preset, backend):
    """Whatever the preset a backend refuses, the hint's `--scheme NAME` is a preset, and planning with it
    leaves that backend nothing to refuse (the kept norms' dtype aside: their hint is cast, not a preset)."""
    from qcli.burn_backends import BurnBackend

    plan = make_plan(LLAMA, options=PlanOptions(preset=PRESETS[preset], backend=BurnBackend(backend)))
    named = {word for p in plan.problems if p.kind == "backend" and "--scheme" in p.hint
             for word in re.findall(r"--scheme (\S+?),", p.hint)}
    for other in named:
        assert other in PRESETS
        again = make_plan(LLAMA, options=PlanOptions(preset=PRESETS[other], backend=BurnBackend(backend)))
        assert not [p for p in again.problems if p.kind == "backend" and "cast" not in p.hint], (preset, other)


def test_quantized_sizes_worked_by_hand() -> None:
    entries = by_name(make_plan(LLAMA))
    q = entries[f"{LAYER}.self_attn.q_proj.weight"]
    # Q4S in u32 words: 4096 rows of 4096/8 words; one F16 scale per 32 values: 4096 * 128 scales.
    assert q.out_nbytes == 4096 * 512 * 4 + 4096 * 128 * 2 == 9_437_184
    assert q.bits_per_weight == 4.5
    assert q.out_shape == (4096, 4096)
    down = entries[f"{LAYER}.mlp.down_proj.weight"]
    assert down.out_nbytes == 4096 * (11008 // 8) * 4 + 4096 * (11008 // 32) * 2


def test_totals() -> None:
    plan = make_plan(LLAMA)
    totals = plan.totals()
    assert (totals.tensors, totals.quantized, totals.kept, totals.transposed) == (9, 6, 3, 0)
    assert totals.bytes_in == sum(i.nbytes for i in LLAMA)
    kept = 4096 * 2 * 2 + 2048 * 8
    wide = ("model.embed_tokens.weight", "lm_head.weight")  # 8.5 bits: q8s-b32
    quantized = sum(math.prod(i.shape) for i in LLAMA if len(i.shape) == 2 and i.dtype == "BF16"
                    and i.name not in wide) * 9 // 16
    assert totals.bytes_out == kept + quantized + 2 * 32000 * 4096 * 17 // 16
    assert totals.ratio == pytest.approx(totals.bytes_in / totals.bytes_out)
    # The largest tensor, embed_tokens: its BF16 source, its q8s-b32 payload, 24 bytes for each of its
    # blocks of 32, and one chunk's working set.
    numel = 32000 * 4096
    assert totals.peak_bytes == numel * 2 + numel * 17 // 16 + 24 * numel // 32 + CHUNK_WORKING_BYTES


def test_already_quantized_tensors_are_transcoded_or_kept_with_their_scale_companions() -> None:
    plan = make_plan(LLAMA + FP8)
    entries = by_name(plan)
    gate = "model.layers.1.mlp.gate_proj.weight"
    o_proj = "model.layers.1.self_attn.o_proj.weight"
    # E4M3 with 128x128 block scales: transcoded, its weight_scale consumed (tests/formats/test_fp8.py)
    assert entries[gate].decision.reason == (
        "default: transcode F8_E4M3 with block [128, 128] scales -> E4M3 PackedU32(0) block [128, 128] F32, exact")
    assert f"{gate}_scale" not in entries and plan.consumed() == {f"{gate}_scale"}
    assert entries["model.layers.1.mlp.gate_proj.input_scale"].decision.reason == (
        f"default: keep, scale of the already-quantized tensor {gate}")
    assert entries[o_proj].decision.reason == "default: keep, already quantized (F8_E5M2)"
    # A 2-D F32 scale_inv would take q4s-b32 by shape; it is kept because it belongs to o_proj.
    assert entries[f"{o_proj}_scale_inv"].decision.reason == (
        f"default: keep, scale of the already-quantized tensor {o_proj}"
    )
    # Burn has no F8 dtype: keeping one is an error, one per tensor, with what to do.
    errors = plan.errors()
    assert [(p.kind, p.tensors) for p in errors] == [("dtype", (o_proj,))]
    assert ("Burn has no F8_E5M2 dtype; nor transcoded: its scale model.layers.1.self_attn.o_proj.weight_scale_inv "
            "[32, 64] is neither per tensor") in errors[0].message
    assert "dequantize" in errors[0].hint


def test_int8_codes_beside_a_scale_are_refused_not_kept_as_integers() -> None:
    """Integer codes beside a float scale, with no declaration that says how they decode: kept as I8 they would
    load in Burn as integers where the model wants weights, so the plan refuses them (the declaration rule)."""
    plan = make_plan([info("w", "I8", [64, 64]), info("w_scale", "F32", [64, 2])])
    entries = by_name(plan)
    assert entries["w"].decision.reason == "refused: undeclared packed codes is not read by qcli"
    assert entries["w"].decision.scheme is None
    [error] = plan.errors()
    assert error.tensors == ("w", "w_scale")
    assert error.message.startswith("2 tensors (w, w_scale) are undeclared packed codes: integer codes beside")


def test_int8_alone_is_kept_as_already_quantized_and_burn_can_hold_it() -> None:
    plan = make_plan([info("w", "I8", [64, 64])])
    entries = by_name(plan)
    assert entries["w"].decision.reason == "default: keep, already quantized (I8)"
    assert entries["w"].out_dtype == "I8"
    assert [p.kind for p in plan.problems] == ["nothing-quantized"]  # a warning: the plan goes ahead


@pytest.mark.parametrize(
    ("preset", "shape", "why"),
    [
        # 33 is odd: no block of 16 or 8 divides it either (and 8 is the fewest 4-bit values a u32 word holds)
        ("q4s-b32", [10, 33], "last dim 33 is not a multiple of 32 (block [32])"),
        ("q4s-b128", [8, 36], "last dim 36 is not a multiple of 128 (block [128])"),
        ("q8s", [8, 6], "last dim 6 is not a multiple of 4 (PackedU32 holds 4 Q8S values per word)"),
        ("e4m3", [3, 3], "last dim 3 is not a multiple of 4 (PackedU32 holds 4 E4M3 values per word)"),
    ],
)
def test_default_policy_keeps_a_shape_that_cannot_take_the_preset(
    preset: str, shape: list[int], why: str
) -> None:
    plan = make_plan([info("w", "F32", shape)], options=PlanOptions(preset=PRESETS[preset]))
    assert plan.entries[0].decision.scheme is None
    assert plan.entries[0].decision.reason == f"default: keep, cannot take {preset}: {why}"
    assert [p.kind for p in plan.problems] == ["nothing-quantized"]


def test_native_q8_takes_any_last_dim() -> None:
    entry = make_plan([info("w", "F16", [3, 5])], options=PlanOptions(preset=PRESETS["q8s-native"])).entries[0]
    assert entry.decision.scheme is PRESETS["q8s-native"].scheme
    assert entry.out_nbytes == 15 + 4


@pytest.mark.parametrize(
    ("scheme", "shape", "why"),
    [
        (
            QuantScheme().with_value(QuantValue.Q8S).per_block([2, 16], ScaleDtype.F16),
            (32,),
            "block [2, 16] has 2 axes but the tensor has 1",
        ),
        (
            QuantScheme().with_value(QuantValue.Q8S).per_block([4, 32], ScaleDtype.F16),
            (6, 64),
            "dim 0 (size 6) is not a multiple of 4 (block [4, 32])",
        ),
        (
            QuantScheme.nvfp4().per_block([2], ScaleDtype.UE4M3),
            (4, 7),
            "last dim 7 is not a multiple of 2 (block [2])",
        ),
        (
            QuantScheme().with_value(QuantValue.E2M1).with_store(QuantScheme.nvfp4().store),
            (4, 7),
            "last dim 7 is odd (PackedNative stores E2M1 values in pairs)",
        ),
        (QuantScheme().with_value(QuantValue.Q8S), (), "a 0-D tensor (scalar) has no axis to quantize along"),
        (QuantScheme().with_value(QuantValue.Q8S), (4, 8), None),
    ],
)
def test_shape_problem(scheme: QuantScheme, shape: tuple[int, ...], why: str | None) -> None:
    assert shape_problem(scheme, shape) == why


def test_burns_10_gib_tensor_limit() -> None:
    huge = info("huge", "F32", [200_000, 65_536])  # 13.1e9 values: even Q8 is over 10 GiB
    assert "10 GiB" in shape_problem(PRESETS["q8s"].scheme, huge.shape)
    assert shape_problem(PRESETS["q4s-b32"].scheme, huge.shape) is None  # 7.4 GB fits
    plan = make_plan([huge], options=PlanOptions(preset=PRESETS["q8s"]))
    assert "exceeds Burn's 10 GiB per-tensor reader limit" in plan.entries[0].decision.reason
    assert [(p.kind, p.tensors) for p in plan.errors()] == [("size", ("huge",))]


def test_first_matching_rule_wins_and_the_rest_follow_the_default(tmp_path: Path) -> None:
    plan = make_plan(
        LLAMA,
        recipe(
            tmp_path,
            '[[rule]]\nmatch = "*norm*"\nkeep = true\n'
            '[[rule]]\nmatch = "re:.*\\\\.mlp\\\\..*"\npreset = "q8s"\n'
            '[[rule]]\nmatch = "*.weight"\nvalue = "Q4S"\nblock = [64]\nblock_scale = "F16"\n',
        ),
        PlanOptions(preset=PRESETS["q8s"]),
    )
    entries = by_name(plan)
    file = str(tmp_path / "recipe.toml")
    norm = entries[f"{LAYER}.input_layernorm.weight"].decision
    assert (norm.scheme, norm.reason, norm.rule.line) == (None, f"rule {file}:2: keep", 2)
    up = entries[f"{LAYER}.mlp.up_proj.weight"].decision
    assert (up.scheme, up.reason) == (PRESETS["q8s"].scheme, f"rule {file}:5 -> q8s")
    q = entries[f"{LAYER}.self_attn.q_proj.weight"].decision
    assert q.scheme.to_serde()["block"]["size"]["storage"] == [64, 1, 1, 1, 1]
    assert q.reason == f"rule {file}:8 -> Q4S PackedU32(0) block [64] F16"
    ids = entries["model.rotary.position_ids"].decision
    assert (ids.rule, ids.reason) == (None, "default: keep, integer tensor (I64)")
    assert own_problems(plan.problems) == []


def test_transpose_reverses_a_2d_shape_and_checks_the_scheme_on_it(tmp_path: Path) -> None:
    tensors = [info("a.weight", "F32", [64, 48]), info("b.weight", "BF16", [8, 32])]
    plan = make_plan(
        tensors,
        recipe(
            tmp_path,
            '[[rule]]\nmatch = "a.*"\nvalue = "Q8S"\nblock = [64]\nblock_scale = "F16"\ntranspose = true\n'
            '[[rule]]\nmatch = "b.*"\nkeep = true\ntranspose = true\n',
        ),
    )
    a, b = plan.entries
    # [64, 48] written as [48, 64]: 64 divides the new last dim (it would not divide 48).
    assert (a.decision.transpose, a.out_shape, a.decision.scheme is not None) == (True, (48, 64), True)
    assert a.out_nbytes == 48 * 64 + 48 * 2
    assert (b.decision.transpose, b.out_shape, b.out_dtype, b.out_nbytes) == (True, (32, 8), "BF16", 512)
    assert plan.totals().transposed == 2
    assert plan.problems == []


def test_transpose_of_a_tensor_that_is_not_2d_is_a_problem(tmp_path: Path) -> None:
    plan = make_plan(LLAMA, recipe(tmp_path, '[[rule]]\nmatch = "*"\npreset = "q4s-b32"\ntranspose = true\n'))
    (problem,) = plan.errors()
    assert problem.kind == "transpose"
    assert problem.tensors == (f"{LAYER}.input_layernorm.weight", "model.norm.weight")
    assert (problem.file, problem.line) == (str(tmp_path / "recipe.toml"), 2)
    assert "2 tensors" in problem.message and "needs a 2-D tensor" in problem.message


def test_on_indivisible_keep_keeps_with_the_reason(tmp_path: Path) -> None:
    plan = make_plan(
        [info("odd.weight", "F32", [10, 33]), info("ok.weight", "F32", [2, 32])],
        recipe(tmp_path, '[[rule]]\nmatch = "odd.*"\npreset = "q4s-b32"\n'),
    )
    assert plan.entries[0].decision.scheme is None
    assert plan.entries[0].decision.reason.endswith(
        "keep, cannot take the scheme: last dim 33 is not a multiple of 32 (block [32])"
    )
    # The rule quantizes none of the tensors it matches: a warning (see test_a_rule_that_quantizes_none...)
    assert [(p.kind, p.severity) for p in own_problems(plan.problems)] == [("unquantized-rule", "warning")]


def test_on_indivisible_error_reports_every_tensor(tmp_path: Path) -> None:
    plan = make_plan(
        [info("odd.weight", "F32", [10, 33]), info("ok.weight", "F32", [2, 32]), info("ids", "I64", [4, 32])],
        recipe(tmp_path, '[defaults]\non_indivisible = "error"\n[[rule]]\nmatch = "*"\npreset = "q4s-b32"\n'),
    )
    errors = plan.errors()
    assert [(p.kind, p.tensors, p.line) for p in errors] == [
        ("shape", ("odd.weight",), 4),
        ("shape", ("ids",), 4),
    ]
    assert "last dim 33 is not a multiple of 32 (block [32])" in errors[0].message
    assert "I64 is not a floating dtype" in errors[1].message
    with pytest.raises(PlanError) as raised:
        plan.raise_if_errors()
    assert raised.value.message.startswith("the plan has 2 problems")
    assert len(raised.value.problems) == 2
    assert str(raised.value.problems[0]).startswith(
        f"{tmp_path / 'recipe.toml'}:4: odd.weight [10, 33] cannot take"
    )


def test_a_lookup_rule_is_refused_naming_the_tensors_it_would_cover(tmp_path: Path) -> None:
    plan = make_plan(
        LLAMA,
        recipe(
            tmp_path,
            '[[rule]]\nmatch = "*norm*"\nkeep = true\n\n[[rule]]\nmatch = "*proj.weight"\n'
            'value = "Q4S"\nmode = "Lookup"\n',
        ),
    )
    (problem,) = plan.errors()
    assert (problem.kind, problem.file, problem.line) == ("lookup", str(tmp_path / "recipe.toml"), 6)
    assert problem.tensors == tuple(i.name for i in LLAMA if i.name.endswith("proj.weight"))
    assert "mode Lookup" in problem.message
    assert "lookup quantization does not travel as a QFloat tensor" in problem.message
    assert f"4 tensors ({LAYER}.self_attn.q_proj.weight, {LAYER}.self_attn.k_proj.weight, " in problem.message
    assert "Symmetric scheme of the same width" in problem.hint and "keep = true" in problem.hint
    up = by_name(plan)[f"{LAYER}.mlp.up_proj.weight"].decision
    assert up.scheme is None and up.reason.startswith("refused: rule")
    with pytest.raises(PlanError):
        plan.raise_if_errors()


def test_zero_point_and_refused_schemes_are_reported_once_per_rule(tmp_path: Path) -> None:
    plan = make_plan(
        LLAMA,
        recipe(
            tmp_path,
            '[[rule]]\nmatch = "*proj*"\nvalue = "Q4F"\nzero_point = 8\n'
            '[[rule]]\nmatch = "lm_head*"\nvalue = "Q4S"\nstore = "Native"\n',
        ),
    )
    zero, native = plan.errors()
    assert (zero.kind, zero.line, len(zero.tensors)) == ("scheme", 2, 4)
    assert "Burn has no zero point" in zero.message and "Q4S" in zero.hint
    assert (native.kind, native.line, native.tensors) == ("scheme", 6, ("lm_head.weight",))
    assert "Can't store native sub-byte values" in native.message


def test_a_rule_that_matches_nothing_is_a_warning(tmp_path: Path) -> None:
    plan = make_plan(LLAMA, recipe(tmp_path, '[[rule]]\nmatch = "*.bias"\nkeep = true\n'))
    (problem,) = own_problems(plan.problems)
    assert (problem.kind, problem.severity, problem.line) == ("unmatched-rule", "warning", 2)
    assert "matches no tensor" in problem.message
    plan.raise_if_errors()  # warnings do not stop the plan


def test_a_rule_cannot_requantize_an_fp8_tensor(tmp_path: Path) -> None:
    plan = make_plan(FP8[:1], recipe(tmp_path, '[[rule]]\nmatch = "*"\npreset = "q8s"\n'))
    entry = plan.entries[0]
    assert entry.decision.scheme is None
    assert "F8_E4M3 is already quantized; qcli does not requantize" in entry.decision.reason
    assert [p.kind for p in plan.errors()] == ["dtype"]


def test_problem_str_carries_its_location(tmp_path: Path) -> None:
    plan = make_plan(LLAMA, recipe(tmp_path, '[[rule]]\nmatch = "nothing"\nkeep = true\n'))
    assert str(plan.problems[0]) == f"{tmp_path / 'recipe.toml'}:2: rule (match 'nothing') matches no tensor"


def test_an_empty_model_makes_an_empty_plan() -> None:
    plan = make_plan([])
    assert (plan.entries, plan.problems, plan.totals().peak_bytes, plan.totals().ratio) == ([], [], 0, 0.0)


def test_newer_safetensors_dtypes_are_classified_not_guessed() -> None:
    tensors = [
        TensorInfo("fp4.weight", "F4", (64, 64), 64 * 32, SOURCE),
        TensorInfo("fp4.weight_scale", "F8_E8M0", (64, 2), 128, SOURCE),
        TensorInfo("mask", "BOOL", (8, 8), 64, SOURCE),
        TensorInfo("freqs", "C64", (8, 8), 512, SOURCE),
    ]
    plan = make_plan(tensors)
    assert [e.decision.reason for e in plan.entries] == [
        "default: keep, already quantized (F4)",
        "default: keep, already quantized (F8_E8M0)",
        "default: keep, bool tensor (BOOL)",
        "default: keep, non-floating tensor (C64)",
    ]
    assert plan.entries[2].out_dtype.to_serde() == {"Bool": "Native"}
    assert [p.tensors for p in plan.errors()] == [("fp4.weight",), ("fp4.weight_scale",), ("freqs",)]


def test_burns_per_file_limits() -> None:
    # Eleven kept 1-D F32 tensors of 9.7 GiB each: each fits Burn's 10 GiB, the file does not fit 100 GiB.
    big = [info(f"t{i}", "F32", [2_600_000_000]) for i in range(11)]
    (problem,) = make_plan(big).errors()
    assert problem.kind == "size"
    assert "106.5 GiB" in problem.message and "100 GiB" in problem.message
    many = [TensorInfo(f"b{i}", "F32", (1,), 4, SOURCE) for i in range(100_001)]
    (problem,) = make_plan(many).errors()
    assert "100001 tensors" in problem.message and "100000" in problem.message


# ----------------------------------------------------------------------------- daily use, round two


def test_a_rule_that_quantizes_none_of_its_tensors_is_a_warning_naming_why(tmp_path: Path) -> None:
    """Block [48] divides none of the projections' rows (4096, 11008): every one is kept."""
    plan = make_plan(
        LLAMA, recipe(tmp_path, '[[rule]]\nmatch = "*proj.weight"\nvalue = "Q8S"\nblock = [48]\nblock_scale = "F16"\n')
    )
    (problem,) = plan.problems
    assert (problem.kind, problem.severity, problem.file, problem.line) == (
        "unquantized-rule", "warning", str(tmp_path / "recipe.toml"), 2)
    assert problem.tensors == tuple(i.name for i in LLAMA if i.name.endswith("proj.weight"))
    assert problem.message == (
        "rule (match '*proj.weight') matches 4 tensors (model.layers.0.self_attn.q_proj.weight, "
        "model.layers.0.self_attn.k_proj.weight, model.layers.0.mlp.up_proj.weight, ...) but quantizes none "
        "of them with Q8S PackedU32(0) block [48] F16: model.layers.0.self_attn.q_proj.weight [4096, 4096]: "
        "last dim 4096 is not a multiple of 48 (block [48])"
    )
    assert "keep = true" in problem.hint
    plan.raise_if_errors()  # a warning in quantize


def test_a_rule_that_quantizes_some_of_its_tensors_is_no_problem(tmp_path: Path) -> None:
    plan = make_plan(
        [info("odd.weight", "F32", [10, 33]), info("ok.weight", "F32", [2, 32])],
        recipe(tmp_path, '[[rule]]\nmatch = "*"\npreset = "q4s-b32"\n'),
    )
    assert own_problems(plan.problems) == []


def test_a_plan_that_quantizes_nothing_warns() -> None:
    norms = [info("a.norm.weight", "BF16", [64]), info("b.norm.weight", "BF16", [64])]
    (problem,) = make_plan(norms).problems
    assert (problem.kind, problem.severity, problem.file) == ("nothing-quantized", "warning", None)
    assert problem.message == (
        "nothing is quantized: all 2 tensors (a.norm.weight, b.norm.weight) are kept; the first because "
        "default: keep, 1-D tensor (norm/bias)"
    )
    assert problem.tensors == ("a.norm.weight", "b.norm.weight")
    # A plan with errors says those instead; an empty one says nothing.
    assert [p.kind for p in make_plan(FP8[:1]).problems] == ["dtype"]
    assert make_plan([]).problems == []


def test_a_shadowed_rule_names_the_rule_that_takes_its_tensors(tmp_path: Path) -> None:
    plan = make_plan(
        LLAMA,
        recipe(
            tmp_path,
            '[[rule]]\nmatch = "*.weight"\npreset = "q4s-b32"\n'  # rule 1, line 2: takes every weight
            '[[rule]]\nmatch = "*norm*"\nkeep = true\n'  # rule 2, line 5: every norm is a weight
            '[[rule]]\nmatch = "*.bias"\nkeep = true\n',  # rule 3, line 8: matches nothing at all
        ),
    )
    file = tmp_path / "recipe.toml"
    shadowed, unmatched = own_problems(plan.problems)
    assert (shadowed.kind, shadowed.severity, shadowed.line) == ("unmatched-rule", "warning", 5)
    assert shadowed.message == (
        f"rule (match '*norm*') is shadowed by rule 1 ({file}:2): every tensor it matches, 2 tensors "
        "(model.layers.0.input_layernorm.weight, model.norm.weight), is taken by that rule first"
    )
    assert "move this rule before it" in shadowed.hint
    assert (unmatched.line, unmatched.message) == (8, "rule (match '*.bias') matches no tensor")


def test_a_rule_shadowed_by_two_rules_names_both(tmp_path: Path) -> None:
    plan = make_plan(
        LLAMA,
        recipe(
            tmp_path,
            '[[rule]]\nmatch = "*embed*"\nkeep = true\n'
            '[[rule]]\nmatch = "lm_head*"\nkeep = true\n'
            '[[rule]]\nmatch = "re:(model\\\\.embed_tokens|lm_head)\\\\.weight"\npreset = "q8s-b32"\n',
        ),
    )
    (problem,) = [p for p in plan.problems if p.kind == "unmatched-rule"]
    file = tmp_path / "recipe.toml"
    assert f"is shadowed by rule 1 ({file}:2), rule 2 ({file}:5): " in problem.message
    assert "taken by those rules first" in problem.message and "before them" in problem.hint


@pytest.mark.parametrize(
    ("preset", "shape", "block", "why"),
    [
        ("q4s-b128", [128, 352], 32, "352 is not a multiple of 128"),
        ("q4s-b64", [128, 352], 32, "352 is not a multiple of 64"),
        ("q4s-b128", [8, 64], 64, "64 is not a multiple of 128"),
        ("q4s-b32", [10, 48], 16, "48 is not a multiple of 32"),
        ("q4s-b32", [10, 40], 8, "40 is not a multiple of 32"),  # 8: the 4-bit values of one u32 word
        ("fp4-b32", [8, 48], 16, "48 is not a multiple of 32"),
        ("q8s-b32", [4, 36], 4, "36 is not a multiple of 32"),
    ],
)
def test_default_policy_falls_back_to_the_largest_block_that_divides_the_row(
    preset: str, shape: list[int], block: int, why: str
) -> None:
    entry = make_plan([info("w", "F32", shape)], options=PlanOptions(preset=PRESETS[preset])).entries[0]
    expected = PRESETS[preset].scheme.per_block([block], ScaleDtype.F16)  # the same value, store, scale dtype
    assert entry.decision.scheme == expected
    assert entry.decision.reason == f"default: F32 tensor of rank 2 -> {preset} → block [{block}]: {why}"
    assert entry.out_nbytes == shape[0] * shape[1] * expected.value.size_bits() // 8 + shape[0] * shape[1] // block * 2


def test_a_rule_keeps_its_block_no_fallback(tmp_path: Path) -> None:
    plan = make_plan([info("w", "F32", [8, 48])], recipe(tmp_path, '[[rule]]\nmatch = "w"\npreset = "q4s-b32"\n'))
    assert plan.entries[0].decision.scheme is None


@pytest.mark.parametrize(
    ("name", "role"),
    [
        ("model.embed_tokens.weight", "token embedding"),
        ("model.language_model.embed_tokens.weight", "token embedding"),
        ("transformer.wte.weight", "token embedding"),
        ("wte", "token embedding"),
        ("tok_embeddings.weight", "token embedding"),
        ("token_embd.weight", "token embedding"),  # llama.cpp's (qcli.formats.gguf)
        ("lm_head.weight", "output head"),
        ("output.weight", "output head"),
    ],
)
def test_the_embedding_and_the_head_take_8_bits_under_a_narrower_preset(name: str, role: str) -> None:
    def decided(preset: str) -> Decision:
        (entry,) = make_plan([info(name, "BF16", [256, 128])], None, PlanOptions(preset=PRESETS[preset])).entries
        return entry.decision

    for preset in ("q4s-b32", "q4s-b128", "q2s-b32", "fp4-b32"):
        decision = decided(preset)
        assert decision.scheme is PRESETS["q8s-b32"].scheme, preset
        assert decision.reason == f"default: {role}, 8 bits -> q8s-b32"
    for preset in ("q8s", "e4m3", "q8s-native"):  # not narrower than 8 bits: the preset itself
        assert decided(preset).scheme is PRESETS[preset].scheme


def test_only_those_names_take_8_bits(tmp_path: Path) -> None:
    names = ["model.layers.0.attention.output.weight", "model.layers.0.self_attn.o_proj.weight", "wte.bias"]
    plan = make_plan([info(n, "BF16", [64, 64]) for n in names])
    assert [e.decision.scheme for e in plan.entries] == [PRESETS["q4s-b32"].scheme] * 3


def test_a_rule_overrides_the_8_bit_default(tmp_path: Path) -> None:
    plan = make_plan(LLAMA, recipe(tmp_path, '[[rule]]\nmatch = "lm_head.weight"\npreset = "q4s-b32"\n'))
    entries = by_name(plan)
    assert entries["lm_head.weight"].decision.scheme is PRESETS["q4s-b32"].scheme
    assert entries["model.embed_tokens.weight"].decision.scheme is PRESETS["q8s-b32"].scheme  # no rule: default


def test_cast_writes_a_kept_tensor_in_another_floating_dtype(tmp_path: Path) -> None:
    plan = make_plan(
        LLAMA, recipe(tmp_path, '[[rule]]\nmatch = "*norm*"\nkeep = true\ncast = "f32"\n')
    )
    norm = by_name(plan)["model.norm.weight"]
    assert norm.decision.cast == "F32"
    assert (norm.out_dtype, norm.out_nbytes, norm.bits_per_weight) == ("F32", 4096 * 4, 32.0)
    assert norm.decision.reason == f"rule {tmp_path / 'recipe.toml'}:2: keep, cast BF16 to F32"
    assert norm.peak_bytes == 4096 * 2 + 4096 * 4  # the source and its cast
    assert own_problems(plan.problems) == []


def test_a_cast_to_the_source_dtype_is_no_cast(tmp_path: Path) -> None:
    plan = make_plan(LLAMA[5:6], recipe(tmp_path, '[[rule]]\nmatch = "*"\nkeep = true\ncast = "BF16"\n'))
    assert (plan.entries[0].decision.cast, plan.entries[0].out_dtype) == (None, "BF16")


def test_cast_of_a_tensor_that_is_not_floating_is_an_error(tmp_path: Path) -> None:
    plan = make_plan(LLAMA + FP8[:1], recipe(tmp_path, '[[rule]]\nmatch = "*"\nkeep = true\ncast = "F32"\n'))
    cast = [p for p in plan.errors() if p.kind == "cast"]
    assert len(cast) == 1
    assert cast[0].tensors == ("model.rotary.position_ids", "model.layers.1.mlp.gate_proj.weight")
    assert (cast[0].file, cast[0].line) == (str(tmp_path / "recipe.toml"), 2)
    assert "not floating (F8_E4M3, I64)" in cast[0].message and "drop cast" in cast[0].hint
    with pytest.raises(PlanError):
        plan.raise_if_errors()


def test_cast_kept_casts_every_kept_floating_tensor(tmp_path: Path) -> None:
    plan = make_plan(
        LLAMA + [info("odd.weight", "F16", [4, 33])],
        recipe(tmp_path, '[defaults]\ncast_kept = "F32"\n[[rule]]\nmatch = "odd.*"\npreset = "q4s-b32"\n'),
    )
    entries = by_name(plan)
    assert entries["model.norm.weight"].out_dtype == "F32"
    assert entries["model.norm.weight"].decision.reason == "default: keep, 1-D tensor (norm/bias), cast BF16 to F32"
    assert entries["odd.weight"].out_dtype == "F32"  # kept because it cannot take its rule's scheme
    assert entries["model.rotary.position_ids"].out_dtype == "I64"  # not floating: passed by
    assert entries["lm_head.weight"].decision.cast is None  # quantized
    assert [p.kind for p in plan.errors()] == []


def test_ndarray_loads_bf16_norms_cast_to_f32(tmp_path: Path) -> None:
    from qcli.burn_backends import BurnBackend

    bf16 = make_plan(LLAMA, options=PlanOptions(preset=PRESETS["q8s-b32"], backend=BurnBackend.ndarray))
    (problem,) = bf16.errors()
    assert problem.kind == "backend" and "cast = \"F32\"" in problem.hint
    cast = make_plan(LLAMA, recipe(tmp_path, '[defaults]\ncast_kept = "F32"\n'),
                     PlanOptions(preset=PRESETS["q8s-b32"], backend=BurnBackend.ndarray))
    assert cast.errors() == []


def calibration_recipe(tmp_path: Path) -> Path:
    path = tmp_path / "recipe.toml"
    path.write_text('version = 1\n'
                    '[[rule]]\nmatch = "*.q_proj.weight"\npreset = "q4f-b32"\ncalibration = "absmean"\n'
                    '[[rule]]\nmatch = "*.k_proj.weight"\npreset = "q4f-b32"\n'
                    '[[rule]]\nmatch = "*.v_proj.weight"\nvalue = "E2M1"\nblock = [16]\nblock_scale = "UE4M3"\n'
                    'tensor_scale = "F32"\n')
    return path


def test_calibration_comes_from_the_rule_then_the_flag_then_the_preset(tmp_path):
    """A rule's own `calibration` wins; `--calibration` covers rules without one and the default preset."""
    infos = [info(f"{LAYER}.self_attn.{p}_proj.weight", "BF16", [64, 64]) for p in "qk"]
    infos.append(info(f"{LAYER}.mlp.up_proj.weight", "BF16", [64, 64]))
    recipe = load_recipe(calibration_recipe(tmp_path))
    plain = {e.info.name.split(".")[-2]: e.decision.calibration.value for e in make_plan(infos, recipe).entries}
    assert plain == {"q_proj": "AbsMean", "k_proj": "MinMax", "up_proj": "MinMax"}
    searched = make_plan(infos, recipe, PlanOptions(calibration=Calibration.Mse))
    got = {e.info.name.split(".")[-2]: e.decision.calibration.value for e in searched.entries}
    assert got == {"q_proj": "AbsMean", "k_proj": "Mse", "up_proj": "Mse"}
    assert not [p for p in searched.problems if p.severity == "error"]


def test_a_flag_calibration_a_rules_scheme_cannot_take_is_an_error_at_the_rule(tmp_path):
    """AbsMean has no two-level form: `--calibration absmean` on a two-level rule names the rule."""
    infos = [info(f"{LAYER}.self_attn.v_proj.weight", "BF16", [64, 64])]
    plan = make_plan(infos, load_recipe(calibration_recipe(tmp_path)), PlanOptions(calibration=Calibration.AbsMean))
    (problem,) = [p for p in plan.problems if p.severity == "error"]
    assert problem.line == 9 and "--calibration AbsMean cannot apply to" in problem.message
    assert "two-level" in problem.message
    assert plan.entries[0].decision.scheme is None


def test_a_header_of_many_tensors_is_checked_once_per_shape() -> None:
    """Planning is linear in the header: the checks of a (scheme, shape) pair (shape, payload size, what each
    backend loads) run once per pair, however many tensors share it (bench/header_scale.py times it)."""
    from qcli import burn_backends, layout
    from qcli.plan import decisions

    checks = (decisions._shape_problem, layout._quantized_data_len, burn_backends._decode_problem)

    def checked(layers: int) -> list[int]:
        for check in checks:
            check.cache_clear()
        infos = [info(f"model.layers.{i}.mlp.{p}.weight", "BF16", [64, 128]) for i in range(layers)
                 for p in ("up", "down")]
        made = make_plan(infos, options=PlanOptions(preset=PRESETS["q4s-b32"]))
        assert len(made.entries) == 2 * layers
        assert all(e.decision.scheme == PRESETS["q4s-b32"].scheme for e in made.entries)
        return [check.cache_info().misses for check in checks]

    few = checked(2)
    assert few[:2] == [1, 1] and few[2] >= 2  # one shape; flex and wgpu at least, the common backends
    assert checked(2_000) == few
