"""The GPU tier: what only a CUDA device shows (docs/architecture.md), skipped without one.

Training in each precision with channels_last, torch.compile against eager, a resume,
predict / evaluate / export from a GPU-trained checkpoint and that checkpoint on the CPU
and back, the host syncs of a training step counted by CUDA itself, and two DDP ranks
sharing one GPU (over gloo, as two single-device nodes) equal to one process, in bf16
with synchronized batch norm, and the GPU's copies through pinned host memory that bench's
gloo link takes. `experiments/gpu/run.sh` runs this tier on a GPU machine.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from tests.conftest import REPO, compose_config, tiny_overrides
from tests.in_process import run_in_process
from tests.training.record_dtype import recorded_dtypes

from segscale.bench.predict.host_staged_link import measure_copies
from segscale.cli import evaluate as evaluate_cli
from segscale.cli import export as export_cli
from segscale.cli import predict as predict_cli
from segscale.models.module import SegmentationModule
from segscale.training.run.training_run import train

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

EXPECTED_DTYPE = {
    "32-true": "torch.float32",
    "bf16-mixed": "torch.bfloat16",
    "16-mixed": "torch.float16",
}


def gpu_overrides(data_root: Path, output_dir: Path | None) -> list[str]:
    """The tiny run of the CPU suite, on the GPU, without the figures."""
    return [
        *(o for o in tiny_overrides(data_root, output_dir) if "accelerator" not in o),
        "trainer.accelerator=gpu",
        "trainer.devices=1",
        "callbacks.validation_report.num_samples=0",
    ]


def gpu_train(data_root: Path, run: Path, *overrides: str) -> dict:
    """``train()`` of the tiny GPU run into ``run``; its summary."""
    return train(compose_config("train", *gpu_overrides(data_root, run), *overrides))


def train_losses(run: Path) -> dict[int, float]:
    """The training loss of every step in ``run``'s metrics.csv."""
    with (run / "metrics.csv").open(newline="") as file:
        return {
            int(row["step"]): float(row["train/loss"])
            for row in csv.DictReader(file)
            if row.get("train/loss")
        }


@pytest.fixture
def exact_float32() -> Iterator[None]:
    """Convolutions and matrix products in full float32 (CUDA runs them in TF32 by
    default, 1e-3-relative per operation), for comparisons with the CPU."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.fixture(scope="module")
def gpu_checkpoint(tiny_data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The best checkpoint of a bf16-mixed, channels_last run trained on the GPU."""
    run = tmp_path_factory.mktemp("gpu_run")
    summary = gpu_train(
        tiny_data_root, run, "trainer.precision=bf16-mixed", "training.channels_last=true"
    )
    assert summary["status"] == "finished"
    return Path(summary["best_checkpoint"])


@pytest.mark.parametrize("precision", list(EXPECTED_DTYPE))
def test_training_in_each_precision_with_channels_last(tiny_data_root, tmp_path, precision):
    dtypes = tmp_path / "dtypes.json"
    summary = gpu_train(
        tiny_data_root,
        tmp_path / "run",
        f"trainer.precision={precision}",
        "training.channels_last=true",
        "+callbacks.dtype._target_=tests.training.record_dtype.RecordOutputDtype",
        f"+callbacks.dtype.path={dtypes}",
    )
    assert summary["status"] == "finished" and summary["steps"] == 8
    assert summary["devices"] and "cuda" in json.dumps(summary["devices"]).lower()
    assert recorded_dtypes(dtypes) == [EXPECTED_DTYPE[precision]]
    losses = train_losses(tmp_path / "run")
    assert len(losses) == 8 and all(np.isfinite(list(losses.values())))


