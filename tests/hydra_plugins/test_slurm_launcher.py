"""hydra/launcher=slurm cannot run here: check what it would submit."""

import pytest
from hydra.core.plugins import Plugins
from submitit.slurm.slurm import SlurmExecutor

from tests.conftest import compose_for_plugins


class SubmittedError(Exception):
    """Raised instead of calling sbatch."""


def test_slurm_jobs_ask_for_one_task_per_gpu_on_every_node(monkeypatch, tmp_path):
    scripts = []

    def capture(executor, command):
        scripts.append(executor._make_submission_file_text(command, "uid"))
        raise SubmittedError

    monkeypatch.setattr(SlurmExecutor, "_submit_command", capture)
    monkeypatch.setattr(SlurmExecutor, "affinity", classmethod(lambda cls: 1))  # "srun exists"
    config, context = compose_for_plugins(
        "hydra/launcher=slurm",
        f"hydra.sweep.dir={tmp_path}",
        "strategy=ddp",
        "trainer.devices=4",
        "trainer.num_nodes=2",
        "hydra.launcher.partition=gpu",
        "hydra.launcher.timeout_min=60",
    )
    launcher = Plugins.instance().instantiate_launcher(
        hydra_context=context, task_function=lambda cfg: None, config=config
    )
    with pytest.raises(SubmittedError):
        launcher.launch([["optimizer.lr=0.01"]], initial_job_idx=0)
    (script,) = scripts
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=60",
        "#SBATCH --signal=USR2@120",
    ):
        assert line in script, script
    assert "srun" in script
