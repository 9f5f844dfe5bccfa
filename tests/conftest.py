"""Shared fixtures: tiny synthetic tiles and the real config composed for a fast run."""

from __future__ import annotations

import os
import runpy
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pytest
import tifffile
import torch
from hydra import compose, initialize_config_dir
from hydra._internal.callbacks import Callbacks
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import create_config_search_path
from hydra.core.hydra_config import HydraConfig
from hydra.types import HydraContext, RunMode
from omegaconf import DictConfig
from PIL import Image
from torch import nn

import segscale
from segscale.configs import CONFIG_DIR
from segscale.data.datasets.synthetic import SyntheticTiles, draw_tile
from segscale.data.sampling.patches import grid_inference
from segscale.models.checkpoint import network as checkpoint_network
from segscale.models.checkpoint.files import load_checkpoint_file, save_checkpoint_file
from segscale.models.checkpoint.record import CHECKPOINT_FORMAT
from segscale.platforms.cores import cpus_available

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def session_environment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The environment of every test and of the processes it starts.

    Session-wide, so that module- and session-scoped fixtures (a run trained once and
    read by several tests) train in it too; a test may change it for itself with
    ``monkeypatch``.

    - No test downloads (``HF_HUB_OFFLINE=1``): pretrained weights come from caches the
      tests prepare.
    - Every run computes with the same threads, whatever the load: this worker's share
      of the cores (``OMP_NUM_THREADS``, ``threads_per_worker``; all of them without
      pytest-xdist). ``training.threads=auto`` counts the cores other processes
      keep busy when a run starts, and on a loaded test machine two runs a test compares
      could otherwise compute with different threads (and sum in a different order).
      tests/training/ranks/test_threads.py tests ``auto`` itself without this variable.
    - Threads that wait sleep (``OMP_WAIT_POLICY=PASSIVE``) rather than spin: two DDP
      ranks of that many threads each share the cores, and OpenMP's spinning waits
      would take a rank's cores from the other's computing threads. A DDP test took 176 s
      so on 2 cores, and 39 s without spinning.
    - The user cache folder (``XDG_CACHE_HOME``) is the session's, not the home's: the
      validation pass caches there, shared by the session's tests as a user's cache is
      by their runs.
    - Checkpoints may name the oracle's network (``oracle_network``) besides segscale's
      builders (``WITH_ORACLE``).
    """
    cache = tmp_path_factory.mktemp("cache")
    threads = threads_per_worker()
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(threads)  # torch was imported before the variable
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(checkpoint_network, "BUILDERS", WITH_ORACLE)
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("OMP_NUM_THREADS", str(threads))
        patch.setenv("OMP_WAIT_POLICY", "PASSIVE")
        patch.setenv("XDG_CACHE_HOME", str(cache))
        yield
    torch.set_num_threads(torch_threads)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (pyproject's addopts): a worker per core of this process's affinity mask.

    Not per core of the machine: a CI job limited to 2 of 64 cores gets 2 workers.
    """
    return cpus_available()


def threads_per_worker() -> int:
    """The cores divided among the pytest-xdist workers (all of them without xdist).

    Two workers of one thread each on 2 cores ran the suite in 10.4 min where one
    process of two threads took 16.1: most of a test's time is single-threaded (a
    process importing torch and Lightning, Python between small kernels), and threads
    beyond a core each would only wait for each other.
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, cpus_available() // workers)


@pytest.fixture(scope="session")
def tiny_data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding a tiny synthetic dataset, generated once per test session."""
    root = tmp_path_factory.mktemp("data")
    SyntheticTiles(root=str(root), num_train=2, num_val=1, image_size=192, seed=0).prepare()
    return root


TINY_ENCODER = "tu-lcnet_050"
"""The encoder of the tests' tiny runs (``tiny_overrides``)."""


def tiny_overrides(data_root: Path, output_dir: Path | None) -> list[str]:
    """Overrides that make the default config train in seconds on tiny tiles.

    ``output_dir=None`` keeps Hydra's run folder (a sweep's job folders).
    """
    return [
        *([f"output_dir={output_dir}"] if output_dir else []),
        f"datamodule.source.root={data_root}",
        "datamodule.source.num_train=2",
        "datamodule.source.num_val=1",
        "datamodule.source.image_size=192",
        "datamodule.patch_size=64",
        "datamodule.patches_per_image=8",
        "datamodule.batch_size=4",
        "datamodule.num_workers=0",
        # A 0.6 M-parameter encoder (timm's LCNet-0.5) instead of the default resnet18
        # (11 M): what these runs test (steps, ranks, checkpoints, resumes, reports) does
        # not depend on the network's size, and its 8 MB checkpoints and 3x cheaper steps
        # cut every training test. Tests of the default network name resnet18 themselves.
        f"model.encoder={TINY_ENCODER}",
        "trainer.max_epochs=2",
        "trainer.accelerator=cpu",
        "trainer.log_every_n_steps=1",
    ]


