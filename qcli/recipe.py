"""TOML recipes: ordered rules that pick a scheme, or keep, per tensor name (docs/recipes.md).

A recipe is checked in full when it is read: every fault is collected with its file and line, so
`validate-scheme` can report them all at once and `load_recipe` can name the first with a count of the
rest. tomllib reports no positions for valid TOML, so lines are found by scanning the text: the N-th
`[[rule]]` header, then the key's own line inside that table.

Requests Burn cannot honour but that are well formed (mode Lookup, a zero point, a scheme
`accept_problems` refuses) parse into a `Rule` carrying its `refusals`: the plan then reports which
tensors the rule would have covered before refusing it.
"""

from __future__ import annotations

import difflib
import hashlib
import re
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, StrEnum
from pathlib import Path
from typing import TypeVar

from qcli.errors import RecipeError, SchemeError
from qcli.io.dtypes import EXACT_FLOAT_DTYPES
from qcli.io.files import NOT_REGULAR_HINT, NotRegularFile, open_regular
from qcli.patterns import PatternRefused, name_matcher
from qcli.presets import (
    DEFAULT_PRESET,
    K_QUANT_MINS,
    LOOKUP_NAMES,
    PRESETS,
    ZERO_POINT_NAMES,
    ZERO_POINT_WHY,
    foreign_preset,
    k_quant,
)
from qcli.problem import Kind, Problem
from qcli.scheme import (
    LOOKUP_WHY,
    BlockSize,
    Calibration,
    Native,
    PackedNative,
    PackedU32,
    QuantMode,
    QuantScheme,
    QuantStore,
    QuantValue,
    ScaleDtype,
    accept_problems,
    same_width_instead,
)
from qcli.text import printable, shown

RECIPE_VERSION = 1
TOP_KEYS = ("version", "defaults", "rule")
DEFAULTS_KEYS = ("on_indivisible", "cast_kept")
CAST_DTYPES = EXACT_FLOAT_DTYPES  # what `cast` (a keep rule) and `cast_kept` write a kept floating tensor as
SCHEME_KEYS = ("value", "store", "mode", "block", "block_scale", "tensor_scale", "calibration")
ZERO_POINT_KEYS = ("zero_point", "asymmetric", "symmetric")
DOCUMENTED_RULE_KEYS = ("match", "keep", *SCHEME_KEYS, "transpose", "preset", "cast")
RULE_KEYS = (*DOCUMENTED_RULE_KEYS, *ZERO_POINT_KEYS)  # zero-point keys are read only to be refused
STORES = {"PackedU32": PackedU32, "Native": Native, "PackedNative": PackedNative}
LineOf = Callable[[str], int]  # the line of a key in the table being read
_E = TypeVar("_E", bound=Enum)


class ZeroPoint(StrEnum):
    """A mode with a zero point, which Burn has no form for: a rule asking for one is read only to be
    refused (`Rule.mode`, next to Burn's `QuantMode`)."""

    Asymmetric = "Asymmetric"
    Affine = "Affine"


class OnIndivisible(StrEnum):
    """`[defaults] on_indivisible`: what a tensor whose shape cannot take its rule's scheme does."""

    keep = "keep"  # it is kept, with the reason
    error = "error"  # the plan stops


@dataclass(frozen=True)
class Rule:
    """One `[[rule]]`: which tensors it matches and what it decides for them.

    `mode` is the mode as asked (Burn's Symmetric or Lookup, or a zero-point mode); `refusals` lists every
    reason Burn cannot hold what the rule asks for (empty for a rule the plan can carry out).
    """

    match: str
    file: str
    line: int
    keep: bool
    scheme: QuantScheme | None
    calibration: Calibration | None  # None: not said, so `--calibration`'s, else the preset's or MinMax
    transpose: bool | None  # None: not said, so `--transpose`'s for Linear weights, else false
    preset: str | None
    mode: QuantMode | ZeroPoint = QuantMode.Symmetric
    refusals: tuple[Problem, ...] = ()
    cast: str | None = None  # keep rules: the dtype a kept floating tensor is written in (CAST_DTYPES)
    number: int = 0  # its place in the recipe: 1 for the first [[rule]]

    def matches(self, name: str) -> bool:
        """Glob on the full name, or a full regex match after `re:`, in time linear in the name's length
        (`qcli.patterns`)."""
        return name_matcher(self.match)(name)

    @property
    def location(self) -> str:
        return f"{self.file}:{self.line}"

    def describe(self) -> str:
        """What the rule asks for, in one phrase: `keep`, a preset name, or the scheme."""
        if self.keep:
            return "keep"
        if self.preset is not None:
            return f"preset {self.preset}"
        if self.scheme is not None and isinstance(self.mode, QuantMode):
            return str(self.scheme)  # a Lookup scheme names its mode itself
        return f"{self.scheme or ''} (mode {self.mode})".lstrip()