def test_compile_trains_as_eager_does(tiny_data_root, tmp_path, exact_float32):
    # Without the ASPP dropout, whose masks come from inductor's own random stream once
    # compiled: the two runs would differ from step 0 by design.
    common = [
        "trainer.precision=32-true",
        "trainer.max_epochs=1",
        "trainer.benchmark=false",
        "+model.decoder_aspp_dropout=0",
    ]
    gpu_train(tiny_data_root, tmp_path / "eager", *common)
    start = time.perf_counter()
    summary = gpu_train(tiny_data_root, tmp_path / "compiled", *common, "training.compile=true")
    print(f"\ncompiled run: {time.perf_counter() - start:.1f} s, compile included")
    assert summary["status"] == "finished"
    eager, compiled = train_losses(tmp_path / "eager"), train_losses(tmp_path / "compiled")
    assert sorted(eager) == sorted(compiled) == list(range(4))
    for step, loss in eager.items():
        assert compiled[step] == pytest.approx(loss, rel=2e-3), f"step {step}"


def test_a_gpu_run_resumes(tiny_data_root, tmp_path):
    run = tmp_path / "run"
    first = gpu_train(tiny_data_root, run, "trainer.precision=bf16-mixed")
    assert first["steps"] == 8
    resumed = gpu_train(
        tiny_data_root,
        run,
        "trainer.precision=bf16-mixed",
        "trainer.max_epochs=3",
        f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}",
    )
    assert resumed["status"] == "finished" and resumed["steps"] == 12
    steps = sorted(train_losses(run))
    assert steps == list(range(12))  # each step once: the resumed launch took 8 to 11