def compose_config(config_name: str, *overrides: str) -> DictConfig:
    """Compose ``conf/<config_name>.yaml`` (train, predict, evaluate) with ``overrides``."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name, overrides=list(overrides))


@pytest.fixture
def make_config(tiny_data_root: Path, tmp_path: Path) -> Callable[..., DictConfig]:
    """Compose ``conf/train.yaml`` with the tiny overrides plus the given ones."""

    def make(*overrides: str) -> DictConfig:
        return compose_config(
            "train", *tiny_overrides(tiny_data_root, tmp_path / "run"), *overrides
        )

    return make


@dataclass(frozen=True)
class TrainedRun:
    """A finished run: its folder and the summary ``train`` returned."""

    folder: Path
    summary: dict


@pytest.fixture(scope="session")
def shared_tiny_run(tiny_data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> TrainedRun:
    """The default config's tiny run (``tiny_overrides``: 2 epochs of 4 steps), trained once
    per worker and shared by the tests that only read a finished run.

    Read it only; a test that changes a run takes its own copy (``tiny_run``).
    """
    from segscale.training.run.training_run import train

    folder = tmp_path_factory.mktemp("shared_tiny_run") / "run"
    summary = train(compose_config("train", *tiny_overrides(tiny_data_root, folder)))
    return TrainedRun(folder, summary)


@pytest.fixture
def tiny_run(shared_tiny_run: TrainedRun, tmp_path: Path) -> Path:
    """A copy of ``shared_tiny_run``'s folder at ``tmp_path / "run"``, this test's to change.

    It is where ``make_config``'s run would be; the files' contents are the shared run's
    (the paths written inside them name the shared folder).
    """
    folder = tmp_path / "run"
    shutil.copytree(shared_tiny_run.folder, folder)
    return folder


def train_command(*args: str) -> list[str]:
    """``python train.py ARGS`` with this interpreter."""
    return [sys.executable, str(REPO / "train.py"), *args]


def compose_for_plugins(*overrides: str, run_mode: RunMode = RunMode.MULTIRUN) -> tuple:
    """``(config, HydraContext)`` as Hydra builds them for a sweeper or launcher."""
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(CONFIG_DIR))
    config = loader.load_configuration("train", overrides=list(overrides), run_mode=run_mode)
    HydraConfig.instance().set_config(config)
    return config, HydraContext(config_loader=loader, callbacks=Callbacks(config))


def write_pair(
    root: Path,
    split: str,
    name: str,
    image: np.ndarray,
    mask: np.ndarray,
    image_suffix: str = ".png",
    mask_suffix: str = ".png",
) -> tuple[Path, Path]:
    """Write ``root/split/images/name`` and ``root/split/masks/name``; return both paths."""
    paths = []
    for folder, array, suffix in (("images", image, image_suffix), ("masks", mask, mask_suffix)):
        path = root / split / folder / f"{name}{suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        if suffix in (".tif", ".tiff"):
            extra = (
                {"photometric": "minisblack", "planarconfig": "contig"}
                if array.ndim == 3 and array.shape[2] != 3
                else {}
            )
            tifffile.imwrite(path, array, **extra)
        else:
            Image.fromarray(array).save(path)
        paths.append(path)
    return paths[0], paths[1]


def folder_dataset(root: Path, size: int = 96, num_train: int = 2, num_val: int = 1) -> Path:
    """A tiny folder dataset of synthetic tiles (6 classes, class-index PNG masks)."""
    for split, count, offset in (("train", num_train, 0), ("val", num_val, 100)):
        for i in range(count):
            image, mask = draw_tile(size, seed=0, index=offset + i)
            write_pair(root, split, f"tile{i}", image, mask)
    return root


CLASS_STEP = 40
"""Oracle images: channel 0 is ``class × CLASS_STEP``."""
ORACLE_NETWORK = "tests.conftest.oracle_network"
"""The ``_target_`` of the oracle checkpoints' network, a builder only the tests accept."""


