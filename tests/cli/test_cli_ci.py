"""The CI material works as written: the pre-commit hooks and the GitHub Actions job in docs/ci.md."""

from __future__ import annotations

import re
import shlex

import yaml

from tests.cli_support import ROOT, SAMPLES, SINGLE, cli

HOOKS = ROOT / ".pre-commit-hooks.yaml"
CI_DOC = ROOT / "docs" / "ci.md"
RECIPE = SAMPLES / "tiny-llama.toml"


def test_pre_commit_hooks_run_validate_scheme_on_recipes():
    hooks = {h["id"]: h for h in yaml.safe_load(HOOKS.read_text())}
    assert set(hooks) == {"qcli-validate-scheme", "qcli-validate-scheme-system"}
    for hook in hooks.values():
        assert hook["entry"] == "qcli validate-scheme"
        files = re.compile(hook["files"])
        assert files.search("recipes/llama.toml") and files.search("quant/llama.qcli.toml")
        assert not files.search("pyproject.toml")
        # pre-commit appends the staged file names to the entry
        args = shlex.split(hook["entry"])[1:] + [str(RECIPE), str(RECIPE)]
        assert cli(*args).code == 0


def test_github_job_parses_and_its_command_runs():
    block = re.search(r"```yaml\n(name: qcli recipes.*?)```", CI_DOC.read_text(), re.S).group(1)
    job = yaml.safe_load(block)["jobs"]["validate-scheme"]
    runs = [step["run"] for step in job["steps"] if "run" in step]
    check = next(r for r in runs if r.startswith("qcli "))
    args = [str(RECIPE) if a == "recipes/*.toml" else a for a in shlex.split(check)[1:]]
    result = cli(*args)
    assert result.code == 0 and result.out.startswith("qcli validate-scheme")
    assert cli(*args, "--model", SINGLE).code == 0
