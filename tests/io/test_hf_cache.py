"""A model named ORG/NAME found in the local Hugging Face cache (qcli/io/hf_cache.py), held to
huggingface_hub's own reading of the same layout: its `try_to_load_from_cache`, and the cache folder its
`constants` take from the environment."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from huggingface_hub import try_to_load_from_cache

from qcli.errors import InputError, UsageError
from qcli.io.hf_cache import cache_folder, is_model_name, snapshot
from tests.hf_cache_support import cached_model

MAIN = "a" * 40
TAGGED = "b" * 40
FILES = {"model.safetensors": b"weights", "config.json": b'{"model_type": "llama"}'}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    cached_model(root, "org/tiny", FILES, MAIN)
    cached_model(root, "org/tiny", {"model.safetensors": b"older"}, TAGGED, refs=("v1",))
    return root


@pytest.mark.parametrize("revision", [None, "main", "v1", MAIN, TAGGED])
def test_a_cached_model_resolves_where_huggingface_hub_finds_its_files(cache, revision):
    folder = snapshot("org/tiny", revision)
    for name in ("model.safetensors", "config.json"):
        found = try_to_load_from_cache("org/tiny", name, cache_dir=cache, revision=revision)
        if isinstance(found, str):
            assert str(folder / name) == found
        else:
            assert not (folder / name).exists()
    assert (folder / "model.safetensors").read_bytes() == (b"older" if revision in ("v1", TAGGED) else b"weights")


@pytest.mark.parametrize("name, revision", [("org/other", None), ("other/tiny", None), ("org/tiny", "v2"),
                                            ("org/tiny", "c" * 40)])
def test_a_model_the_cache_lacks_is_an_input_error_saying_where_it_looked_and_how_to_get_it(cache, name,
                                                                                            revision):
    assert try_to_load_from_cache(name, "config.json", cache_dir=cache, revision=revision) is None
    with pytest.raises(InputError) as raised:
        snapshot(name, revision)
    assert str(cache) in raised.value.message and name in raised.value.message
    assert f"`hf download {name}`" in raised.value.hint  # huggingface-hub 2.x's command line


@pytest.mark.parametrize("revision", ["../../x", "/etc", "a//b", "."])
def test_a_revision_that_is_a_path_is_refused(cache, revision):
    with pytest.raises(UsageError):
        snapshot("org/tiny", revision)


@pytest.mark.parametrize("env", [
    {"HF_HUB_CACHE": "/c/hub", "HF_HOME": "/c/home", "XDG_CACHE_HOME": "/c/xdg"},
    {"HUGGINGFACE_HUB_CACHE": "/c/legacy", "HF_HOME": "/c/home"},
    {"HF_HOME": "/c/home", "XDG_CACHE_HOME": "/c/xdg"},
    {"XDG_CACHE_HOME": "/c/xdg"},
    {"HF_HOME": "~/hf"},
    {},
], ids=lambda env: "+".join(env) or "none")
def test_the_cache_folder_is_the_one_huggingface_hub_takes_from_the_environment(env, monkeypatch):
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(variable, raising=False)
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    theirs = subprocess.run([sys.executable, "-c", "from huggingface_hub import constants; "
                             "print(constants.HF_HUB_CACHE)"], capture_output=True, text=True, check=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert str(cache_folder()) == theirs.stdout.strip()


@pytest.mark.parametrize("text, named", [
    ("org/name", True), ("Org-1/model_v2.5", True), ("name", False), ("a/b/c", False), ("/abs/path", False),
    ("org/../x", False), ("org--x/name", False), ("./name", False), ("org/name.", False), ("org/ name", False),
])
def test_only_the_form_of_a_hub_model_id_is_a_model_name(text, named):
    assert is_model_name(text) is named
