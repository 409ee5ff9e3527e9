"""The docs hold together: every relative link leads to a file of the repository."""

from __future__ import annotations

import re

import pytest

from tests.cli_support import ROOT

LINKED = ["README.md", "docs/cli.md", "docs/output.md", "docs/ci.md", "sample_weights/README.md"]


@pytest.mark.parametrize("doc", LINKED)
def test_relative_links_resolve(doc):
    path = ROOT / doc
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", path.read_text()):
        assert (path.parent / target).exists(), f"{doc} links to missing {target}"
