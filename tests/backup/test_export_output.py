"""``fq export --output PATH`` onto what is already at PATH: a symbolic link, a named pipe, a file with its mode."""

from __future__ import annotations

import os
import stat

import pytest

from django_fq import services as fq

from .test_backup import run_fq

pytestmark = pytest.mark.django_db

Q = "bk:out"
HEAD = '{"format":"django-fq"'


@pytest.fixture(autouse=True)
def _a_job():
    fq.enqueue(Q, {"n": 1})


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_symlink_is_kept_and_its_target_written(tmp_path):
    (tmp_path / "store").mkdir()
    target = tmp_path / "store" / "backup.jsonl"
    target.write_text("old\n")
    target.chmod(0o640)
    link = tmp_path / "latest.jsonl"
    link.symlink_to(target)

    code, _out, err = run_fq("export", "-o", str(link))

    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text().startswith(HEAD)
    assert mode(target) == 0o640
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["backup.jsonl"]  # no temporary file left


def test_a_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "latest.jsonl"
    link.symlink_to(tmp_path / "new.jsonl")
    code, _, err = run_fq("export", "-o", str(link))
    assert code == 0, err
    assert link.is_symlink() and (tmp_path / "new.jsonl").read_text().startswith(HEAD)
    assert mode(tmp_path / "new.jsonl") == 0o600


def test_a_failed_export_through_a_symlink_leaves_the_target_as_it_was(tmp_path):
    target = tmp_path / "backup.jsonl"
    target.write_text("old\n")
    link = tmp_path / "latest.jsonl"
    link.symlink_to(target)
    code, _, err = run_fq("export", "bk:missing", "-o", str(link))
    assert code == 1 and "no such queue" in err
    assert link.is_symlink() and target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backup.jsonl", "latest.jsonl"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")
def test_a_named_pipe_is_written_into_not_replaced(tmp_path):
    """``-o /dev/stdout`` or ``-o >(gzip > f)`` name a pipe: the export goes into it."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader is there: the writer never blocks
    try:
        code, _out, err = run_fq("export", "-o", str(fifo))
        got = b""
        while True:
            try:
                chunk = os.read(reader, 1 << 20)
            except BlockingIOError:
                break
            if not chunk:
                break
            got += chunk
    finally:
        os.close(reader)
    assert code == 0, err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced by a regular file"
    assert got.startswith(HEAD.encode()) and got.endswith(b"\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_a_file_keeps_its_mode_and_a_new_file_is_private(tmp_path):
    shared = tmp_path / "shared.jsonl"
    shared.write_text("old\n")
    shared.chmod(0o644)
    code, _, err = run_fq("export", "-o", str(shared))
    assert code == 0, err
    assert shared.read_text().startswith(HEAD) and mode(shared) == 0o644

    fresh = tmp_path / "fresh.jsonl"
    code, _, err = run_fq("export", "-o", str(fresh))
    assert code == 0, err
    assert mode(fresh) == 0o600


def test_a_directory_is_refused(tmp_path):
    code, _, err = run_fq("export", "-o", str(tmp_path))
    assert code == 1 and "is a directory" in err


def test_an_open_descriptor_holding_a_file_is_appended_to_not_replaced(tmp_path):
    """``fq export -o /dev/stdout >> backups.jsonl``: /dev/stdout resolves to the file itself (from a review)."""
    out = tmp_path / "backups.jsonl"
    out.write_text("earlier backup\n")
    fd = os.open(out, os.O_WRONLY | os.O_APPEND)  # what `>> backups.jsonl` gives the process as its stdout
    try:
        code, _out, err = run_fq("export", "-o", f"/proc/self/fd/{fd}")
        held, named = os.fstat(fd), os.stat(out)
    finally:
        os.close(fd)

    assert code == 0, err
    assert os.path.samestat(held, named), "the file behind the descriptor was replaced by a rename"
    text = out.read_text()
    assert text.startswith("earlier backup\n" + HEAD) and text.endswith("\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backups.jsonl"]
