"""The scheme cases the kernel tests check and bench/ measures: every value, store and scale level Burn
accepts. The tests own them and the benchmarks import them, so the two cannot drift apart."""

from __future__ import annotations

from qcli.scheme import (
    Calibration,
    Native,
    PackedNative,
    QuantScheme,
    QuantValue,
    ScaleDtype,
    accept_problems,
)

MinMax, AbsMean, Mse = Calibration.MinMax, Calibration.AbsMean, Calibration.Mse


def _s(value: QuantValue, store=None) -> QuantScheme:
    scheme = QuantScheme().with_value(value)
    return scheme.with_store(store) if store is not None else scheme


def all_schemes() -> list[tuple[QuantScheme, Calibration, tuple[int, ...]]]:
    """(scheme, calibration, small shape) triples; shapes have last axes that are not multiples of the
    pack width and partial edge blocks wherever the scheme allows them."""
    cases = []
    for value in QuantValue:
        cases.append((_s(value), MinMax, (5, 37)))                                   # default: tensor F32
        cases += [(_s(value).per_block([32], dtype), MinMax, (3, 80)) for dtype in ScaleDtype]
        cases.append((_s(value).per_block([32], ScaleDtype.BF16), AbsMean, (4, 64)))
        cases.append((_s(value).per_block([2, 16], ScaleDtype.UE4M3), MinMax, (3, 5, 48)))
        two_level = _s(value).per_block([16], ScaleDtype.UE4M3).per_tensor(ScaleDtype.F32)
        cases.append((two_level, MinMax, (6, 40)))
        cases += [(_s(value), Mse, (5, 37)), (_s(value).per_block([32], ScaleDtype.F16), Mse, (3, 80)),
                  (two_level, Mse, (6, 40))]
        if value.size_bits() == 8:
            cases.append((_s(value, Native()).per_tensor(ScaleDtype.F16), AbsMean, (7, 9)))
            cases.append((_s(value, Native()).per_block([3, 5], ScaleDtype.F32), AbsMean, (2, 7, 11)))
            cases.append((_s(value, Native()).per_block([8], ScaleDtype.F16), MinMax, (3, 21)))
    e2m1 = _s(QuantValue.E2M1, PackedNative(0))
    cases.append((QuantScheme.nvfp4(), MinMax, (4, 48)))
    cases.append((_s(QuantValue.Q4S).per_block([4], ScaleDtype.F16), MinMax, (2, 8)))     # blocks < a word
    cases.append((_s(QuantValue.Q2F).per_block([3, 6], ScaleDtype.F16), AbsMean, (7, 2, 19)))
    cases.append((_s(QuantValue.Q8S).per_block([2, 1, 4, 8], ScaleDtype.BF16), MinMax, (3, 2, 5, 9, 20)))
    cases.append((e2m1.per_block([16], ScaleDtype.F16), AbsMean, (3, 40)))
    cases.append((e2m1.per_block([5], ScaleDtype.UE4M3), MinMax, (3, 13)))
    cases.append((e2m1.per_tensor(ScaleDtype.BF16), MinMax, (1, 2, 3, 4, 5, 7)))
    # blocks over rows: two levels with a partial band; and whole bands and tiles (no masks)
    cases.append((e2m1.per_block([4, 16], ScaleDtype.UE4M3).per_tensor(ScaleDtype.F32), MinMax, (9, 48)))
    cases.append((_s(QuantValue.Q4S).per_block([4, 32], ScaleDtype.BF16), MinMax, (8, 2048)))
    cases.append((_s(QuantValue.Q4F).per_block([2, 16], ScaleDtype.F32), Mse, (3, 5, 48)))  # negative scales
    cases.append((_s(QuantValue.Q8F).per_block([32], ScaleDtype.BF16), Mse, (4, 70)))
    for scheme, calibration, _ in cases:
        assert not accept_problems(scheme, calibration, quantizer=False), scheme
    return cases
