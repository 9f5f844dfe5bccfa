"""Resuming a stopped run: which checkpoint, and which run folder it continues in.

``ckpt_path=last`` means the newest checkpoint of the newest run of this task under
``outputs/<task_name>/``; ``ckpt_path=<run>/checkpoints/<file>.ckpt`` means that file;
``ckpt_path=auto`` means this run folder's newest checkpoint if it has one, else a
fresh start (for a job that a cluster requeues into its own folder after preemption).
Either way the resumed run writes into the folder of the run it continues: the
``segscale.run_dir`` resolver in ``hydra.run.dir`` picks it before Hydra creates a
new one.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import lightning as L
from omegaconf import OmegaConf

from segscale.errors import ConfigError
from segscale.models.checkpoint.reading import Checkpoint, read_checkpoint
from segscale.training.ranks.launch import launcher_job_id

if TYPE_CHECKING:
    from segscale.models.module import SegmentationModule

log = logging.getLogger(__name__)


def newest_checkpoint(run_dir: Path) -> Path | None:
    """The most recently written ``*.ckpt`` in ``run_dir/checkpoints`` (``last.ckpt`` on ties)."""
    found = list((run_dir / "checkpoints").glob("*.ckpt"))
    if not found:
        return None
    return max(found, key=lambda p: (p.stat().st_mtime_ns, p.name == "last.ckpt"))


def latest_run(task_root: Path) -> Path | None:
    """The most recently modified run folder under ``task_root`` that has a checkpoint."""
    runs = [d for d in task_root.glob("*") if d.is_dir() and newest_checkpoint(d)]
    # Each of runs has a checkpoint (the filter above).
    return (
        max(runs, key=lambda d: cast(Path, newest_checkpoint(d)).stat().st_mtime_ns)
        if runs
        else None
    )


def run_dir_for(ckpt_path: str | None, task_root: str, fresh_dir: str) -> str:
    """The run folder of a job: the resumed run's folder, or a new one.

    A new run of ranks that torchrun (``--rdzv-id``) or SLURM started on several nodes
    is named after the launcher's job id, so that every node picks the same folder;
    otherwise it is ``fresh_dir`` (a timestamp).
    """
    if not ckpt_path or ckpt_path == "auto":
        job_id = launcher_job_id()
        return str(Path(task_root) / f"job-{job_id}") if job_id else fresh_dir
    if ckpt_path == "last":
        run = latest_run(Path(task_root))
        return str(run) if run else fresh_dir
    path = Path(ckpt_path)
    return str(path.parent.parent) if path.parent.name == "checkpoints" else fresh_dir


def register_run_dir_resolver() -> None:
    """Let ``hydra.run.dir`` ask ``${segscale.run_dir:...}`` for the folder a resume continues.

    ``conf/train.yaml`` uses it, so it must be registered before a train config is
    composed (by ``train.py``, or by the Python API).
    """
    OmegaConf.register_new_resolver("segscale.run_dir", run_dir_for, replace=True)


def resolve_checkpoint(ckpt_path: str | None, output_dir: str) -> str | None:
    """The checkpoint file ``ckpt_path`` names (``check_resumable`` checks its content)."""
    if not ckpt_path:
        return None
    if ckpt_path == "auto":
        found = newest_checkpoint(Path(output_dir))
        return resolve_checkpoint(str(found), output_dir) if found else None
    if ckpt_path == "last":
        found = newest_checkpoint(Path(output_dir))
        if found is None:
            raise ConfigError(
                f"ckpt_path=last: no checkpoint in {output_dir}/checkpoints; expected a run "
                "of this task with a checkpoint, or ckpt_path=<path to a .ckpt file>"
            )
        path = found
    else:
        path = Path(ckpt_path)
        if not path.is_file():
            raise ConfigError(f"ckpt_path={ckpt_path!r}: no such file; expected a .ckpt file")
    return str(path)


def read_resumed(path: str) -> Checkpoint:
    """The checkpoint a resume continues, read once (``check_resumable`` checks it).

    Read weights-only and verified against its digest, before any rank starts; its
    record, if any, must be of this segscale's format and make sense.
    """
    return read_checkpoint(path, "ckpt_path", record_required=False)


def check_resumable(checkpoint: Checkpoint, module: SegmentationModule) -> Checkpoint:
    """Refuse a checkpoint (``read_resumed``) whose network is not the one ``module`` has.

    Its state must cover the module exactly (the same architecture, encoder and classes),
    so that a resume with a forgotten override stops here with the differences named,
    not inside Lightning. Returns it, read, for the fit to take (``SafeCheckpointIO.hand_over``).
    """
    path = str(checkpoint.path)
    record = checkpoint.record
    hint = "resume with the overrides the run was started with (its .hydra/overrides.yaml)"
    if record is not None and list(record.class_names) != list(module.class_names):
        raise ConfigError(
            f"ckpt_path={path!r} was trained on the classes {list(record.class_names)}, this "
            f"config has {list(module.class_names)}; {hint}"
        )
    mismatch = checkpoint.state_mismatch(module.state_dict())
    if mismatch:
        ours = (module.inference_metadata or {}).get("model", {})
        differences = _differences(record.model if record is not None else {}, ours)
        raise ConfigError(
            f"ckpt_path={path!r} holds another network than this config builds"
            f"{f' ({differences})' if differences else ''}: {mismatch.describe()}; {hint}"
        )
    return checkpoint


def checkpoint_of_rank_zero(trainer: L.Trainer, ckpt_path: str | None) -> str | None:
    """The checkpoint that rank 0 resolved ``ckpt_path=auto`` to, on every rank.

    ``auto`` is resolved by file times, on each rank: ranks that torchrun or SLURM
    started on several nodes could see the run folder differently (a file written
    late, a node's cached view) and resume from different checkpoints. So every rank
    of a job whose processes exist before ``Trainer.fit`` (started by torchrun, SLURM
    or segscale's own launcher) calls this: it sets up the process group as
    ``Trainer.fit`` would (which then finds it set up) and takes rank 0's choice from
    it. A run in one process, or whose ranks Lightning spawns inside ``fit`` (they get
    the parent's choice), returns ``ckpt_path`` as it is.
    """
    strategy = trainer.strategy
    environment = getattr(strategy, "cluster_environment", None)
    if environment is None or not environment.creates_processes_externally:
        return ckpt_path
    if trainer.world_size < 2:
        return ckpt_path
    strategy.setup_environment()
    agreed = strategy.broadcast(ckpt_path, src=0)
    if agreed != ckpt_path:
        log.info(
            "ckpt_path=auto: rank %d found %s, rank 0 %s: resuming from rank 0's",
            trainer.global_rank,
            ckpt_path,
            agreed,
        )
    return agreed


def _differences(theirs: dict[str, Any], ours: dict[str, Any]) -> str:
    """``model.<key>``: the checkpoint's value against this config's, for each that differs."""
    keys = [k for k in {**theirs, **ours} if theirs.get(k) != ours.get(k)]
    return ", ".join(
        f"model.{k}: checkpoint {theirs.get(k)!r}, config {ours.get(k)!r}" for k in keys
    )
