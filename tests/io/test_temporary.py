"""The temporary-file lifecycle: beside the target, synced, renamed into place only at the commit, removed
otherwise; and a killed writer's file told from a running one's by its process id."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from qcli.io import temporary
from qcli.io.temporary import TemporaryFile, left_by_killed_run, leftover_temporaries, sync


def test_the_target_is_replaced_only_by_the_commit(tmp_path: Path) -> None:
    target = tmp_path / "m.bpk"
    target.write_bytes(b"old")
    file = TemporaryFile(target)
    with file.create() as out:
        out.write(b"new")
        sync(out)
    assert file.path.parent == tmp_path and file.path.name.startswith(".m.bpk.")
    assert target.read_bytes() == b"old" and file.path.read_bytes() == b"new"
    file.commit()
    file.discard()  # after the commit, nothing to remove: the target stays
    assert target.read_bytes() == b"new" and sorted(p.name for p in tmp_path.iterdir()) == ["m.bpk"]


def test_a_discarded_file_leaves_the_folder_as_it_was(tmp_path: Path) -> None:
    target = tmp_path / "m.bpk"
    target.write_bytes(b"old")
    file = TemporaryFile(target)
    with file.create() as out:
        out.write(b"partial")
    file.discard()
    file.discard()  # twice, as an error path and the context's exit both may
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.bpk"] and target.read_bytes() == b"old"


def test_two_files_for_one_target_do_not_share_a_name(tmp_path: Path) -> None:
    assert TemporaryFile(tmp_path / "m.bpk").path != TemporaryFile(tmp_path / "m.bpk").path


def test_the_data_is_synced_before_the_rename_and_the_folder_after_it(tmp_path: Path, monkeypatch) -> None:
    """POSIX durability: fsync the file, rename, fsync the folder that holds the new name."""
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    def replace(src: object, dst: object) -> None:
        events.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(temporary.os, "fsync", fsync)
    monkeypatch.setattr(temporary.os, "replace", replace)
    file = TemporaryFile(tmp_path / "m.bpk")
    with file.create() as out:
        out.write(b"x")
        sync(out)
    file.commit()
    assert events == ["file", "rename", "folder"]


def test_leftovers_are_the_files_of_writers_that_no_longer_run(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a process id that no longer runs
    target = tmp_path / "m.bpk"
    dead = tmp_path / f".m.bpk.{child.pid}-3.tmp"
    live = tmp_path / f".m.bpk.{os.getpid()}-0.tmp"  # this process: a writer still at work
    other = tmp_path / f".n.bpk.{child.pid}-0.tmp"  # another target's
    for path in (dead, live, other, tmp_path / "m.bpk.tmp"):
        path.write_bytes(b"")
    assert leftover_temporaries(target) == [(dead, child.pid)]
    assert left_by_killed_run(dead) and left_by_killed_run(other)
    assert not left_by_killed_run(live) and not left_by_killed_run(tmp_path / "m.bpk.tmp")
