"""The docs hold together: every relative link leads to a file of the repository, and the README's test
command is the one CI runs."""

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


def test_ci_runs_the_readmes_test_command():
    """`.ci/run` runs the README's second set-up command (the tests) as one line of its own, its line breaks
    joined (before the same suite on the newest Python)."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Set up and run.*?```bash\n(.*?)```", readme, re.DOTALL).group(1)
    command = block.strip().splitlines()[1]
    ci = re.sub(r"\s*\\\n\s*", " ", (ROOT / ".ci/run").read_text())
    assert command in [line.strip() for line in ci.splitlines()], command
