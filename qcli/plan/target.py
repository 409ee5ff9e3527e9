"""A budget instead of a preset (`--target-bpw`, `--target-size`): each free tensor's form chosen among the
presets the Burn backend loads and computes with, to lose least under the budget.

From the headers: which tensors the choice is free for (`free_tensors`: those the default policy
quantizes, no recipe rule pins), the forms each may take (`forms`, `tensor_forms`), what each costs, and
the budget in bits. From the weights (`qcli.sensitivity`, given as losses here): each form's expected
output error. Then `allocate`: every free tensor at its cheapest form, upgraded greedily by loss saved per
extra bit while the budget allows; `recipe_text` writes the choice as a recipe (one rule per tensor by its
exact name) that `qcli quantize --recipe` turns into the same bytes. Nothing here imports torch.
"""

from __future__ import annotations

import heapq
import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from qcli import layout
from qcli.burn_backends import COMMON_BACKENDS, BurnBackend, default_preset, hold_problem, load_problem
from qcli.errors import UsageError
from qcli.io.burnpack import align, entry_bound, fixed_bound
from qcli.plan.decisions import shape_problem
from qcli.plan.entries import Plan, PlanEntry
from qcli.plan.options import Target
from qcli.plan.roles import tensor_role
from qcli.presets import PRESETS, Preset
from qcli.scheme import Calibration, QuantScheme, accept_problems

MIN_BITS, MAX_BITS = 2, 8  # the widths of the values a target chooses among
# Bytes kept aside, per quantized tensor, for a QFloat descriptor longer than its base plan's (a two-level
# scheme's), and for the metadata a size target cannot know before the run (`--target-size`).
DESCRIPTOR_SLACK, METADATA_SLACK = 64, 4096


def forms(backend: BurnBackend | None, version: str, calibration: Calibration | None) -> list[Preset]:
    """The presets of 2 to 8 bits (one and two levels) a target chooses among: those `backend` of Burn
    `version` loads and computes with; without one, those every common backend that loads the default
    preset loads (the warnings a run without --burn-backend gives are then a plain run's), else those
    some common backend loads. `calibration` (`--calibration`) must apply to each."""
    chosen = []
    for preset in PRESETS.values():
        scheme = preset.scheme
        if not MIN_BITS <= scheme.value.size_bits() <= MAX_BITS or hold_problem(scheme, version):
            continue
        if accept_problems(scheme, calibration or preset.calibration):
            continue
        if _loads(scheme, (), backend, version):
            chosen.append(preset)
    return chosen


def _where(backend: BurnBackend | None, version: str) -> tuple[Sequence[BurnBackend], bool]:
    """The backends a form must load on, and whether on all of them (else on some): `backend`; without one,
    the common backends that load the default preset, or, where none does, any common backend."""
    if backend is not None:
        return [backend], True
    default = PRESETS[default_preset(None, version)].scheme
    loading = [b for b in COMMON_BACKENDS if load_problem(b, default, (), version) is None]
    return (loading, True) if loading else (COMMON_BACKENDS, False)


def _loads(scheme: QuantScheme, shape: tuple[int, ...], backend: BurnBackend | None, version: str) -> bool:
    """Whether a form of `scheme` for a tensor of `shape` (`()`: any) loads where `_where` asks."""
    where, every = _where(backend, version)
    loads = [load_problem(b, scheme, shape, version) is None for b in where]
    return all(loads) if every else any(loads)


def backend_words(backend: BurnBackend | None, version: str) -> str:
    """Where the forms load, for messages: `flex` or `flex (where the default preset loads)`."""
    if backend is not None:
        return f"Burn {version}'s {backend}"
    return f"Burn {version}'s {' and '.join(_where(backend, version)[0])} (no --burn-backend)"


@dataclass
class Choice:
    """A free tensor and what it may take: `forms` (its presets), their bytes and losses (index-aligned);
    `floor`, the index it may not go below (a role's default), and `chosen`, the index taken."""

    entry: PlanEntry
    forms: list[Preset]
    nbytes: list[int]
    losses: list[float] = field(default_factory=list)
    floor: int = 0
    chosen: int = 0

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def preset(self) -> Preset:
        return self.forms[self.chosen]