def oracle_network(in_channels: int, out_channels: int, kernel_size: int) -> nn.Conv2d:
    """The oracle's network: a convolution, which no checkpoint of segscale's holds.

    segscale accepts only the builders ``train.py`` writes (``BUILDERS``); the
    tests add this one (``WITH_ORACLE``), so that checkpoints of known predictions load.
    """
    return nn.Conv2d(in_channels, out_channels, kernel_size)


SEGSCALE_BUILDERS = checkpoint_network.BUILDERS
"""The network builders segscale itself accepts (before the session adds the oracle's)."""
WITH_ORACLE = MappingProxyType({**SEGSCALE_BUILDERS, ORACLE_NETWORK: oracle_network})


def oracle_process(script: str, *args: str) -> list[str]:
    """``python <script> ARGS`` (``predict.py``, ...) as a process of its own, oracle accepted."""
    code = (
        f"import sys; sys.path.insert(0, {str(REPO)!r}); "
        f"from tests.conftest import run_with_oracle; run_with_oracle({script!r})"
    )
    return [sys.executable, "-c", code, *args]


def run_with_oracle(script: str) -> None:
    """Run the repository's ``script`` as ``__main__`` (its exit status the process's own)."""
    checkpoint_network.BUILDERS = WITH_ORACLE
    sys.argv = [script, *sys.argv[1:]]
    runpy.run_path(str(REPO / script), run_name="__main__")


ORACLE_DATA = {"_target_": "segscale.data.datasets.folder.FolderTiles", "root": "/nowhere/oracle"}
"""The data ``oracle_checkpoint`` records it was trained on: none that a test holds."""


def full_record(meta: dict) -> dict:
    """``meta`` (network, classes, normalization) with the rest of a record ``train.py``
    writes: this format and segscale, masks of class indices, trained on ``ORACLE_DATA``,
    validated on tiles of 32 pixels, no value range."""
    return {
        "checkpoint_format": CHECKPOINT_FORMAT,
        "segscale_version": segscale.__version__,
        "label_ids": None,
        "ignore_ids": [],
        "data_source": ORACLE_DATA,
        "validation_inference": grid_inference(32),
        "value_range": None,
        **meta,
    }


def oracle_checkpoint(path: Path, num_classes: int = 3, colours: list | None = None) -> Path:
    """A segscale checkpoint of a 1×1 convolution that predicts class = channel 0 / 40.

    Its logits are ``2k·x/40 − k²`` for class k, which peak at ``k = x/40``; mean 0 and
    std 1/255 make the module feed it raw pixel values. Its record is ``full_record``'s:
    evaluating other data than ``ORACLE_DATA`` takes ``other_data=true``.
    """
    weight = torch.zeros(num_classes, 3, 1, 1)
    weight[:, 0, 0, 0] = 2 * torch.arange(num_classes) / CLASS_STEP
    meta = {
        "model": {
            "_target_": ORACLE_NETWORK,
            "in_channels": 3,
            "out_channels": num_classes,
            "kernel_size": 1,
        },
        "class_names": [f"class{k}" for k in range(num_classes)],
        "class_colors": colours,
        "ignore_index": 255,
        "mean": [0.0, 0.0, 0.0],
        "std": [1 / 255] * 3,
        "max_value": 255.0,
    }
    state = {"network.weight": weight, "network.bias": -(torch.arange(num_classes) ** 2.0)}
    save_checkpoint_file({"state_dict": state, "segscale": full_record(meta)}, path)
    return path


def float_oracle_checkpoint(
    path: Path, value_range: list[list[float]] | None = ((0.0, 1.0),) * 3
) -> Path:
    """``oracle_checkpoint`` trained on float images of 0-1, with that ``value_range``.

    It predicts ``mask`` from ``oracle_image(mask) / 255`` (as float32); ``value_range``
    ``None``: the data gave none.
    """
    content = load_checkpoint_file(oracle_checkpoint(path), "ckpt")
    content["segscale"]["max_value"] = 1.0
    if value_range is not None:
        content["segscale"]["value_range"] = [list(pair) for pair in value_range]
    save_checkpoint_file(content, path)
    return path


def oracle_image(mask: np.ndarray) -> np.ndarray:
    """An RGB image from which ``oracle_checkpoint`` predicts ``mask`` exactly."""
    image = np.random.default_rng(0).integers(0, 256, (*mask.shape, 3)).astype(np.uint8)
    image[:, :, 0] = mask * CLASS_STEP
    return image
