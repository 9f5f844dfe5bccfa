"""Named pretrained encoder weights (``imagenet``, timm's tags): fetched once, then cached.

``model.encoder_weights`` may name weights that smp or timm publish. The library fetches
and loads them itself when it builds the encoder, and keeps them in its cache: smp 0.6
takes ``config.json`` and ``model.safetensors`` from the Hugging Face Hub repository
``smp-hub/<encoder>.<name>`` at a pinned revision, timm takes ``model.safetensors`` (or
``pytorch_model.bin``) from ``timm/<model>.<tag>``, both into the Hub cache
(``$HF_HUB_CACHE``, by default ``$HF_HOME/hub`` = ``~/.cache/huggingface/hub``); a few
older timm weights have only a URL, which torch hub fetches into
``$TORCH_HOME/hub/checkpoints``. This module adds three things:

- the names an encoder offers, and a ``ConfigError`` listing them for any other name;
- one fetch per cache folder: a process that does not find the files takes a lock file
  in that folder before it builds, so the ranks of a node (our launcher's, torchrun's
  or SLURM's) wait for the first one, then find the files and load them from the cache;
- a ``ConfigError`` before training when the fetch fails and nothing is cached, naming
  the key, the cache folder and how to pass a local file instead.
"""

from __future__ import annotations

import logging
import os
import urllib.error
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar, cast
from urllib.parse import urlparse

import segmentation_models_pytorch as smp
import timm
import torch
from huggingface_hub import constants as hub_constants
from huggingface_hub import try_to_load_from_cache
from huggingface_hub.errors import LocalEntryNotFoundError
from timm.models import PretrainedCfg

from segscale.errors import ConfigError
from segscale.recorded_lock import LockHeldError, RecordedLock

log = logging.getLogger(__name__)

T = TypeVar("T")

KEY = "model.encoder_weights"

IMAGENET = "imagenet"
"""smp's name for its encoders' ImageNet weights; for a ``tu-`` encoder, timm's default tag."""

WEIGHTS_SUFFIXES = (".pth", ".pt", ".safetensors", ".bin", ".ckpt")
"""Suffixes that make ``model.encoder_weights`` a file, never a name."""

# What the libraries raise when weights can be neither fetched nor found in the cache:
# huggingface_hub for no connection, HF_HUB_OFFLINE=1 or the Hub down (hf_hub_download);
# urllib (URLError, its HTTPError) or a socket timeout for torch hub's URL downloads.
FETCH_ERRORS = (LocalEntryNotFoundError, urllib.error.URLError, TimeoutError)

HUB_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
"""The files timm reads from a Hub repository without a file name, in its order."""

LOCAL_FILE_HINT = (
    "or pass a local file instead: model.encoder_weights=/path/to/weights.pth (an encoder's "
    "or a whole network's state dict, .pth/.pt or .safetensors, torchvision's or timm's "
    "layout)"
)


@dataclass(frozen=True)
class HubFiles:
    """Files of a Hugging Face Hub repository that smp or timm fetch into the Hub cache."""

    repo_id: str
    revision: str | None
    needed: tuple[tuple[str, ...], ...]
    """For each file the library reads, the names it accepts (timm: safetensors or .bin)."""

    @property
    def folder(self) -> Path:
        """The Hub cache (``HF_HUB_CACHE``, ``HF_HOME``), as huggingface_hub has it now."""
        return Path(hub_constants.HF_HUB_CACHE)

    @property
    def lock_file(self) -> Path:
        """Our lock for this repository, beside huggingface_hub's own locks."""
        return self.folder / ".locks" / f"segscale--{self.repo_id.replace('/', '--')}.lock"

    def cached(self) -> bool:
        """Whether every file the library reads is in the cache (no network involved)."""
        return all(
            any(
                isinstance(try_to_load_from_cache(self.repo_id, name, revision=self.revision), str)
                for name in names
            )
            for names in self.needed
        )

    def __str__(self) -> str:
        return self.repo_id


