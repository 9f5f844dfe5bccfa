import fcntl
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil

from segscale import atomic_files
from segscale.atomic_files import (
    current_umask,
    remove_stale_temporaries,
    temporary_beside,
    write_text_atomically,
)

# A writer killed (SIGKILL) halfway through a write: its temporary stays behind.
KILLED_WRITER = (
    "import sys, time\n"
    "from segscale.atomic_files import write_atomically\n"
    "def write(stream):\n"
    "    stream.write(b'x' * 4096); stream.flush()\n"
    "    print('writing', flush=True); time.sleep(120)\n"
    "write_atomically(sys.argv[1], write)\n"
)


def test_the_umask_is_read_without_being_changed(monkeypatch):
    expected = os.umask(0o027)  # set here, before the spy, and put back below
    try:
        calls = []
        monkeypatch.setattr(os, "umask", lambda mask: calls.append(mask) or 0)
        assert current_umask() == 0o027
        assert calls == []  # not set for an instant for every thread of the process
    finally:
        monkeypatch.undo()
        os.umask(expected)


def test_the_folder_is_flushed_after_the_rename(tmp_path, monkeypatch):
    flushed = []
    fsync = os.fsync

    def spy(fd):
        flushed.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        fsync(fd)

    monkeypatch.setattr(atomic_files.os, "fsync", spy)
    write_text_atomically(tmp_path / "summary.json", "{}")
    assert flushed == [False, True]  # the file, then its folder


def test_a_killed_writers_temporary_is_removed_a_live_ones_kept(tmp_path):
    writer = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(tmp_path / "best.ckpt")],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert writer.stdout.readline().strip() == "writing"
    (left,) = tmp_path.glob(".best.ckpt.*.tmp")
    assert remove_stale_temporaries(tmp_path) == []  # its writer is alive
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=30)
    assert left.exists()
    live = temporary_beside(tmp_path / "last.ckpt")  # another writer's, live
    unrelated = tmp_path / ".notes.tmp"
    unrelated.write_text("not ours")
    with open(live, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert remove_stale_temporaries(tmp_path) == [left]
    assert not left.exists() and live.exists() and unrelated.exists()


def open_here() -> set[str]:
    """The files this process has open."""
    return {f.path for f in psutil.Process().open_files()}


def test_the_temporary_is_renamed_open_and_locked_here_closed_on_windows(tmp_path, monkeypatch):
    # Windows renames no open file (WinError 32): there the temporary is closed first.
    replace, open_at_rename = os.replace, []

    def spy(source, target):
        open_at_rename.append(str(source) in open_here())
        replace(source, target)

    monkeypatch.setattr(atomic_files.os, "replace", spy)
    write_text_atomically(tmp_path / "a.json", "{}")
    monkeypatch.setattr(sys, "platform", "win32")
    write_text_atomically(tmp_path / "b.json", "[]")
    assert open_at_rename == [True, False]
    assert (tmp_path / "a.json").read_text() == "{}" and (tmp_path / "b.json").read_text() == "[]"
    assert not list(tmp_path.glob(".*.tmp"))


def test_on_windows_a_stale_temporary_is_deleted_closed_and_a_recent_one_kept(
    tmp_path, monkeypatch
):
    # A writer there lets go of its lock an instant before its rename: only a temporary
    # unchanged for SETTLED_S is stale, and it is deleted once no descriptor holds it.
    monkeypatch.setattr(sys, "platform", "win32")
    stale, recent = temporary_beside(tmp_path / "a.npy"), temporary_beside(tmp_path / "b.npy")
    settled = time.time() - atomic_files.SETTLED_S - 1
    os.utime(stale, (settled, settled))
    unlink, open_at_unlink = Path.unlink, []

    def spy(path, missing_ok=False):
        open_at_unlink.append(str(path) in open_here())
        unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", spy)
    assert remove_stale_temporaries(tmp_path) == [stale]
    assert open_at_unlink == [False]
    assert recent.exists() and not stale.exists()


def test_a_file_is_flushed_to_disk_unless_it_need_not_be_durable(tmp_path, monkeypatch):
    flushed = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: flushed.append(fd) or real(fd))
    write_text_atomically(tmp_path / "kept.txt", "kept")
    assert len(flushed) == 2  # the file and its folder
    flushed.clear()
    write_text_atomically(tmp_path / "cached.txt", "cached", durable=False)
    assert flushed == [] and (tmp_path / "cached.txt").read_text() == "cached"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
