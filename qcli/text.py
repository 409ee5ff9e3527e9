"""Text read from a hostile file, made safe to show.

`printable` keeps it on one terminal line, `shown` bounds its length and depth, `clipped` cuts a piece of text
short in the middle (a name, a path, another library's message), and `quoted` quotes a tensor name cut short."""

from __future__ import annotations

import reprlib
import unicodedata

# Characters that would break a one-line message or drive the terminal: C0 and C1 controls (ESC among
# them) and DEL, the line and paragraph separators (str.splitlines() breaks on them), and the bidi
# controls that reorder what a terminal shows.
_BIDI = {0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)}


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(ch: str) -> str:
    code = ord(ch)
    if unicodedata.category(ch) in ("Cc", "Zl", "Zp") or code in _BIDI:
        return _NAMED.get(ch) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
    return ch


def printable(text: object) -> str:
    """`text` with every control character escaped (`\\x1b`, `\\n`, `\\u2028`), safe on one terminal line."""
    text = str(text)
    if text.isprintable():  # the common case: nothing to escape (spaces and non-ASCII letters pass)
        return text
    return "".join(_escaped(ch) for ch in text)


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxtuple, _SHORT.maxdict = 3, 6, 6, 4
_SHORT.maxstring, _SHORT.maxlong, _SHORT.maxother = 60, 40, 60


def shown(value: object) -> str:
    """A bounded repr of a value read from a hostile file: nesting, lengths and long numbers cut short, so
    a message stays one short line (and a shared or deep structure is never walked in full)."""
    try:
        return printable(_SHORT.repr(value))
    except (ValueError, RecursionError):  # an int over Python's digit limit, a structure too deep
        return f"<{type(value).__name__}>"


MAX_NAME_SHOWN = 200  # characters of a name, a path or another library's message that a message shows


def clipped(text: object, limit: int = MAX_NAME_SHOWN) -> str:
    """`text` as it is up to `limit` characters; a longer one cut in the middle, keeping its start and end
    (where a path's file name and a name's last parts are) and saying how long it was. Each piece of user
    text is cut on its own, so a message keeps the file it names however long the piece beside it."""
    text = str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit // 2]}...({len(text)} characters)...{text[-limit // 4:]}"


def quoted(name: str) -> str:
    """A tensor name for a message, quoted; a very long one is cut in the middle (`clipped`)."""
    return f"'{clipped(name)}'"
