"""Tensor names matched by a pattern: a shell glob, or after `re:` a regular expression run by RE2.

Python's `re` backtracks: `(a+)+$` or `(.*\\.)*mlp\\..*` takes exponential time on a name that almost
matches, and a recipe or a checkpoint's config is untrusted text. RE2 (google-re2, the maintained
binding of Google's engine) runs every pattern in time linear in the name, whatever the pattern, and
refuses what no automaton runs: backreferences, lookaround, possessive repeats, and repeats counted past
1000 in all. For the names of tensors its syntax is Python's: the same classes, groups and flags
(`(?i)`, `(?s)`, `(?m)`), except that `\\d`, `\\w` and `\\s` are ASCII classes and `$` ends the name
(Python's also matches before a final newline, which no tensor name has).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from fnmatch import fnmatchcase

import re2

REGEX_PREFIX = "re:"
REGEX_HINT = ("re: patterns run on RE2, in time linear in the name: write the rules in order instead (the first "
              "rule that matches a name decides), or use a shell glob without the re: prefix")

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # RE2 would print its own line on stderr: the refusal says it instead


class PatternRefused(ValueError):
    """A `re:` pattern RE2 will not compile (the message says why, the hint what to write instead)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.hint = REGEX_HINT


@functools.lru_cache(maxsize=512)
def regex_matcher(pattern: str) -> Callable[[str], bool]:
    """A test of whether `pattern` matches a whole name, linear in the name's length; `PatternRefused`
    where RE2 will not compile it."""
    try:
        compiled = re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else exc
        raise PatternRefused(str(reason)) from None
    return lambda name: compiled.fullmatch(name) is not None


def name_matcher(match: str) -> Callable[[str], bool]:
    """A recipe's `match`: a shell glob on the full name (`fnmatchcase`), or after `re:` a regular expression
    that must match the whole name (`regex_matcher`)."""
    if match.startswith(REGEX_PREFIX):
        return regex_matcher(match[len(REGEX_PREFIX) :])
    return lambda name: fnmatchcase(name, match)
