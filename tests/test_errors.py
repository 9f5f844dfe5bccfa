import errno
import os

from segscale.errors import disk_full_error, disk_full_message
from segscale.models.checkpoint.files import CheckpointWriteError


def full(filename: str | None = None, code: int = errno.ENOSPC) -> OSError:
    return OSError(code, os.strerror(code), filename)


def test_the_write_that_met_the_full_disk_is_found_under_what_followed():
    first = full("/run/checkpoints/last.ckpt")
    first.__context__ = full()  # a write before it, to the same file: its name unknown
    wrapper = CheckpointWriteError("the checkpoint could not be written")
    wrapper.__cause__ = first
    report = full("/run/summary.json")  # the report of the failure fails too
    report.__context__ = wrapper
    assert disk_full_error(report) is first
    quota = full(code=errno.EDQUOT)
    assert disk_full_error(RuntimeError("wrapped")) is None
    wrapped = RuntimeError("wrapped")
    wrapped.__cause__ = quota
    assert disk_full_error(wrapped) is quota


def test_other_os_errors_are_not_a_full_disk():
    assert disk_full_error(full("/run/x", errno.EACCES)) is None
    assert disk_full_error(FileNotFoundError(errno.ENOENT, "gone", "/x")) is None
    looping = full(code=errno.EIO)
    looping.__context__ = looping  # a cycle ends the walk
    assert disk_full_error(looping) is None


def test_the_message_says_what_where_why_and_what_to_do():
    message = disk_full_message(full("/run/a.ckpt"), "/run", "free space there")
    assert message.splitlines() == [
        "/run/a.ckpt could not be written: no space left on device",
        "  the output folder: /run",
        "  free space there",
    ]
    assert disk_full_message(full(), "/run", "").startswith("a file could not be written")
