"""Elastic restarts: torchrun restarts the group after a rank dies, the run resumes once."""

import csv
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, tiny_overrides

# 2 ranks × 4 iterations an epoch (16 patches of 2 images, 4 a batch, shared by the ranks),
# 2 epochs: 8 steps, as an uninterrupted run takes. A checkpoint every 2 iterations lands
# mid-epoch.
ELASTIC = [
    "strategy=ddp",
    "trainer.devices=2",
    "ckpt_path=auto",
    "datamodule.patches_per_image=16",
    "callbacks.periodic_checkpoint.frequency=2",
    "callbacks.periodic_checkpoint.unit=iteration",
]
STEPS = 8
# torchrun's c10d rendezvous shares its store with the ranks, and a restarted group finds
# the dead group's gloo addresses there: it then fails ("Connection refused") or hangs in
# its first collective (pytorch/pytorch#135712). A store of its own for each restart:
UNSHARED_STORE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (read from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (name) state ppid ...": the name may hold spaces, so split after it.
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # a process that just ended
            continue
        if ppid == pid:
            found.append(int(stat.parent.name))
    return found


def local_rank(pid: int) -> str | None:
    """The ``LOCAL_RANK`` torchrun gave the process ``pid``, if any."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    ranks = [v.split(b"=", 1)[1].decode() for v in environ if v.startswith(b"LOCAL_RANK=")]
    return ranks[0] if ranks else None


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, ended but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_a_killed_rank_is_restarted_and_the_run_resumes(tiny_data_root, tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    overrides = [o for o in tiny_overrides(tiny_data_root, Path()) if "output_dir" not in o]
    job = subprocess.Popen(
        [
            torchrun,
            "--nproc-per-node=2",
            "--max-restarts=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            "--rdzv-id=elastic",
            str(REPO / "train.py"),
            *overrides,
            *ELASTIC,
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=os.environ | {"OMP_NUM_THREADS": "1"} | UNSHARED_STORE,
    )
    ranks: dict[str | None, int] = {}
    try:
        run = tmp_path / "outputs" / "train" / "job-elastic"
        deadline = time.monotonic() + 120
        while not list(run.glob("checkpoints/epoch*-step*.ckpt")):
            assert job.poll() is None and time.monotonic() < deadline, "no checkpoint"
            time.sleep(0.02)
        ranks = {local_rank(pid): pid for pid in children(job.pid)}
        assert set(ranks) == {"0", "1"}, ranks
        os.kill(ranks["1"], signal.SIGKILL)  # a rank dies mid-epoch
        killed = time.monotonic()
        while alive(ranks["0"]):
            assert time.monotonic() - killed < 60, "the surviving rank did not stop"
            time.sleep(0.05)
        print(f"the surviving rank exited {time.monotonic() - killed:.1f} s after the kill")
        output = job.communicate(timeout=120)[0]
    finally:
        if job.poll() is None:  # no process left behind, whatever failed
            for pid in [*children(job.pid), job.pid]:
                os.kill(pid, signal.SIGKILL)
            job.communicate()
    assert job.returncode == 0, output[-3000:]
    # torchrun restarted the group once; it resumed from a checkpoint of the first launch,
    # in the same run folder, and finished there.
    assert [p.name for p in (tmp_path / "outputs" / "train").iterdir()] == [run.name]
    assert re.search(
        r"Restored all states from the checkpoint at .*/job-elastic/checkpoints/"
        r"epoch000-step\d+\.ckpt",
        output,
    ), output[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished"
    assert summary["steps"] == STEPS and summary["world_size"] == 2
    log = (run / "train.log").read_text()
    assert log.count("scaling: Effective") == 2  # the first launch and the restarted one
    with (run / "metrics.csv").open(newline="") as file:
        trained = [int(row["step"]) for row in csv.DictReader(file) if row["train/loss"]]
    assert trained == list(range(STEPS))  # each step once, those before the kill kept