@dataclass(frozen=True)
class Recipe:
    path: Path | None
    on_indivisible: OnIndivisible
    rules: list[Rule]
    sha256: str
    cast_kept: str | None = None  # [defaults]: the dtype every kept floating tensor is written in


def load_recipe(path: str | Path) -> Recipe:
    """Read a recipe; `RecipeError` with file:line and a suggestion for the first fault found."""
    recipe, faults = read_recipe(path)
    if not faults:
        return recipe
    first, more = faults[0], len(faults) - 1
    hint = first.hint + (f" ({more} more problem{'s' if more > 1 else ''}: run qcli validate-scheme {path})"
                         if more else "")
    raise RecipeError(str(first), hint)


MAX_RECIPE_SIZE = 10_000_000  # bytes; a recipe is a few hundred


def read_recipe(path: str | Path) -> tuple[Recipe, list[Problem]]:
    """Read a recipe, collecting every fault; the recipe holds the rules that parsed."""
    path = Path(path)
    try:
        with open_regular(path) as file:
            data = file.read(MAX_RECIPE_SIZE + 1)
    except NotRegularFile as exc:
        raise RecipeError(printable(f"cannot read recipe {path}: {exc}"), hint=NOT_REGULAR_HINT) from None
    except OSError as exc:
        raise RecipeError(
            printable(f"cannot read recipe {path}: {exc.strerror or exc}"), hint="check the path given to --recipe"
        ) from None
    if len(data) > MAX_RECIPE_SIZE:
        raise RecipeError(printable(f"cannot read recipe {path}: it is larger than {MAX_RECIPE_SIZE} bytes"),
                          hint="a recipe is a short TOML file of rules (docs/recipes.md)")
    return parse_recipe(data, str(path), path)


def parse_recipe(
    data: bytes, file: str = "<recipe>", path: Path | None = None
) -> tuple[Recipe, list[Problem]]:
    """Parse recipe bytes named `file` in messages; returns the recipe and every fault found."""
    sha256 = hashlib.sha256(data).hexdigest()
    empty = Recipe(path, OnIndivisible.keep, [], sha256)
    file = printable(file)
    try:
        text = data.decode("utf-8-sig")  # an editor's byte order mark is not part of the TOML
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        return empty, [_fault(file, line, "the recipe is not UTF-8 text", "save the recipe as UTF-8")]
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return empty, [_syntax_fault(file, exc)]
    except RecursionError:  # tomllib recurses once per nested array or inline table
        return empty, [_fault(file, _deepest_line(text), "invalid TOML: arrays or inline tables are nested "
                              "too deeply", "a recipe's values are strings, numbers, booleans and flat arrays "
                              "(docs/recipes.md)")]
    except ValueError:  # tomllib's other ValueError: an integer past int's digit limit
        return empty, [_fault(file, _longest_number_line(text), "invalid TOML: an integer of more than "
                              f"{sys.get_int_max_str_digits()} digits", "block extents and the version are "
                              "small integers (docs/recipes.md)")]
    parser = _Parser(file, text)
    on_indivisible, rules = parser.recipe(doc)
    return Recipe(path, on_indivisible, rules, sha256, parser.cast_kept), parser.faults


_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column \d+\)\s*$")


