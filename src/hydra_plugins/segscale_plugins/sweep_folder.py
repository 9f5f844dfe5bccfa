"""The sweep folder's lock: one sweep per ``hydra.sweep.dir`` at a time.

Two sweeps into one folder would write their jobs into the same numbered folders and
mix their summaries. A sweeper holds the folder (``RunFolderLock``, as a run holds its
run folder) from before its first job until its summary is written; a second sweep
started into it is refused with one line naming the holder, and exit status 2. A
search resumed later (Optuna) takes the folder over once the first has ended.
"""

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from segscale.errors import EXIT_BAD_INPUT, ConfigError
from segscale.runs.folder import RunFolderLock

log = logging.getLogger(__name__)


@contextmanager
def sweep_folder_held(sweep_dir: Path) -> Iterator[None]:
    """Hold ``sweep_dir`` for the sweep inside; refuse (exit 2) if another sweep holds it.

    ``SystemExit``, unlike an exception, passes through Hydra's error report, which
    would print a traceback.
    """
    lock = RunFolderLock(sweep_dir, what="sweep", key="hydra.sweep.dir")
    try:
        lock.acquire()
    except ConfigError as error:
        log.error("%s", error)
        sys.exit(EXIT_BAD_INPUT)
    try:
        yield
    finally:
        lock.release()
