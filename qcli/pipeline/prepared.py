"""Tensors quantized before the write (by a calibration run, `qcli.calibrate`): their payloads in plan order
among those of the pipeline that does the rest."""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from qcli.pipeline import Payload, Pipeline

if TYPE_CHECKING:
    import torch

    from qcli.io.source import Source
    from qcli.plan.entries import Plan


def rest_of(plan: Plan, prepared: Collection[str]) -> Plan:
    """The plan without the entries `prepared` names, quantized already: what the pipeline still does."""
    return replace(plan, entries=[e for e in plan.entries if e.name not in prepared])


def with_prepared(run: Pipeline, payloads: Mapping[str, torch.Tensor],
                  importance: Mapping[str, torch.Tensor] | None = None) -> Pipeline:
    """`run` over the rest of the plan (given the search's `importance`, unless the call gives its own), with
    each entry of `payloads` in its place in plan order, measured against its source tensor on the CPU."""

    def pipeline(plan: Plan, source: Source, measure: bool = False, *,
                 importance: Mapping[str, torch.Tensor] | None = importance) -> Iterator[Payload]:
        from qcli.measure import Measurement

        others = run(rest_of(plan, payloads), source, measure, importance=importance)
        for entry in plan.entries:
            if entry.name not in payloads:
                yield next(others)
                continue
            started = time.perf_counter()
            x = source.load(entry.info.name)
            read = time.perf_counter() - started
            x = x.t() if entry.encoding.transpose else x
            scheme, payload = entry.encoding.scheme, payloads[entry.name]
            measured = None
            if measure:
                assert scheme is not None, "a prepared entry is a quantized one"
                measured = Measurement.on("cpu")
                measured.add(x, payload, scheme, entry.decision.calibration)
            yield Payload(entry, payload, measured, read)
        for extra in others:  # none: the rest of the plan is done
            raise AssertionError(f"the pipeline gave {extra.entry.name} past the plan's end")

    return pipeline
