"""A model named `ORG/NAME` found in the local Hugging Face cache, offline: never a download.

The layout is huggingface_hub's (its `constants.py` and `file_download.py`): the cache folder is
`$HF_HUB_CACHE`, else `$HUGGINGFACE_HUB_CACHE`, else `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`,
else `~/.cache/huggingface/hub`; a model `ORG/NAME` lives in `models--ORG--NAME/`, where `refs/REVISION`
holds the commit a branch or tag names and `snapshots/COMMIT/` the files (links into `blobs/`). Read by
hand: three path joins need no library, and none of them can reach the network.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from qcli.errors import InputError, UsageError
from qcli.io.files import read_bounded
from qcli.text import printable

DEFAULT_REVISION = "main"
# A Hub repository id: an owner and a name of letters, digits, `-`, `_` and `.` (huggingface_hub's
# validate_repo_id, which also refuses `--` and `..` in either).
_REPO_ID = re.compile(r"[\w.-]{1,96}/[\w.-]{1,96}")
_COMMIT = re.compile(r"[0-9a-f]{40}")


def is_model_name(text: str) -> bool:
    """`ORG/NAME`, the form of a Hub model id (not a path that exists: the caller checks that first)."""
    return (_REPO_ID.fullmatch(text) is not None and "--" not in text and ".." not in text
            and not text.startswith(".") and not text.endswith("."))


def cache_folder() -> Path:
    """Where huggingface_hub keeps its cache, from the environment as it reads it."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            return _expanded(os.environ[variable])
    if os.environ.get("HF_HOME"):
        return _expanded(os.environ["HF_HOME"]) / "hub"
    return _expanded(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface" / "hub"


def snapshot(name: str, revision: str | None = None) -> Path:
    """The folder of model `name` (`ORG/NAME`) at `revision` (a branch, a tag or a commit; default main)
    in the local cache; InputError naming where it looked when the cache does not hold it."""
    revision = revision or DEFAULT_REVISION
    if revision.startswith("/") or any(part in ("", ".", "..") for part in revision.split("/")):
        raise UsageError(printable(f"--revision {revision!r} is not a branch, a tag or a commit"),
                         hint="give a branch or tag name (main) or a 40-hex commit")
    repo = cache_folder() / f"models--{name.replace('/', '--')}"
    ref = repo / "refs" / revision
    commit = revision if _COMMIT.fullmatch(revision) else _read_ref(ref)
    folder = repo / "snapshots" / commit if commit else None
    if folder is None or not folder.is_dir():
        looked = ref if commit is None else folder
        raise InputError(
            printable(f"{name} is neither a file or folder here nor a model in the Hugging Face cache at "
                      f"revision {revision} (looked for {looked})"),
            hint=printable(f"download it first with `hf download {name}` (or set HF_HUB_CACHE "
                           "to the cache that holds it); qcli never downloads"))
    return folder


MAX_REF_BYTES = 4096  # a ref file holds a 40-hex commit


def _read_ref(ref: Path) -> str | None:
    """The commit a ref file names, or None where there is none. The ref is read as a regular file of at most
    MAX_REF_BYTES (`read_bounded`): a FIFO or a link to /dev/zero there is refused, never waited on or read
    forever."""
    if not ref.exists():
        return None
    data = read_bounded(ref, MAX_REF_BYTES, "the ref file",
                        hint="a ref of the Hugging Face cache holds a commit; download the model again")
    text = data.decode("ascii", "replace").strip()
    return text if _COMMIT.fullmatch(text) else None


def _expanded(text: str) -> Path:
    return Path(os.path.expandvars(os.path.expanduser(text)))
