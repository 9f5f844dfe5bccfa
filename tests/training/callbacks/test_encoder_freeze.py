import logging
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from torch import nn

from segscale.errors import ConfigError
from segscale.training.callbacks.encoder_freeze import EncoderFreeze
from segscale.training.run.training_run import train


class EncoderAndHead(nn.Module):
    """An encoder with batch norm and a head, as segmentation_models_pytorch builds them."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4))
        self.head = nn.Conv2d(4, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def started(freeze: EncoderFreeze, network: nn.Module, epoch: int) -> SimpleNamespace:
    """The trainer of a fit that starts (or resumes) in ``epoch``, its hooks called."""
    trainer = SimpleNamespace(current_epoch=epoch, is_global_zero=True)
    module = SimpleNamespace(network=network, training=True)
    freeze.setup(trainer, module, "fit")
    freeze.on_train_start(trainer, module)
    return trainer


def step(network: nn.Module, freeze: EncoderFreeze, optimizer: torch.optim.Optimizer) -> None:
    optimizer.zero_grad()
    network(torch.randn(2, 3, 5, 5)).square().mean().backward()
    freeze.on_before_optimizer_step(None, None, optimizer)
    optimizer.step()


def encoder_state(network: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in network.encoder.state_dict().items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_a_frozen_encoder_is_not_updated_and_its_batch_norm_not_either(caplog):
    caplog.set_level(logging.INFO, logger="segscale.training.callbacks.encoder_freeze")
    network, freeze = EncoderAndHead(), EncoderFreeze(epochs=1)
    trainer = started(freeze, network, epoch=0)
    assert "training.freeze_encoder_epochs=1: the encoder is frozen" in caplog.text
    assert not network.encoder.training and not network.encoder[1].training
    assert network.head.training
    # Momentum and weight decay would move parameters whose gradient is only zero.
    optimizer = torch.optim.SGD(network.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    before, head = encoder_state(network), network.head.weight.clone()
    for _ in range(2):
        step(network, freeze, optimizer)
    assert same(before, encoder_state(network))  # weights and running statistics
    assert not torch.equal(head, network.head.weight)
    # No momentum gathered while frozen, that would move the encoder once it thaws.
    assert all(p not in optimizer.state for p in network.encoder.parameters())

    trainer.current_epoch = 1
    freeze.on_train_epoch_start(trainer, SimpleNamespace(network=network, training=True))
    assert "the encoder is unfrozen, from epoch 2 on" in caplog.text
    assert network.encoder.training and network.encoder[1].training
    step(network, freeze, optimizer)
    after = encoder_state(network)
    for key in ("0.weight", "1.weight", "1.running_mean", "1.num_batches_tracked"):
        assert not torch.equal(before[key], after[key]), key


def test_a_run_resumed_in_a_frozen_epoch_stays_frozen(caplog):
    caplog.set_level(logging.INFO, logger="segscale.training.callbacks.encoder_freeze")
    network, freeze = EncoderAndHead(), EncoderFreeze(epochs=2)
    started(freeze, network, epoch=1)
    assert freeze.frozen and not network.encoder.training
    resumed_later = EncoderFreeze(epochs=2)
    started(resumed_later, network, epoch=2)
    assert not resumed_later.frozen and network.encoder.training
    assert "the encoder was frozen in epochs 1 to 2" in caplog.text


def test_freezing_needs_an_encoder():
    with pytest.raises(ConfigError, match=r"training\.freeze_encoder_epochs=1 needs .*encoder"):
        started(EncoderFreeze(epochs=1), nn.Conv2d(3, 2, 1), epoch=0)
    started(EncoderFreeze(epochs=0), nn.Conv2d(3, 2, 1), epoch=0)  # no freezing asks for none


class Snapshot(L.Callback):
    """Keeps the network's state at the start and after each epoch, saved to ``path``."""

    def __init__(self, path: str) -> None:
        self.path, self.states = path, []

    def _keep(self, pl_module: L.LightningModule) -> None:
        state = pl_module.network.state_dict()
        self.states.append({k: v.detach().clone() for k, v in state.items()})

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._keep(pl_module)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._keep(pl_module)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            torch.save(self.states, self.path)


