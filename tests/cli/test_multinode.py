"""Two "nodes" on loopback: two torchrun launches train one run together."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, tiny_overrides


@pytest.mark.slow
def test_two_torchrun_nodes_train_one_run(tiny_data_root, tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    overrides = [o for o in tiny_overrides(tiny_data_root, Path()) if "output_dir" not in o]
    nodes = [
        subprocess.Popen(
            [
                torchrun,
                "--nnodes=2",
                f"--node-rank={node}",
                "--nproc-per-node=1",
                "--master-addr=127.0.0.1",
                f"--master-port={port}",
                "--rdzv-id=loopback",
                str(REPO / "train.py"),
                "strategy=ddp",
                "trainer.num_nodes=2",
                *overrides,
            ],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=os.environ | {"OMP_NUM_THREADS": "1"},
        )
        for node in (0, 1)
    ]
    outputs = [node.communicate(timeout=240)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
    # One run folder, named after the launcher's job id, shared by both nodes.
    (run,) = (tmp_path / "outputs" / "train").iterdir()
    assert run.name == "job-loopback"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["num_nodes"] == 2
    assert summary["train_patches"] == 2 * 16  # the two nodes shared each epoch
    # Only global rank 0 wrote the log.
    log = (run / "train.log").read_text()
    assert log.count("scaling: Effective") == 1