def free_tensors(plan: Plan, candidates: Sequence[Preset], backend: BurnBackend | None, version: str
                 ) -> list[Choice]:
    """The tensors of `plan` whose form the target chooses: quantized by the default policy (no recipe rule
    pins them, none is a checkpoint's own codes or requantized), with each of `candidates` (`forms`) their
    shape as written takes and loads with (no smaller block: a rule by name gives none); the token
    embedding and the output head never below their default (8 bits), and a tensor whose default no
    candidate matches stays as the default policy writes it."""
    chosen = []
    for entry in plan.entries:
        decision = entry.decision
        if (decision.scheme is None or decision.rule is not None or decision.transcode is not None
                or decision.requantize is not None):
            continue
        shape = tuple(entry.out_shape)
        usable = []
        for preset in candidates:
            if shape_problem(preset.scheme, shape) is None and _loads(preset.scheme, shape, backend, version):
                usable.append(preset)
        if not usable:
            continue
        usable.sort(key=lambda p: (layout.quantized_data_len(p.scheme, shape), p.name))
        nbytes = [layout.quantized_data_len(p.scheme, shape) for p in usable]
        floor = 0
        if tensor_role(entry.name) is not None:
            same = [i for i, p in enumerate(usable) if p.scheme == decision.scheme]
            if not same:
                continue
            floor = same[0]
        chosen.append(Choice(entry, usable, nbytes, floor=floor, chosen=floor))
    return chosen


@dataclass(frozen=True)
class Budget:
    """What the free tensors may spend, in the unit `cost` counts (bits of payload for --target-bpw, bytes
    of the file, aligned, for --target-size), and how the target reads in words."""

    available: float
    bpw: bool
    fixed_bits: int  # --target-bpw: the pinned quantized tensors' bits; its denominator below
    weights: int  # the quantized weights the bits are over

    def cost(self, nbytes: int) -> float:
        return 8 * nbytes if self.bpw else align(nbytes)


def budget(target: Target, plan: Plan, choices: Sequence[Choice], metadata: Mapping[str, str] | None = None
           ) -> Budget:
    """The budget `target` leaves the `choices` over the rest of `plan`: bits per quantized weight times the
    quantized weights, less the pinned ones' bits; or the file's bytes, less the container's own (an upper
    bound: `qcli.io.burnpack`'s size bounds) and the other tensors'."""
    free = {c.name for c in choices}
    quantized = [e for e in plan.entries if e.decision.scheme is not None]
    weights = sum(e.numel for e in quantized)
    if target.bpw is not None:
        fixed = sum(8 * e.out_nbytes for e in quantized if e.name not in free)
        return Budget(target.bpw * weights - fixed, True, fixed, weights)
    entries = plan.container_entries()
    overhead = fixed_bound(metadata) + METADATA_SLACK + sum(entry_bound(t) - align(t.nbytes) for t in entries)
    overhead += DESCRIPTOR_SLACK * len(free)
    others = sum(align(e.out_nbytes) for e in plan.entries if e.name not in free)
    assert target.size is not None
    return Budget(target.size - overhead - others, False, 0, weights)


def allocate(choices: Sequence[Choice], limit: Budget, target: Target, where: str) -> None:
    """Each choice's form (`Choice.chosen`): from its floor, upgraded one step at a time where loss saved per
    extra unit of cost is highest and the step fits what is left, until none fits. `UsageError` (exit 2)
    where even the floors overspend it."""
    check_budget(choices, limit, target, where)
    left = limit.available - sum(limit.cost(c.nbytes[c.floor]) for c in choices)
    for choice in choices:
        choice.chosen = choice.floor
    heap: list[tuple[float, int, int, int]] = []

    def push(k: int) -> None:
        step = _best_step(choices[k], limit, left)
        if step is not None:
            ratio, index = step
            heapq.heappush(heap, (-ratio, k, index, choices[k].chosen))

    for k in range(len(choices)):
        push(k)
    while heap:
        _, k, index, was = heapq.heappop(heap)
        choice = choices[k]
        if choice.chosen != was:
            continue  # a stale step: the tensor moved since
        extra = limit.cost(choice.nbytes[index]) - limit.cost(choice.nbytes[choice.chosen])
        if extra > left:
            push(k)  # what is left shrank: its best step that still fits
            continue
        left -= extra
        choice.chosen = index
        push(k)