@dataclass(frozen=True)
class UrlFile:
    """A weights file that torch hub fetches from a URL into its checkpoints folder."""

    url: str

    @property
    def folder(self) -> Path:
        """The checkpoints folder of torch hub (``$TORCH_HOME/hub/checkpoints``), as it is now."""
        return Path(torch.hub.get_dir()) / "checkpoints"

    @property
    def lock_file(self) -> Path:
        """Our lock for this file, beside it."""
        return self.folder / f".{self.filename}.segscale.lock"

    @property
    def filename(self) -> str:
        """The name torch hub gives the file: the URL's last path component."""
        return os.path.basename(urlparse(self.url).path)

    def cached(self) -> bool:
        """Whether the file is in the folder."""
        return (self.folder / self.filename).is_file()

    def __str__(self) -> str:
        return self.url


@dataclass(frozen=True)
class NamedWeights:
    """A weights name resolved: what to give smp to load it, and the files it needs."""

    name: str
    """As configured (``imagenet``, ``ssl``, a timm tag)."""
    encoder: str
    """``model.encoder`` as configured."""
    smp_encoder: str
    """smp's ``encoder_name``: ``encoder``, for a ``tu-`` encoder with its timm tag."""
    argument: str | bool
    """smp's ``encoder_weights``: the name for smp's encoders, ``True`` for timm's."""
    files: HubFiles | UrlFile


def names_a_file(value: str) -> bool:
    """Whether ``model.encoder_weights=value`` is a file (a path) rather than a name."""
    return (
        "/" in value or os.sep in value or value.endswith(WEIGHTS_SUFFIXES) or Path(value).is_file()
    )


def weights_names(encoder: str) -> list[str]:
    """The names of the pretrained weights smp or timm offer for ``encoder``."""
    if encoder.startswith("tu-"):
        model, _ = _split_tag(encoder[3:])
        tags = _timm_tags(model)
        return [IMAGENET, *tags] if tags else []
    return list(smp.encoders.encoders[encoder]["pretrained_settings"])


def named_weights(encoder: str, name: str) -> NamedWeights:
    """Resolve ``model.encoder_weights=name`` for ``model.encoder=encoder``, or refuse it."""
    if encoder.startswith("tu-"):
        return _timm_weights(encoder, name)
    names = weights_names(encoder)
    if name not in names:
        raise _unknown_name(encoder, name, names)
    settings = smp.encoders.encoders[encoder]["pretrained_settings"][name]
    # What smp.encoders.get_encoder fetches for a name: both files, at a pinned revision.
    files = HubFiles(
        settings["repo_id"], settings["revision"], (("config.json",), ("model.safetensors",))
    )
    return NamedWeights(name, encoder, encoder, name, files)


def build_with_named_weights(weights: NamedWeights, build: Callable[[], T]) -> T:
    """Run ``build`` (which makes smp or timm load ``weights``), fetching at most once.

    Files already cached are loaded without a lock. Otherwise the lock file in the cache
    folder makes the processes that share the folder build one after the other: the
    first fetches, the others then find the files. A fetch that fails with nothing
    cached (offline) is a ``ConfigError``.
    """
    files = weights.files
    if not files.cached():
        with _fetch_lock(weights):
            if not files.cached():
                log.info("Fetching %s=%s (%s) into %s", KEY, weights.name, files, files.folder)
                return _building(weights, build)
    return _building(weights, build)


def _building(weights: NamedWeights, build: Callable[[], T]) -> T:
    try:
        return build()
    except FETCH_ERRORS as error:
        # The first sentence: huggingface_hub's message goes on with advice that ours replaces.
        reason = str(error).strip().split(". ")[0] or type(error).__name__
        raise ConfigError(
            f"{KEY}={weights.name!r} for model.encoder={weights.encoder!r}: the weights "
            f"({weights.files}) cannot be fetched ({reason}) and are not in the cache folder "
            f"{weights.files.folder}. Fetch them once on a machine that is online with the same "
            f"cache folder (HF_HOME for the Hugging Face Hub, TORCH_HOME for torch hub), "
            f"{LOCAL_FILE_HINT}"
        ) from None


