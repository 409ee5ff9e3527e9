"""Writing a benchmark's results into docs/benchmarks.md: one section, found by its heading."""

from __future__ import annotations

from pathlib import Path


def replace_section(doc: Path, section: str) -> None:
    """Put `section` (its first line is its `## ` heading) in place of the file's section of the same heading,
    up to the next `## `, or append it."""
    heading = section.splitlines()[0]
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    start = text.find(heading)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(heading))
        text = text[:start] + section + ("" if end < 0 else "\n" + text[end + 1 :])
    doc.write_text(text)