def check_budget(choices: Sequence[Choice], limit: Budget, target: Target, where: str) -> None:
    """`UsageError` (exit 2) where even the smallest forms (each choice's floor) overspend the budget."""
    floor = sum(limit.cost(c.nbytes[c.floor]) for c in choices)
    if floor <= limit.available:
        return
    if limit.bpw:
        smallest = (floor + limit.fixed_bits) / limit.weights if limit.weights else 0.0
        raise UsageError(f"{target.given} is below the {smallest:.3f} bits per weight of the smallest forms that "
                         f"load on {where}",
                         hint=f"give --target-bpw {math.ceil(smallest * 100) / 100:g} or more (the token embedding "
                              "and the output head stay at 8 bits; a recipe rule may pin them narrower)")
    needed = math.ceil(target.size - limit.available + floor if target.size is not None else floor)
    raise UsageError(f"{target.given} is below the {needed} bytes the smallest forms that load on {where} take",
                     hint=f"give --target-size {needed} or more, or keep fewer tensors")


def _best_step(choice: Choice, limit: Budget, left: float) -> tuple[float, int] | None:
    """The form past the current one that lowers the loss most per extra cost and fits in `left`."""
    now_cost, now_loss = limit.cost(choice.nbytes[choice.chosen]), choice.losses[choice.chosen]
    best = None
    for i in range(len(choice.forms)):
        extra, saved = limit.cost(choice.nbytes[i]) - now_cost, now_loss - choice.losses[i]
        if saved <= 0 or extra > left:
            continue
        ratio = math.inf if extra <= 0 else saved / extra
        if best is None or ratio > best[0]:
            best = (ratio, i)
    return best


def achieved_bits(plan: Plan) -> float:
    """Bits per quantized weight of `plan`, its scales included (`layout.bits_per_weight` over the
    quantized entries)."""
    quantized = [e for e in plan.entries if e.decision.scheme is not None]
    return layout.bits_per_weight(sum(e.out_nbytes for e in quantized), sum(e.numel for e in quantized))


_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|block|layer)\.(\d+)\.")


def group_of(name: str) -> str:
    """A tensor's group in the summary: its role, else `layer N`, else `other`."""
    role = tensor_role(name)
    if role is not None:
        return role
    found = _LAYER.search(name)
    return f"layer {found.group(1)}" if found else "other"


def groups(choices: Sequence[Choice]) -> list[tuple[str, dict[str, int]]]:
    """Per group (roles first, then layers in order), how many tensors took each preset."""
    counts: dict[str, Counter[str]] = {}
    for choice in choices:
        counts.setdefault(group_of(choice.name), Counter())[choice.preset.name] += 1

    def key(group: str) -> tuple[int, int, str]:
        if group.startswith("layer "):
            return (1, int(group.split()[1]), group)
        return (0 if group != "other" else 2, 0, group)

    return [(g, dict(sorted(counts[g].items()))) for g in sorted(counts, key=key)]


def exact_names(names: Sequence[str]) -> str:
    """A recipe `match` that matches exactly `names`: the name itself for one (a glob, its `*`, `?` and `[`
    in brackets), else a `re:` alternation of them escaped."""
    if len(names) == 1:
        return re.sub(r"([*?\[])", r"[\1]", names[0])
    return "re:(?:" + "|".join(re.escape(name) for name in names) + ")"


def recipe_text(choices: Sequence[Choice], target: Target, achieved: float, base: str | None) -> str:
    """The choice as a recipe: `base` (the recipe the run was given, whose rules come first and pin their
    tensors) or a `version` line, then one rule per preset chosen, matching the exact names that took it."""
    head = base if base is not None else "version = 1\n"
    lines = [head.rstrip("\n") + "\n",
             f"# Chosen by qcli quantize {target.given}: {achieved:.3f} bits per quantized weight.",
             "# Reproduce the same bytes with --recipe THIS_FILE and the run's other options (not the target).",
             ""]
    by_preset: dict[str, list[str]] = {}
    for choice in choices:
        by_preset.setdefault(choice.preset.name, []).append(choice.name)
    for preset, names in sorted(by_preset.items()):
        lines += [f"[[rule]]                      # {len(names)} tensor{'s' if len(names) > 1 else ''}",
                  f"match = {_toml_string(exact_names(names))}",
                  f"preset = {json.dumps(preset)}", ""]
    return "\n".join(lines)


def _toml_string(text: str) -> str:
    """`text` as a TOML string: literal (no escapes, as a regex reads best) where it can be, else basic."""
    if "'" not in text and text.isprintable():
        return f"'{text}'"
    return json.dumps(text, ensure_ascii=False)
