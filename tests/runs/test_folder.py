import errno
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import sys

import pytest
import yaml
from omegaconf import OmegaConf

from segscale.errors import ConfigError
from segscale.runs.folder import (
    LOCK_FILE,
    RunFolderBusyError,
    RunFolderLock,
    check_fresh_folder,
    has_launch_record,
    launch_record,
    write_launch_record,
)

HOLD = (
    "import sys, time\n"
    "from segscale.runs.folder import RunFolderLock\n"
    "lock = RunFolderLock(sys.argv[1])\n"  # kept: filelock releases a lock collected
    "lock.acquire()\n"
    "print('held', flush=True)\n"
    "time.sleep(120)\n"
)
KILLED_WITHOUT_FLOCK = (  # what a run's lock is without flock: filelock's soft lock
    "import os, sys\n"
    "from filelock import SoftFileLock\n"
    "lock = SoftFileLock(os.path.join(sys.argv[1], '.lock'))\n"
    "lock.acquire()\n"
    "print(os.getpid(), flush=True)\n"
    "os._exit(0)\n"  # killed: nothing released
)


def test_a_live_holder_is_named_and_a_dead_ones_lock_is_taken_over(tmp_path, caplog):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(
            RunFolderBusyError, match=rf"in use by another run \(pid {holder.pid} on host"
        ):
            RunFolderLock(tmp_path).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)  # dies without releasing: its lock file stays
        holder.wait(timeout=30)
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == holder.pid
    with caplog.at_level(logging.WARNING), RunFolderLock(tmp_path):
        facts = json.loads((tmp_path / LOCK_FILE).read_text())
        assert facts["pid"] == os.getpid() and facts["host"] == socket.gethostname()
    assert f"ended without releasing it (pid {holder.pid}" in caplog.text
    assert not (tmp_path / LOCK_FILE).exists()  # released: the folder is as it was


def test_the_lock_is_exclusive_within_one_process_too(tmp_path):
    with RunFolderLock(tmp_path), pytest.raises(RunFolderBusyError):
        RunFolderLock(tmp_path).acquire()
    with RunFolderLock(tmp_path):  # released, so free again
        pass


@pytest.fixture
def no_flock(monkeypatch):
    """A file system without flock, as Lustre mounted without ``-o flock``."""

    def flock(fd, operation):
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr(fcntl, "flock", flock)


def test_without_flock_the_lock_file_itself_is_the_lock(tmp_path, caplog, no_flock):
    with RunFolderLock(tmp_path):
        # filelock's soft lock, its own record inside: the pid and the host.
        assert (tmp_path / LOCK_FILE).read_text().startswith(f"{os.getpid()}\n")
        with pytest.raises(RunFolderBusyError, match=rf"pid {os.getpid()} on host"):
            RunFolderLock(tmp_path).acquire()
    assert not (tmp_path / LOCK_FILE).exists()
    # A run killed on this host (no flock there either): its pid is gone, so its lock
    # is taken over.
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_WITHOUT_FLOCK, str(tmp_path)], capture_output=True, text=True
    )
    left = {"pid": int(killed.stdout)}
    assert (tmp_path / LOCK_FILE).read_text().startswith(f"{left['pid']}\n")
    with caplog.at_level(logging.WARNING), RunFolderLock(tmp_path):
        assert (tmp_path / LOCK_FILE).read_text().startswith(f"{os.getpid()}\n")
    assert f"ended without releasing it (pid {left['pid']}" in caplog.text
    # One from another host cannot be checked: refused, saying what to do.
    (tmp_path / LOCK_FILE).write_text(f"{left['pid']}\nelsewhere\n")  # filelock's record
    with pytest.raises(RunFolderBusyError, match=r"has no flock.*if that run has ended, delete"):
        RunFolderLock(tmp_path).acquire()


def test_holding_a_folder_removes_what_killed_writers_left(tmp_path):
    stale = tmp_path / "checkpoints" / ".best.ckpt.k2x9_q7a.tmp"
    stale.parent.mkdir()
    stale.write_bytes(b"half a checkpoint")
    with RunFolderLock(tmp_path):
        assert not stale.exists()


def test_each_launch_gets_its_own_record(tmp_path):
    assert not has_launch_record(tmp_path)
    for launch in (1, 2, 3):
        record = write_launch_record(tmp_path, launch_record(OmegaConf.create({"launch": launch})))
        assert record == tmp_path / ".hydra" / ("" if launch == 1 else f"launch-{launch}")
        assert has_launch_record(tmp_path)
    assert yaml.safe_load((tmp_path / ".hydra" / "config.yaml").read_text()) == {"launch": 1}
    launch3 = tmp_path / ".hydra" / "launch-3" / "config.yaml"
    assert yaml.safe_load(launch3.read_text()) == {"launch": 3}


def test_a_fresh_run_is_refused_a_folder_with_results(tmp_path):
    check_fresh_folder(tmp_path)
    (tmp_path / "train.log").write_text("a run that failed its checks\n")
    check_fresh_folder(tmp_path)  # nothing trained there
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"already holds a run \(checkpoints/\); continue it"):
        check_fresh_folder(tmp_path)
