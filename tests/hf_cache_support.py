"""A Hugging Face cache laid out in a temporary folder as huggingface_hub lays it out when it downloads
(its file_download.py): `models--ORG--NAME/blobs/<etag>` holds each file's bytes, `snapshots/<commit>/NAME`
is a relative link to its blob, and `refs/<branch>` holds the commit, with no newline."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cached_model(cache: Path, repo_id: str, files: dict[str, bytes], commit: str,
                 refs: tuple[str, ...] = ("main",)) -> Path:
    """`files` cached for `repo_id` at `commit`, named by `refs`; the snapshot folder."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    for name, data in files.items():
        etag = hashlib.sha256(data).hexdigest()  # an LFS file's etag is its sha256
        (repo / "blobs" / etag).write_bytes(data)
        os.symlink(os.path.join("..", "..", "blobs", etag), snapshot / name)
    (repo / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
    return snapshot
