"""Tensors quantized before the write (GPTQ's, `qcli.calibrate`): their payloads packed from the fields and
scales already chosen, in plan order among the payloads of the pipeline that does the rest."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from qcli.pipeline import Payload, Pipeline

if TYPE_CHECKING:
    from qcli.codec.quantize import QuantizedParts
    from qcli.io.source import Source
    from qcli.plan import Plan


def rest_of(plan: Plan, parts: Mapping[str, object]) -> Plan:
    """The plan without the entries that `parts` holds already quantized: what the pipeline still does."""
    return replace(plan, entries=[e for e in plan.entries if e.name not in parts])


def with_prepared(run: Pipeline, parts: Mapping[str, QuantizedParts], **options) -> Pipeline:
    """`run` over the rest of the plan (given `options`, e.g. the search's importance), with each entry of
    `parts` in its place in plan order: its payload packed from its parts (`qcli.codec.pack`), measured
    against its source tensor on the CPU."""

    def pipeline(plan: Plan, source: Source, measure: bool = False) -> Iterator[Payload]:
        import qcli.codec
        from qcli.measure import Measurement

        others = run(rest_of(plan, parts), source, measure, **options)
        for entry in plan.entries:
            if entry.name not in parts:
                yield next(others)
                continue
            started = time.perf_counter()
            x = source.load(entry.info.name)
            read = time.perf_counter() - started
            x = x.t() if entry.decision.transpose else x
            scheme = entry.decision.scheme
            payload = qcli.codec.quantize.pack(parts[entry.name], scheme, entry.out_shape)
            measured = None
            if measure:
                measured = Measurement.on("cpu")
                measured.add(x, payload, scheme, entry.decision.calibration)
            yield Payload(entry, payload, measured, read)
        for extra in others:  # none: the rest of the plan is done
            raise AssertionError(f"the pipeline gave {extra.entry.name} past the plan's end")

    return pipeline