@contextmanager
def _fetch_lock(weights: NamedWeights) -> Iterator[None]:
    """Hold the lock file of ``weights`` in its cache folder (waiting for its holder).

    ``segscale.recorded_lock``: filelock's lock (``flock``, or where the file system has
    none a ``SoftFileLock``, the file's existence), naming its holder inside.
    """
    files = weights.files
    lock = RecordedLock(files.lock_file)
    try:
        try:
            left = lock.acquire()
        except LockHeldError as held:
            hint = f" (if it has ended, delete {held.lock_file})" if held.soft else ""
            log.info("Waiting for %s to fetch %s%s", held.holder, files, hint)
            left = lock.acquire(wait=True)
    except PermissionError:
        raise ConfigError(
            f"{KEY}={weights.name!r}: the weights are not in the cache folder {files.folder}, "
            "which this user may not write to; point HF_HOME (or TORCH_HOME) at a writable "
            f"folder, {LOCAL_FILE_HINT}"
        ) from None
    if left is not None:
        log.warning("A process fetching %s ended without releasing its lock (%s)", files, left)
    try:
        yield
    finally:
        lock.release()


def normalization(weights: NamedWeights) -> tuple[list[float], list[float]]:
    """The per-channel mean and std (fractions of full intensity) ``weights`` expect.

    timm keeps them in its pretrained config; smp in the ``config.json`` it fetches with
    the weights (``smp.encoders.get_preprocessing_params``), so that file is fetched as
    the weights are: at most once per node, and offline only from the cache.
    """
    if weights.smp_encoder.startswith("tu-"):
        cfg = cast(PretrainedCfg, timm.models.get_pretrained_cfg(weights.smp_encoder[3:]))
        return [float(v) for v in cfg.mean], [float(v) for v in cfg.std]
    settings = build_with_named_weights(
        weights, lambda: smp.encoders.get_preprocessing_params(weights.encoder, weights.name)
    )
    return [float(v) for v in settings["mean"]], [float(v) for v in settings["std"]]


def _timm_weights(encoder: str, name: str) -> NamedWeights:
    """Named weights of a ``tu-`` encoder: ``imagenet`` is timm's default tag, as in smp."""
    model, encoder_tag = _split_tag(encoder[3:])
    if not timm.is_model(model):
        raise ConfigError(
            f"model.encoder={encoder!r}: timm has no model {model!r} (see timm.list_models())"
        )
    tags = _timm_tags(model)
    names = [IMAGENET, *tags] if tags else []
    if name not in names:
        raise _unknown_name(encoder, name, names)
    if encoder_tag and encoder_tag not in tags:
        raise ConfigError(
            f"model.encoder={encoder!r}: timm has no weights tagged {encoder_tag!r} for {model!r}; "
            f"its tags are {', '.join(tags) or 'none'}"
        )
    tag = name if name != IMAGENET else encoder_tag or tags[0]  # tags[0]: timm's default
    if encoder_tag and tag != encoder_tag:
        raise ConfigError(
            f"{KEY}={name!r} names other weights than model.encoder={encoder!r}, whose tag is "
            f"{encoder_tag!r}: give the tag in one of the two keys"
        )
    # Not None: the tag is one of timm's for the model.
    cfg = cast(PretrainedCfg, timm.models.get_pretrained_cfg(f"{model}.{tag}"))
    files: HubFiles | UrlFile
    if cfg.hf_hub_id:
        # timm's load_state_dict_from_hf: model.safetensors first, else pytorch_model.bin.
        repo_id, _, revision = cfg.hf_hub_id.partition("@")
        needed = (cfg.hf_hub_filename,) if cfg.hf_hub_filename else HUB_WEIGHTS
        files = HubFiles(repo_id, revision or None, (needed,))
    else:
        files = UrlFile(str(cfg.url))
    return NamedWeights(name, encoder, f"tu-{model}.{tag}", True, files)


def _split_tag(name: str) -> tuple[str, str]:
    model, _, tag = name.partition(".")
    return model, tag


def _timm_tags(model: str) -> list[str]:
    """The tags of timm's pretrained weights for ``model``, its default first."""
    tags = sorted(
        n.partition(".")[2] for n in timm.list_pretrained() if n.partition(".")[0] == model
    )
    default = cfg.tag if (cfg := timm.models.get_pretrained_cfg(model)) is not None else None
    return sorted(tags, key=lambda tag: tag != default)


def _unknown_name(encoder: str, name: str, names: list[str]) -> ConfigError:
    offered = ", ".join(names) if names else "none (no pretrained weights are published)"
    return ConfigError(
        f"{KEY}={name!r} is not a weights name for model.encoder={encoder!r}: its names are "
        f"{offered}; or null (random initialization), {LOCAL_FILE_HINT.removeprefix('or ')}"
    )