def test_predict_evaluate_and_export_from_a_gpu_checkpoint(
    gpu_checkpoint, tiny_data_root, tmp_path
):
    images = sorted(tiny_data_root.rglob("val/images/*"))
    assert images
    predicted = tmp_path / "predicted"
    done = run_in_process(
        predict_cli.main,
        f"ckpt={gpu_checkpoint}",
        f"input={images[0].parent}",
        "accelerator=gpu",
        f"hydra.run.dir={predicted}",
        cwd=tmp_path,
        program="predict.py",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    mask = np.asarray(Image.open(predicted / f"{images[0].stem}.png"))
    assert mask.shape == (192, 192)

    evaluated = tmp_path / "evaluated"
    source = [o for o in tiny_overrides(tiny_data_root, None) if o.startswith("datamodule.source")]
    done = run_in_process(
        evaluate_cli.main,
        f"ckpt={gpu_checkpoint}",
        *source,
        "accelerator=gpu",
        f"hydra.run.dir={evaluated}",
        cwd=tmp_path,
        program="evaluate.py",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert 0 <= json.loads((evaluated / "metrics.json").read_text())["MeanIoU"] <= 1

    exported = tmp_path / "net.onnx"
    done = run_in_process(
        export_cli.main,
        f"ckpt={gpu_checkpoint}",
        "format=onnx",
        f"output={exported}",
        f"hydra.run.dir={tmp_path / 'export'}",
        cwd=tmp_path,
        program="export.py",
    )
    # verify=true (the default) ran the file under onnxruntime against PyTorch first.
    assert done.returncode == 0, done.stderr[-3000:]
    assert exported.is_file()


def test_a_gpu_checkpoint_on_the_cpu_and_back(gpu_checkpoint, exact_float32):
    on_cpu = SegmentationModule.load_from_checkpoint(gpu_checkpoint, map_location="cpu").eval()
    back = SegmentationModule.load_from_checkpoint(gpu_checkpoint, map_location="cuda").eval()
    assert {p.device.type for p in on_cpu.parameters()} == {"cpu"}
    assert {p.device.type for p in back.parameters()} == {"cuda"}
    images = torch.randint(0, 256, (2, 3, 64, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = on_cpu(images.float())
        got = back(images.float().cuda()).cpu()
    torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize(("precision", "allowed"), [("32-true", 0), ("bf16-mixed", 0)])
def test_the_training_step_makes_no_host_sync_on_cuda(tiny_data_root, tmp_path, precision, allowed):
    counts = tmp_path / "syncs.json"
    gpu_train(
        tiny_data_root,
        tmp_path / "run",
        f"trainer.precision={precision}",
        "trainer.log_every_n_steps=1000",  # steps that write no metrics
        "+callbacks.syncs._target_=tests.gpu.cuda_syncs.CountCudaSyncs",
        f"+callbacks.syncs.path={counts}",
    )
    per_step = json.loads(counts.read_text())
    print(f"\n{precision}: CUDA host syncs per training step {per_step}")
    # The first step of each epoch is left out: the first step of all logs (Lightning
    # writes step 0), and the sampler's position is read when an epoch starts.
    steady = [count for step, count in enumerate(per_step) if step % 4]
    assert steady and max(steady) <= allowed, per_step


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _final_parameters(run: Path) -> dict[str, torch.Tensor]:
    state = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    return {
        k: v.double()
        for k, v in state["state_dict"].items()
        if v.is_floating_point() and "running" not in k
    }


def _two_ranks_on_one_gpu(data_root: Path, cwd: Path, *overrides: str) -> Path:
    """Two torchrun "nodes" of one process each, both on cuda:0, over gloo (NCCL refuses
    two ranks on one device); the run folder they shared."""
    cwd.mkdir()
    port = _free_port()
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    command = [
        *gpu_overrides(data_root, None),
        "strategy=ddp",
        "strategy.process_group_backend=gloo",
        "trainer.num_nodes=2",
        *overrides,
    ]
    nodes = [
        subprocess.Popen(
            [
                torchrun,
                "--nnodes=2",
                f"--node-rank={node}",
                "--nproc-per-node=1",
                "--master-addr=127.0.0.1",
                f"--master-port={port}",
                "--rdzv-id=onegpu",
                str(REPO / "train.py"),
                *command,
            ],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=os.environ | {"OMP_NUM_THREADS": "2"},
        )
        for node in (0, 1)
    ]
    outputs = [node.communicate(timeout=400)[0] for node in nodes]
    assert [n.returncode for n in nodes] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    (run,) = (cwd / "outputs" / "train").iterdir()
    return run


def test_two_ranks_sharing_one_gpu_train_as_one_process(tiny_data_root, tmp_path):
    # bf16 with synchronized batch norm: its half-precision backward runs on CUDA here.
    exact = [
        "trainer.precision=bf16-mixed",
        "trainer.max_epochs=1",
        "datamodule.augmentation.rotation=[0,0]",
        "datamodule.augmentation.translate_x=[0,0]",
        "datamodule.augmentation.translate_y=[0,0]",
        "+model.decoder_aspp_dropout=0.0",
        "callbacks.validation_report=null",
    ]
    single = tmp_path / "single"
    gpu_train(tiny_data_root, single, *exact)
    synced = _two_ranks_on_one_gpu(
        tiny_data_root, tmp_path / "synced", *exact, "datamodule.batch_size=2"
    )
    unsynced = _two_ranks_on_one_gpu(
        tiny_data_root,
        tmp_path / "unsynced",
        *exact,
        "datamodule.batch_size=2",
        "training.sync_batchnorm=false",
    )
    reference = _final_parameters(single)

    def distance(run: Path) -> float:
        weights = _final_parameters(run)
        squared = sum(float((weights[k] - reference[k]).square().sum()) for k in reference)
        return squared**0.5

    size = sum(float(v.square().sum()) for v in reference.values()) ** 0.5
    d_synced, d_unsynced = distance(synced), distance(unsynced)
    print(
        f"\n|w| {size:.4g}; |synced - single| {d_synced:.4g}; |unsynced - single| {d_unsynced:.4g}"
    )
    # Equal to bf16's rounding, and much nearer than without synchronized statistics.
    assert d_synced <= 1e-3 * size
    assert d_synced <= 0.5 * d_unsynced


def test_the_gpu_s_copies_through_pinned_host_memory_are_measured():
    # What gloo's link through host memory (bench/predict/host_staged_link.py) takes from the GPU:
    # its copies of one DDP bucket to pinned host memory and back, as gloo makes them.
    copies = measure_copies(torch.device("cuda", 0), 25 * 2**20)
    for bandwidth in (copies.device_to_host, copies.host_to_device):
        assert 1e9 < bandwidth < 1e12  # PCIe 3.0 x16: ~12 GB/s; GH200 NVLink-C2C: ~450 GB/s
    assert torch.cuda.get_device_name(0) in copies.source
