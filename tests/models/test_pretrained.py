"""Named pretrained weights, from a prepared cache; no test reaches the network."""

import errno
import fcntl
import json
import logging
import os
import socket
import threading
import time

import huggingface_hub
import pytest
import safetensors.torch
import segmentation_models_pytorch as smp
import timm
import torch

from segscale.errors import ConfigError
from segscale.models import pretrained
from segscale.models.networks import build_network
from segscale.models.pretrained import named_weights, names_a_file, weights_names
from tests.conftest import compose_config

FAKE_COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """Empty Hugging Face and torch hub caches under tmp_path, offline, sockets refused."""
    hub = tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    # huggingface_hub read its environment at import: set what it reads now as well.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)

    def refuse(*args, **kwargs):
        raise OSError("network access in a test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return hub


def hub_file(hub, repo_id, filename, revision=None):
    """Where huggingface_hub keeps ``filename`` of ``repo_id``; ``revision`` None: main."""
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    if revision is None:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(FAKE_COMMIT)
    path = repo / "snapshots" / (revision or FAKE_COMMIT) / filename
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def random_state(module):
    """``module``'s state dict with every float tensor redrawn, so loading is visible."""
    return {
        k: torch.randn_like(v) if v.is_floating_point() else v.clone()
        for k, v in module.state_dict().items()
    }


def cache_smp_weights(hub, encoder, name="imagenet"):
    """Put random weights where smp looks for ``encoder``'s ``name`` weights; return them."""
    settings = smp.encoders.encoders[encoder]["pretrained_settings"][name]
    state = random_state(smp.encoders.get_encoder(encoder))
    repo, revision = settings["repo_id"], settings["revision"]
    hub_file(hub, repo, "config.json", revision).write_text(json.dumps({"mean": [0.5] * 3}))
    safetensors.torch.save_file(state, hub_file(hub, repo, "model.safetensors", revision))
    return state


def test_smp_weights_load_from_the_cache(cache):
    state = cache_smp_weights(cache, "resnet18", "ssl")
    network = build_network(num_classes=3, output_stride=16, encoder_weights="ssl")
    loaded = network.encoder.state_dict()
    assert loaded.keys() == state.keys()
    assert all(torch.equal(loaded[k], v) for k, v in state.items())


def test_timm_weights_load_from_the_cache(cache):
    state = random_state(timm.create_model("resnet18"))  # timm's file: the classifier's
    safetensors.torch.save_file(
        state, hub_file(cache, "timm/resnet18.tv_in1k", "model.safetensors")
    )
    network = build_network("Unet", "tu-resnet18", num_classes=3, encoder_weights="tv_in1k")
    loaded = network.encoder.state_dict()
    assert all(torch.equal(v, state[k.removeprefix("model.")]) for k, v in loaded.items())
    # imagenet: timm's default tag, as smp takes it for tu- encoders.
    assert named_weights("tu-resnet18", "imagenet").smp_encoder == "tu-resnet18.a1_in1k"


@pytest.mark.slow
def test_the_matlab_encoder_loads_from_the_cache_cut_at_1_16(cache):
    state = cache_smp_weights(cache, "inceptionresnetv2")
    network = build_network(
        encoder="inceptionresnetv2", output_stride=16, encoder_weights="imagenet"
    )
    assert network.encoder.output_stride == 16
    kept = network.encoder.state_dict()
    assert all(torch.equal(kept[k], v) for k, v in state.items() if k in kept)
    # the 1/32 stage, loaded with the file, then dropped (drop_unreached_layers)
    dropped = {k.split(".")[0] for k in state if k not in kept}
    assert dropped == {"mixed_7a", "repeat_2", "block8", "conv2d_7b"}


@pytest.mark.parametrize(
    ("arch", "encoder", "folder"),
    [
        ("DeepLabV3Plus", "resnet18", "hf/hub"),
        ("Unet", "tu-resnet18", "hf/hub"),
        ("Unet", "tu-legacy_seresnet18", "torch/hub/checkpoints"),  # a URL, for torch hub
    ],
)
def test_offline_with_nothing_cached_is_a_config_error(cache, tmp_path, arch, encoder, folder):
    with pytest.raises(ConfigError) as error:
        build_network(arch, encoder, output_stride=None, encoder_weights="imagenet")
    message = str(error.value)
    assert f"model.encoder_weights='imagenet' for model.encoder='{encoder}'" in message
    assert f"not in the cache folder {tmp_path / folder}" in message
    assert "pass a local file instead: model.encoder_weights=/path/to/weights.pth" in message


def test_an_unknown_name_lists_the_names():
    with pytest.raises(ConfigError, match=r"its names are imagenet, ssl, swsl; or null"):
        build_network(encoder_weights="imagenet21k")
    with pytest.raises(ConfigError, match=r"its names are imagenet, a1_in1k, a2_in1k, .*tv_in1k"):
        build_network("Unet", "tu-resnet18", encoder_weights="in21k")
    assert weights_names("inceptionresnetv2") == ["imagenet", "imagenet+background"]
    with pytest.raises(ConfigError, match=r"names other weights .* whose tag is 'tv_in1k'"):
        named_weights("tu-resnet18.tv_in1k", "a1_in1k")


def test_names_and_files_are_told_apart(tmp_path):
    assert not names_a_file("imagenet") and not names_a_file("fb_ssl_yfcc100m_ft_in1k")
    assert names_a_file("weights.pth") and names_a_file("w.safetensors")
    assert names_a_file("runs/encoder") and names_a_file(str(tmp_path))


def test_ranks_sharing_a_cache_fetch_once(cache, monkeypatch, caplog):
    state = random_state(smp.encoders.get_encoder("resnet18"))
    fetched = []

    def download(repo_id, filename, revision=None, **kwargs):
        """Fetch slowly unless cached, as huggingface_hub does for a pinned revision."""
        path = hub_file(cache, repo_id, filename, revision)
        if not path.exists():
            assert (cache / ".locks" / "segscale--smp-hub--resnet18.imagenet.lock").exists()
            fetched.append(filename)
            time.sleep(0.3)  # long enough for the other rank to arrive while this one fetches
            if filename == "config.json":
                path.write_text("{}")
            else:
                safetensors.torch.save_file(state, path)
        return str(path)

    monkeypatch.setattr(smp.encoders, "hf_hub_download", download)
    start, networks = threading.Barrier(2), []

    def rank():
        start.wait()
        networks.append(build_network(num_classes=3, encoder_weights="imagenet"))

    ranks = [threading.Thread(target=rank) for _ in range(2)]
    with caplog.at_level(logging.INFO, logger=pretrained.__name__):
        for thread in ranks:
            thread.start()
        for thread in ranks:
            thread.join()
    assert f"Waiting for pid {os.getpid()} on host {socket.gethostname()}, started" in caplog.text
    assert sorted(fetched) == ["config.json", "model.safetensors"]
    assert len(networks) == 2
    for network in networks:
        assert torch.equal(network.encoder.conv1.weight, state["conv1.weight"])


def test_the_matlab_preset_starts_from_imagenet_weights():
    cfg = compose_config("train", "experiment=deeplabv3plus_inceptionresnetv2-d16_b20-10e_512x512")
    assert cfg.model.encoder_weights == "imagenet"
    assert list(cfg.datamodule.mean) == list(cfg.datamodule.std) == [0.5, 0.5, 0.5]
    named = named_weights(cfg.model.encoder, cfg.model.encoder_weights)
    assert str(named.files) == "smp-hub/inceptionresnetv2.imagenet"


# ENOSYS: Lustre mounted without -o flock; ENOLCK: NFS without its lock daemon.
@pytest.mark.parametrize("no_flock", [errno.ENOSYS, errno.ENOLCK])
def test_without_flock_the_fetch_takes_a_soft_lock(cache, monkeypatch, no_flock):
    state = random_state(smp.encoders.get_encoder("resnet18"))
    lock_file = cache / ".locks" / "segscale--smp-hub--resnet18.imagenet.lock"

    def download(repo_id, filename, revision=None, **kwargs):
        path = hub_file(cache, repo_id, filename, revision)
        # filelock's soft lock: the file's existence is the lock, its holder inside.
        assert lock_file.read_text().startswith(f"{os.getpid()}\n"), "fetched without the lock"
        if filename == "config.json":
            path.write_text("{}")
        else:
            safetensors.torch.save_file(state, path)
        return str(path)

    def flock(fd, operation):
        raise OSError(no_flock, os.strerror(no_flock))

    monkeypatch.setattr(smp.encoders, "hf_hub_download", download)
    monkeypatch.setattr(fcntl, "flock", flock)
    network = build_network(num_classes=3, encoder_weights="imagenet")
    assert torch.equal(network.encoder.conv1.weight, state["conv1.weight"])
    assert not lock_file.exists()  # released