def _deepest_line(text: str) -> int:
    """The line holding the most opening brackets: where a too-deep nesting starts."""
    counts = [line.count("[") + line.count("{") for line in text.splitlines()] or [0]
    return counts.index(max(counts)) + 1


def _longest_number_line(text: str) -> int:
    """The line holding the longest run of digits."""
    runs = [max((len(run) for run in re.findall(r"[0-9_]+", line)), default=0) for line in text.splitlines()]
    return runs.index(max(runs)) + 1 if runs else 1


def _fault(file: str, line: int, message: str, hint: str) -> Problem:
    """A recipe error found while reading, kept as data so that every one can be reported."""
    return Problem(Kind.recipe, message, hint, file=file, line=line)


def _syntax_fault(file: str, exc: tomllib.TOMLDecodeError) -> Problem:
    message = str(exc)
    position = _TOML_POSITION.search(message)
    line = int(position.group(1)) if position else 1
    return _fault(file, line, printable(f"invalid TOML: {_TOML_POSITION.sub('', message)}"),
                  "fix the TOML syntax; docs/recipes.md shows a complete recipe")


_HEADER_NAME_PUNCTUATION = frozenset(".-\"' _")


def _header_name(line: str) -> str | None:
    """The table name of a `[name]` or `[[name]]` line (a comment may follow), else None.

    A scan in one pass over the line: `\\s*\\[\\[?\\s*([\\w.\\-"' ]+?)\\s*\\]\\]?\\s*(?:#.*)?$` as a regular
    expression backtracks in time cubic in the line's length (its three space-matching parts overlap).
    """
    rest = line.lstrip()
    if not rest.startswith("["):
        return None
    rest = rest[2:] if rest.startswith("[[") else rest[1:]
    close = rest.find("]")
    if close < 0:
        return None
    name, tail = rest[:close].strip(), rest[close + 1 :]
    tail = (tail[1:] if tail.startswith("]") else tail).lstrip()
    if not name or (tail and not tail.startswith("#")):
        return None
    quoted = len(name) > 1 and name[0] == name[-1] and name[0] in "\"'"  # a quoted key holds anything
    if not quoted and not all(ch.isalnum() or ch in _HEADER_NAME_PUNCTUATION for ch in name):
        return None
    return name.strip("\"'")


class RecipeLines:
    """Where tables and keys sit in the recipe text, found by scanning (tomllib reports no positions).

    Every scan is linear in the text: a recipe is hostile input too (a 100 kB line, 100,000 rules).
    """

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        # (name, line) of every table header (`[name]` or `[[name]]`), lines counted from 1
        self.headers: list[tuple[str, int]] = []
        self._by_name: dict[str, list[int]] = {}  # name -> indices into headers
        for number, line in enumerate(self.lines, 1):
            name = _header_name(line)
            if name is not None:
                self._by_name.setdefault(name, []).append(len(self.headers))
                self.headers.append((name, number))

    def table(self, name: str, index: int = 0) -> tuple[int, int] | None:
        """The 1-based line span (header, last line) of the `index`-th table called `name`."""
        found = self._by_name.get(name, [])
        if index >= len(found):
            return None
        i = found[index]
        end = self.headers[i + 1][1] - 1 if i + 1 < len(self.headers) else len(self.lines)
        return self.headers[i][1], end

    def key(self, key: str, span: tuple[int, int] | None) -> int:
        """The line of `key = ...` in `span` (the top level when None), else the span's first line."""
        start, end = span or (1, self.headers[0][1] - 1 if self.headers else len(self.lines))
        spellings = (key, f'"{key}"', f"'{key}'")
        for number in range(start, end + 1):
            line = self.lines[number - 1].lstrip()
            for spelling in spellings:
                if line.startswith(spelling) and line[len(spelling) :].lstrip()[:1] in ("=", "."):
                    return number
        if span is None:  # a top-level key may be a table: its header is its line
            return next((line for name, line in self.headers if name.split(".")[0] == key), 1)
        return max(start, 1)


MAX_MESSAGE = 500  # characters of a fault's message (a value from the recipe can be any length)