# 2 iterations an epoch, and no plots or report: only the weights matter here.
QUICK = [
    "datamodule.patches_per_image=4",
    "callbacks.validation_report=null",
    "callbacks.training_progress=null",
]


def trained_states(make_config, path: Path, *overrides: str) -> list[dict[str, torch.Tensor]]:
    """The network's states at the start and after each epoch of a run of ``overrides``."""
    snapshot = [
        f"+callbacks.snapshot._target_={Snapshot.__module__}.Snapshot",
        f"+callbacks.snapshot.path={path}",
    ]
    summary = train(make_config(*QUICK, *snapshot, *overrides))
    assert summary["status"] == "finished"
    return torch.load(path, weights_only=True)


def changed(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], prefixes: tuple) -> set:
    """The keys under ``prefixes`` whose tensors differ between ``a`` and ``b``."""
    return {k for k in a if k.startswith(prefixes) and not torch.equal(a[k], b[k])}


def keys(state: dict[str, torch.Tensor], prefixes: tuple) -> set:
    return {k for k in state if k.startswith(prefixes)}


ENCODER, DECODER = ("encoder.",), ("decoder.", "segmentation_head.")


def check_frozen_then_trained(states: list[dict[str, torch.Tensor]]) -> None:
    """Epoch 1 left the encoder as it was, epoch 2 trained it; the decoder trained in both."""
    start, first, second = states
    assert not changed(start, first, ENCODER)  # weights and batch-norm statistics
    running = {k for k in keys(start, ENCODER) if "running_" in k}
    assert running and running <= changed(first, second, ENCODER)
    weights = {k for k in keys(start, ENCODER) if k.endswith("weight")}
    assert weights <= changed(first, second, ENCODER)
    assert changed(start, first, DECODER) and changed(first, second, DECODER)


@pytest.mark.slow
def test_training_freezes_the_encoder_for_the_first_epoch(make_config, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="segscale")
    states = trained_states(
        make_config,
        tmp_path / "states.pt",
        "training.freeze_encoder_epochs=1",
        "training.encoder_lr_factor=0.5",
    )
    check_frozen_then_trained(states)
    for message in (
        "training.encoder_lr_factor=0.5: the encoder learns at",
        "training.freeze_encoder_epochs=1: the encoder is frozen",
        "the encoder is unfrozen, from epoch 2 on",
    ):
        assert message in caplog.text


@pytest.mark.slow
def test_a_resumed_run_stays_frozen_until_its_epoch(make_config, tmp_path):
    frozen_for_two = ["training.freeze_encoder_epochs=2", "trainer.max_epochs=1"]
    first = trained_states(make_config, tmp_path / "first.pt", *frozen_for_two)
    resumed = trained_states(
        make_config,
        tmp_path / "resumed.pt",
        *frozen_for_two,
        "trainer.max_epochs=2",
        f"ckpt_path={tmp_path / 'run' / 'checkpoints' / 'last.ckpt'}",
    )
    assert not changed(first[-1], resumed[0], ("",))  # it continues where the first stopped
    assert not changed(first[0], resumed[-1], ENCODER)  # epoch 2 of 2 frozen: as it started
    assert changed(resumed[0], resumed[-1], DECODER)


@pytest.mark.slow
def test_ddp_trains_with_a_frozen_encoder(make_config, tmp_path):
    # The encoder's parameters take part in every step (their gradients are dropped after
    # the all-reduce), so DDP needs no find_unused_parameters; its batch norm, synced
    # while it trains, runs in eval mode (no collective) while frozen, alike on each rank.
    states = trained_states(
        make_config,
        tmp_path / "states.pt",
        "training.freeze_encoder_epochs=1",
        "strategy=ddp_spawn",
        "trainer.devices=2",
        "datamodule.batch_size=2",
    )
    check_frozen_then_trained(states)
