"""Run a command's entry point in the test process, as its own process would run it.

A ``python train.py`` process spends ~9 s importing torch, Lightning and Hydra before it
does anything; the test process has imported them already. ``run_in_process`` calls the
entry point (``segscale.cli.train.main``, ...) with the command line in ``sys.argv``,
and gives what the process would: its exit status (``sys.exit``'s), stdout and stderr.

Use it where the process itself is not what a test checks. The processes a run starts
(DDP ranks, the parallel launcher's jobs) run the program of ``__main__``, here pytest:
a DDP run needs a process of its own (tests/cli/test_sweeps.py ``jobs_run_train_py``
shows the way for the parallel launcher).
"""

from __future__ import annotations

import io
import logging
import os
import subprocess
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from unittest import mock

from hydra.core.hydra_config import HydraConfig


def run_in_process(
    main: Callable[[], object],
    *args: str,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    program: str = "train.py",
) -> subprocess.CompletedProcess[str]:
    """``main()`` with ``sys.argv = [program, *args]``, in ``cwd`` with ``env`` added.

    An exception that leaves ``main`` is what Python does with it in a process: its
    traceback on stderr, exit status 1. (Hydra lets one through under a debugger or
    with ``HYDRA_FULL_ERROR=1``, where it would print it and exit 1 otherwise.)
    """
    out, err = io.StringIO(), io.StringIO()
    code: int = 0
    with (
        _process_state(cwd, env),
        mock.patch("sys.argv", [program, *args]),
        redirect_stdout(out),
        redirect_stderr(err),
    ):
        try:
            main()
        except SystemExit as stop:
            code = _exit_status(stop.code, err)
        except Exception:  # as the interpreter of a process would report it
            traceback.print_exc(file=err)
            code = 1
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def _exit_status(code: object, err: io.StringIO) -> int:
    """The status a process exits with after ``sys.exit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    err.write(f"{code}\n")  # Python prints a message and exits 1
    return 1


@contextmanager
def _process_state(cwd: Path | None, env: Mapping[str, str] | None) -> Iterator[None]:
    """What a process would have had to itself: the folder, the environment, logging.

    Hydra configures the root logger (a console and a log file in the run folder) and
    sets its process-wide config: both are put back as they were, so that the next run
    in this process neither logs into this one's file nor sees its Hydra config.
    """
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    hydra_config = HydraConfig.instance().cfg
    folder = os.getcwd()
    with mock.patch.dict(os.environ, dict(env or {})):
        try:
            if cwd is not None:
                os.chdir(cwd)
            yield
        finally:
            os.chdir(folder)
            for handler in root.handlers:
                if handler not in handlers:
                    handler.close()
            root.handlers[:] = handlers
            root.setLevel(level)
            HydraConfig.instance().cfg = hydra_config