def _bounded(text: str) -> str:
    """`text` escaped onto one line and cut to MAX_MESSAGE characters."""
    text = printable(text)
    return text if len(text) <= MAX_MESSAGE else f"{text[:MAX_MESSAGE]}... ({len(text)} characters)"


def _suggest(word: str, choices: list[str] | tuple[str, ...]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6) or difflib.get_close_matches(
        word.lower(), [c.lower() for c in choices], n=1, cutoff=0.6
    )
    if close:
        canonical = next(c for c in choices if c.lower() == close[0].lower())
        return f"did you mean {canonical!r}? "
    return ""


def _type_name(value: object) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "a table"}.get(type(value), type(value).__name__)


class _Parser:
    """Turns a parsed TOML document into rules, recording a fault with its line for every error."""

    def __init__(self, file: str, text: str) -> None:
        self.file = file
        self.lines = RecipeLines(text)
        self.faults: list[Problem] = []
        self.cast_kept: str | None = None

    def fault(self, line: int, message: str, hint: str) -> None:
        self.faults.append(_fault(self.file, line, _bounded(message), _bounded(hint)))

    def unknown_keys(self, table: dict, known: tuple[str, ...], where: str, span: tuple[int, int] | None,
                     listed: tuple[str, ...] | None = None) -> None:
        for key in table:
            if key not in known:
                self.fault(
                    self.lines.key(key, span), f"unknown key {shown(key)} in {where}",
                    f"{_suggest(key, known)}known keys: {', '.join(listed or known)}",
                )

    def recipe(self, doc: dict) -> tuple[OnIndivisible, list[Rule]]:
        self.unknown_keys(doc, TOP_KEYS, "the recipe", None)
        version = doc.get("version")
        if version is None:
            self.fault(1, "the recipe has no version", f"add `version = {RECIPE_VERSION}` as its first line")
        elif type(version) is not int or version != RECIPE_VERSION:
            self.fault(
                self.lines.key("version", None), f"unsupported recipe version {shown(version)}",
                f"this qcli reads version = {RECIPE_VERSION}",
            )
        on_indivisible = self.defaults(doc.get("defaults", {}))
        rules_doc = doc.get("rule", [])
        if not isinstance(rules_doc, list) or not all(isinstance(r, dict) for r in rules_doc):
            self.fault(
                self.lines.key("rule", None), "`rule` must be an array of tables",
                "write each rule under its own [[rule]] header",
            )
            return on_indivisible, []
        rules = [rule for i, table in enumerate(rules_doc) if (rule := self.rule(table, i)) is not None]
        return on_indivisible, rules

    def defaults(self, table: object) -> OnIndivisible:
        span = self.lines.table("defaults")
        if not isinstance(table, dict):
            self.fault(self.lines.key("defaults", None), "defaults must be a table", "write it as [defaults]")
            return OnIndivisible.keep
        self.unknown_keys(table, DEFAULTS_KEYS, "[defaults]", span)
        if "cast_kept" in table:
            self.cast_kept = self.cast(table, "cast_kept", lambda key: self.lines.key(key, span))
        value = table.get("on_indivisible", OnIndivisible.keep)
        if value not in tuple(OnIndivisible):
            self.fault(
                self.lines.key("on_indivisible", span),
                f"on_indivisible must be \"keep\" or \"error\", got {shown(value)}",
                "\"keep\" keeps a tensor whose shape cannot take its scheme; \"error\" stops the plan",
            )
            return OnIndivisible.keep
        return OnIndivisible(value)

    def rule(self, table: dict, index: int) -> Rule | None:
        """One rule, or None when it has faults (each one recorded)."""
        span = self.lines.table("rule", index)
        header = span[0] if span else self.lines.key("rule", None)
        before = len(self.faults)

        def line(key: str) -> int:
            return self.lines.key(key, span)

        self.unknown_keys(table, RULE_KEYS, f"rule {index + 1}", span, DOCUMENTED_RULE_KEYS)
        misspelt = len(self.faults) > before  # a misspelt keep/value/preset: don't also say it is missing
        match = self.pattern(table.get("match"), line("match") if "match" in table else header)
        keep = self.boolean(table, "keep", line)
        transpose = self.boolean(table, "transpose", line) if "transpose" in table else None
        scheme_keys = [k for k in SCHEME_KEYS if k in table]
        preset_name = table.get("preset")
        mode = self.mode(table, line)
        conflicts = scheme_keys + (["preset"] if "preset" in table else []) + [
            k for k in ZERO_POINT_KEYS if k in table and mode is not QuantMode.Symmetric
        ]
        if keep and conflicts:
            self.fault(
                line(conflicts[0]), f"keep = true cannot be combined with {', '.join(conflicts)}",
                "a kept tensor is written unchanged; remove keep, or the scheme keys",
            )
        shape_keys = [k for k in scheme_keys if k != "calibration"]  # a preset takes a calibration of its own
        if preset_name is not None and shape_keys:
            self.fault(
                line(shape_keys[0]), f"preset cannot be combined with {', '.join(shape_keys)}",
                "a preset is a whole scheme: use either preset = \"...\" or value/store/block/... keys",
            )
        cast = self.cast(table, "cast", line) if "cast" in table else None
        if "cast" in table and not keep:
            self.fault(
                line("cast"), "cast needs keep = true: it sets the dtype a kept tensor is written in",
                "add keep = true to write the tensors unquantized in that dtype, or remove cast (a quantized "
                "tensor's dtype is its scheme)",
            )
        keep_invalid = "keep" in table and not isinstance(table["keep"], bool)  # already a fault
        asks = keep or keep_invalid or misspelt or "preset" in table or "value" in table
        if not asks and mode is QuantMode.Symmetric:
            self.fault(
                header, "the rule says neither keep = true, a preset, nor a value",
                f"add keep = true, preset = \"{DEFAULT_PRESET}\", or value = \"Q4S\" with its scale keys",
            )
        scheme = calibration = preset = None
        refusals: tuple[Problem, ...] = ()
        if not keep and preset_name is not None and not shape_keys:
            preset, scheme, _, refusals = self.preset(preset_name, line("preset"))
            calibration = self.enum(table, "calibration", Calibration, line)
            if refusals:
                mode = refused_mode(preset_name)
        elif not keep and "value" in table:
            scheme, calibration = self.scheme(table, line, mode)
        if len(self.faults) > before or match is None:
            return None
        if isinstance(mode, ZeroPoint) and not refusals:
            refusals = (_zero_point_refusal(table.get("value")),)
        elif mode is QuantMode.Lookup and scheme is None and not refusals:
            refusals = (_lookup_refusal(None),)
        if scheme is not None:
            refusals = refusals + tuple(accept_problems(scheme, calibration or Calibration.MinMax))
        return Rule(
            match=match, file=self.file, line=header, keep=keep, scheme=scheme,
            calibration=calibration, transpose=transpose, preset=preset,
            mode=mode, refusals=refusals, cast=cast, number=index + 1,
        )

    def pattern(self, match: object, line: int) -> str | None:
        if match is None:
            self.fault(line, "the rule has no match", "add match = \"*.weight\" (a glob) or \"re:<regex>\"")
            return None
        if not isinstance(match, str) or not match:
            self.fault(line, f"match must be a non-empty string, got {shown(match)}", "e.g. match = \"*.weight\"")
            return None
        try:
            name_matcher(match)
        except PatternRefused as exc:
            self.fault(line, f"invalid regular expression {shown(match)}: {exc}", exc.hint)
            return None
        return match

    def boolean(self, table: dict, key: str, line: LineOf) -> bool:
        value = table.get(key, False)
        if not isinstance(value, bool):
            self.fault(line(key), f"{key} must be true or false, got {_type_name(value)} {shown(value)}",
                       f"write {key} = true or {key} = false")
            return False
        return value

    def cast(self, table: dict, key: str, line: LineOf) -> str | None:
        """A dtype of CAST_DTYPES by name, any case; None (with a fault) for anything else."""
        name = self.string(table, key, line)
        if name is None:
            return None
        canonical = next((d for d in CAST_DTYPES if d.lower() == name.strip().lower()), None)
        if canonical is None:
            self.fault(line(key), f"unknown {key} {shown(name)}",
                       f"{_suggest(name, CAST_DTYPES)}one of {', '.join(CAST_DTYPES)} (floating dtypes Burn holds)")
        return canonical

    def string(self, table: dict, key: str, line: LineOf) -> str | None:
        value = table.get(key)
        if value is not None and not isinstance(value, str):
            self.fault(line(key), f"{key} must be a string, got {_type_name(value)} {shown(value)}",
                       f"write {key} = \"...\" with quotes")
            return None
        return value

    def enum(self, table: dict, key: str, enum: type[_E], line: LineOf) -> _E | None:
        """An enum member by name, any case; None (with a fault) for an unknown name."""
        name = self.string(table, key, line)
        if name is None:
            return None
        for member in enum:
            if member.name.lower() == name.lower():
                return member
        names = [m.name for m in enum]
        self.fault(line(key), f"unknown {key} {shown(name)}", f"{_suggest(name, names)}one of {', '.join(names)}")
        return None

    def mode(self, table: dict, line: LineOf) -> QuantMode | ZeroPoint:
        """The mode as asked: Symmetric, Lookup, or a zero-point mode (`mode = "Asymmetric"`, `zero_point`,
        `asymmetric = true`, `symmetric = false`), which Burn has no form for."""
        for key in ("asymmetric", "symmetric"):
            if key in table and not isinstance(table[key], bool):
                self.fault(line(key), f"{key} must be true or false, got {shown(table[key])}",
                           "Burn's schemes are all symmetric; remove the key")
        name = self.string(table, "mode", line)
        if name is not None:
            zero_point = next((m for m in ZeroPoint if m.lower() == name.lower()), None)
            if zero_point:
                return zero_point
            if self.enum(table, "mode", QuantMode, line) is QuantMode.Lookup:
                return QuantMode.Lookup
        if "zero_point" in table or table.get("asymmetric") is True or table.get("symmetric") is False:
            return ZeroPoint.Asymmetric
        return QuantMode.Symmetric

    def preset(
        self, name: object, line: int
    ) -> tuple[str | None, QuantScheme | None, Calibration | None, tuple[Problem, ...]]:
        """(canonical name, scheme, calibration, refusals) of a preset; Nones and a fault when unknown."""
        if not isinstance(name, str):
            self.fault(line, f"preset must be a string, got {shown(name)}", f"e.g. preset = \"{DEFAULT_PRESET}\"")
            return None, None, None, ()
        key = name.strip().lower()
        if key in PRESETS:
            preset = PRESETS[key]
            return preset.name, preset.scheme, preset.calibration, ()
        if refused_mode(key) is QuantMode.Lookup:
            return name, None, None, (_lookup_refusal(name),)
        if refused_mode(key) is ZeroPoint.Asymmetric:
            return name, None, None, (_zero_point_refusal(None, name),)
        if k_quant(key) is not None:  # Q3_K, Q6_K: symmetric, but with integer sub-block scales
            refused = foreign_preset(name)
            assert refused is not None, "a k-quant's name is a foreign preset"
            return name, None, None, (Problem(Kind.scheme, refused.message, refused.hint),)
        self.fault(line, f"unknown preset {shown(name)}", f"{_suggest(key, list(PRESETS))}known presets: "
                   f"{', '.join(PRESETS)} (docs/presets.md)")
        return None, None, None, ()

    def scheme(self, table: dict, line: LineOf, mode: QuantMode | ZeroPoint
               ) -> tuple[QuantScheme | None, Calibration | None]:
        """The scheme the value/store/block/... keys spell; a zero-point mode builds its Symmetric twin."""
        value = self.enum(table, "value", QuantValue, line)
        store = self.store(table, line)
        quant_mode = QuantMode.Lookup if mode is QuantMode.Lookup else QuantMode.Symmetric
        block = self.block(table, line)
        block_scale = self.enum(table, "block_scale", ScaleDtype, line)
        tensor_scale = self.enum(table, "tensor_scale", ScaleDtype, line)
        calibration = self.enum(table, "calibration", Calibration, line)
        if "block" in table and "block_scale" not in table:
            others = ", ".join(f'"{dtype}"' for dtype in ScaleDtype if dtype is not ScaleDtype.F16)
            self.fault(line("block"), "block needs block_scale, the dtype of its scales",
                       f"add block_scale = \"F16\" (or {others})")
        if "block_scale" in table and "block" not in table:
            self.fault(line("block_scale"), "block_scale needs block, the extents of a block",
                       "add block = [32], or use tensor_scale for one scale per tensor")
        if value is None or store is None:
            return None, None
        scheme = QuantScheme().with_value(value).with_store(store).with_mode(quant_mode)
        if block is not None and block_scale is not None:
            scheme = scheme.per_block(block, block_scale)
        if tensor_scale is not None or block is None:
            scheme = scheme.per_tensor(tensor_scale or ScaleDtype.F32)
        return scheme, calibration

    def store(self, table: dict, line: LineOf) -> QuantStore | None:
        """`PackedU32`, `Native`, `PackedNative` (dim 0), or `PackedU32(d)` with an explicit dim."""
        name = self.string(table, "store", line) if "store" in table else "PackedU32"
        if name is None:
            return None
        # stripped first: `\s*(\w+)\s*(...)?\s*` would backtrack quadratically over a run of spaces
        parsed = re.fullmatch(r"(\w+)\s*(?:\(\s*(\d{1,4})\s*\))?", name.strip())
        kind = None if parsed is None else next((k for k in STORES if k.lower() == parsed.group(1).lower()), None)
        if parsed is None or not kind or (kind == "Native" and parsed.group(2)):
            self.fault(line("store"), f"unknown store {shown(name)}",
                       f"{_suggest(name, list(STORES))}one of {', '.join(STORES)}")
            return None
        return Native() if kind == "Native" else STORES[kind](int(parsed.group(2) or 0))

    def block(self, table: dict, line: LineOf) -> list[int] | None:
        if "block" not in table:
            return None
        raw = table["block"]
        dims = [raw] if isinstance(raw, int) and not isinstance(raw, bool) else raw
        if not isinstance(dims, list) or not dims or not all(
            isinstance(d, int) and not isinstance(d, bool) for d in dims
        ):
            self.fault(line("block"), f"block must be an integer or an array of integers, got {shown(raw)}",
                       "e.g. block = [32], or block = [4, 32] for 4x32 tiles")
            return None
        try:
            BlockSize.new(dims)
        except SchemeError as exc:
            self.fault(line("block"), exc.message, exc.hint)
            return None
        return dims


def _width(value: object) -> int:
    """The bits of the value named `value` (4 when unknown)."""
    named = [v for v in QuantValue if isinstance(value, str) and v.name.lower() == value.lower()]
    return named[0].size_bits() if named else 4


def refused_mode(preset: str) -> QuantMode | ZeroPoint:
    """The mode of a preset name refused for it: Lookup (a codebook), a zero point, or Symmetric (a K-quant
    refused for its integer sub-block scales)."""
    key = preset.strip().lower()
    if key in LOOKUP_NAMES:
        return QuantMode.Lookup
    if key in ZERO_POINT_NAMES or k_quant(key) in K_QUANT_MINS:
        return ZeroPoint.Asymmetric
    return QuantMode.Symmetric


def _lookup_refusal(name: str | None) -> Problem:
    return Problem(
        Kind.lookup,
        f"mode Lookup{f' ({name} is a codebook)' if name else ''}: {LOOKUP_WHY}",
        "use a Symmetric scheme of the same width (e.g. Q4S with block [32] and F16 scales, preset "
        f"\"{DEFAULT_PRESET}\"), or keep the tensor unquantized (keep = true)",
    )


def _zero_point_refusal(value: object, name: str | None = None) -> Problem:
    asked = f"{name} is asymmetric" if name else "a zero point (asymmetric quantization)"
    return Problem(Kind.scheme, f"mode Asymmetric: {asked}: {ZERO_POINT_WHY}", same_width_instead(_width(value)))
