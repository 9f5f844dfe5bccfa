import logging
from functools import partial
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch import nn

from segscale.models.losses import SegmentationLoss
from segscale.models.metrics import scores_from_confusion
from segscale.models.module import SegmentationModule
from segscale.models.nonfinite import NonFiniteError
from segscale.models.optim import Schedule, build_optimizer
from tests.helpers.distributed import on_two_ranks


class PixelLinear(nn.Module):
    """A 1×1 convolution: enough of a network to test the module around it."""

    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def module(classes: int = 3, **kwargs) -> SegmentationModule:
    torch.manual_seed(0)
    return SegmentationModule(
        PixelLinear(classes),
        partial(torch.optim.SGD, lr=0.1),
        classes,
        ["a", "b", "c"][:classes],
        **kwargs,
    )


def attach_trainer(seg: SegmentationModule, world_size: int, reduce) -> list[tuple]:
    """Stand in for the parts of a Trainer that training_step uses; returns the logged."""
    logged = []
    strategy = SimpleNamespace(reduce=lambda tensor, reduce_op: reduce(tensor))
    seg.trainer = SimpleNamespace(
        world_size=world_size, strategy=strategy, global_step=0, log_every_n_steps=10
    )
    seg.log = lambda name, value, **kwargs: logged.append((name, value))
    return logged


@pytest.mark.parametrize(("step", "logged"), [(0, True), (1, False), (8, False), (9, True)])
def test_training_metrics_are_logged_on_logged_steps_only(step, logged):
    # self.log costs ~0.25 ms of Lightning's bookkeeping each; the accuracy an argmax.
    seg = module()
    metrics = attach_trainer(seg, world_size=1, reduce=lambda counts: counts)
    seg.trainer.global_step = step
    seg.training_step(batches(1)[0], 0)
    assert ("train/acc" in dict(metrics)) is logged
    assert ("train/loss" in dict(metrics)) is logged


def test_loss_ignores_the_ignore_index():
    seg = module()
    logits = torch.randn(2, 3, 4, 4)
    mask = torch.randint(0, 3, (2, 4, 4))
    _, valid = seg._loss(logits, mask)
    ignored = mask.clone()
    ignored[:, :2] = 255
    loss_part, valid_part = seg._loss(logits, ignored)
    expected = nn.functional.cross_entropy(logits, mask, reduction="none")[:, 2:].mean()
    assert valid == 32 and valid_part == 16
    assert loss_part.item() == pytest.approx(expected.item(), rel=1e-5)
    all_ignored, _ = seg._loss(logits, torch.full_like(mask, 255))
    assert all_ignored.item() == 0.0


def test_the_default_objective_is_unchanged_cross_entropy():
    # What training_step returned before losses were configurable, to the last bit.
    seg = module()
    batch = batches(1)[0]
    other_rank_pixels = 37
    logged = attach_trainer(seg, world_size=2, reduce=lambda counts: counts + other_rank_pixels)
    objective = seg.training_step(batch, 0)
    logits = seg(batch["image"])
    pixel_sum = nn.CrossEntropyLoss(ignore_index=255, reduction="sum")(logits, batch["mask"])
    valid = (batch["mask"] != 255).sum()
    assert torch.equal(objective, pixel_sum * 2 / (valid + other_rank_pixels).clamp(min=1))
    assert torch.equal(dict(logged)["train/loss"], pixel_sum / valid.clamp(min=1))
    assert objective.dtype == torch.float32


def test_a_configured_loss_is_used():
    loss = SegmentationLoss(3, cross_entropy=0.0, dice=1.0)
    seg = module(loss=loss)
    batch = batches(1)[0]
    attach_trainer(seg, world_size=1, reduce=lambda counts: counts)
    expected = loss(seg(batch["image"]), batch["mask"]).batch_term
    assert seg.training_step(batch, 0).item() == pytest.approx(expected.item(), rel=1e-6)


def weighted_loss() -> SegmentationLoss:
    return SegmentationLoss(3, cross_entropy=1.0, focal=0.5, class_weights=[0.5, 2.0, 1.0])


def gradient(seg: SegmentationModule, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    seg.zero_grad()
    seg.training_step(batch, 0).backward()
    return torch.cat([p.grad.flatten() for p in seg.network.parameters()])


def uneven_share(rank: int) -> dict[str, torch.Tensor]:
    # Rank 0 gets three images, rank 1 one, with different ignored areas.
    data = batches(2)
    whole = {key: torch.cat([b[key] for b in data]) for key in ("image", "mask")}
    return {key: value[:3] if rank == 0 else value[3:] for key, value in whole.items()}


def _ddp_gradient_of_share(rank: int) -> list[float]:
    seg = module(loss=weighted_loss())

    def all_reduce(tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor)
        return tensor

    attach_trainer(seg, world_size=2, reduce=all_reduce)
    grad = gradient(seg, uneven_share(rank))
    dist.all_reduce(grad)  # what DDP does with the ranks' gradients: their mean
    return (grad / 2).tolist()


def _every_share(rank: int) -> dict[str, list[float]]:
    """What the DDP tests of this file compute on ``rank``: the gradient, then the metrics."""
    return {"gradient": _ddp_gradient_of_share(rank), "metrics": _metrics_of_share(rank)}


@pytest.fixture(scope="module")
def on_ranks() -> dict[int, dict[str, list[float]]]:
    """``_every_share`` of ranks 0 and 1, in one 2-process group for both DDP tests.

    Starting the two processes (their imports) is most of such a test's time.
    """
    return on_two_ranks(_every_share)


def test_gradients_under_ddp_equal_one_process(on_ranks):
    results = {rank: found["gradient"] for rank, found in on_ranks.items()}
    seg = module(loss=weighted_loss())
    attach_trainer(seg, world_size=1, reduce=lambda counts: counts)
    whole = {k: torch.cat([uneven_share(0)[k], uneven_share(1)[k]]) for k in ("image", "mask")}
    expected = gradient(seg, whole).tolist()
    assert results[0] == pytest.approx(expected, rel=1e-5, abs=1e-7)
    assert results[1] == results[0]


def test_checkpoints_carry_the_inference_metadata():
    metadata = {"arch": "Unet", "num_classes": 3, "class_names": ["a", "b", "c"]}
    checkpoint: dict = {}
    module(inference_metadata=metadata).on_save_checkpoint(checkpoint)
    assert checkpoint["segscale"] == metadata
    bare: dict = {}
    module().on_save_checkpoint(bare)
    assert "segscale" not in bare


def batches(count: int = 4) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    out = []
    for _ in range(count):
        mask = torch.randint(0, 3, (2, 8, 8), generator=generator)
        mask[:, 0] = 255
        image = torch.randint(0, 256, (2, 3, 8, 8), generator=generator, dtype=torch.uint8)
        out.append({"image": image, "mask": mask})
    return out


def metric_values(seg: SegmentationModule, data: list[dict[str, torch.Tensor]]) -> list[float]:
    with torch.no_grad():
        for batch in data:
            logits = seg(batch["image"])
            loss, valid = seg._loss(logits, batch["mask"])
            seg.val_loss.update(loss, weight=valid)
            seg.val_confusion.update(logits.argmax(1), batch["mask"])
    scores = scores_from_confusion(seg.val_confusion.compute())
    return [seg.val_loss.compute().item(), scores["acc"].item(), scores["mIoU"].item()]


def _metrics_of_share(rank: int) -> list[float]:
    # Uneven shares: rank 0 sees three batches, rank 1 one.
    data = batches()
    return metric_values(module(), data[:3] if rank == 0 else data[3:])


def test_metrics_under_ddp_equal_one_process(on_ranks):
    results = {rank: found["metrics"] for rank, found in on_ranks.items()}
    expected = metric_values(module(), batches())
    assert results[0] == pytest.approx(expected, rel=1e-6)
    assert results[1] == pytest.approx(expected, rel=1e-6)
    # Averaging the per-rank values instead would be wrong here.
    first, second = metric_values(module(), batches()[:3]), metric_values(module(), batches()[3:])
    averaged = [(a + b) / 2 for a, b in zip(first, second, strict=True)]
    assert averaged != pytest.approx(expected, rel=1e-6)


def test_the_module_clips_before_each_optimizer_step():
    seg = SegmentationModule(
        PixelLinear(),
        partial(torch.optim.SGD, lr=0.1),
        3,
        ["a", "b", "c"],
        gradient_threshold=0.5,
        gradient_threshold_method="global-l2norm",
    )
    for parameter in seg.parameters():
        parameter.grad = torch.full_like(parameter, 10.0)
    seg.on_before_optimizer_step(optimizer=None)
    total = torch.cat([p.grad.flatten() for p in seg.parameters()]).norm().item()
    assert total == pytest.approx(0.5, rel=1e-4)


def test_channels_last_converts_weights_and_inputs():
    network = PixelLinear()
    network.conv = nn.Conv2d(3, 3, 3, padding=1)  # 1×1 weights look contiguous either way
    assert not network.conv.weight.is_contiguous(memory_format=torch.channels_last)
    seg = SegmentationModule(
        network, partial(torch.optim.SGD, lr=0.1), 3, ["a", "b", "c"], channels_last=True
    )
    assert seg.network.conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert seg(torch.zeros(2, 3, 8, 8, dtype=torch.uint8)).shape == (2, 3, 8, 8)


HOST_SYNCS = ("item", "__bool__", "__float__", "__int__", "tolist", "cpu", "numpy")


def test_a_training_step_syncs_with_the_host_once(monkeypatch):
    """The non-finite check's verdict is read once per step, a step late; nothing else.

    On a GPU each of these calls makes the host wait for the device: counted here on CPU
    tensors, which run the same code. Over two steps, the one read is the first step's
    verdict in the second's optimizer step (on a GPU from pinned memory, long arrived).
    """
    seg = module()
    attach_trainer(seg, world_size=1, reduce=lambda counts: counts)
    seg.trainer.global_step, seg.trainer.precision = 1, "32-true"  # a step that logs nothing
    optimizer = torch.optim.SGD(seg.parameters(), lr=0.1)
    batch = batches(1)[0]
    calls = []
    for name in HOST_SYNCS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            calls.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    seg.training_step(batch, 0).backward()
    seg.on_before_optimizer_step(optimizer)
    assert calls == []  # the first step's verdict is on its way, not read
    seg.training_step(batch, 0).backward()
    seg.on_before_optimizer_step(optimizer)
    assert calls == ["tolist"]


@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_a_nan_loss_stops_or_changes_nothing(policy):
    seg = module(on_nonfinite=policy)
    seg.network.bn = nn.BatchNorm2d(3)  # statistics a NaN forward pass would spoil
    forward = seg.network.forward
    seg.network.forward = lambda x: seg.network.bn(forward(x))
    attach_trainer(seg, world_size=1, reduce=lambda counts: counts)
    seg.trainer.global_step, seg.trainer.current_epoch = 3, 0
    seg.trainer.precision, seg.trainer.is_global_zero = "32-true", True
    optimizer = torch.optim.SGD(seg.parameters(), lr=0.1, momentum=0.9)
    seg.trainer.optimizers = [optimizer]
    before = {k: v.clone() for k, v in seg.state_dict().items()}
    batch = dict(batches(1)[0])
    batch["image"] = torch.full(batch["image"].shape, float("nan"))
    seg.training_step(batch, 0).backward()
    if policy == "stop":
        seg.on_before_optimizer_step(optimizer)  # the verdict is read a step later:
        seg.trainer.global_step = 4
        # no checkpoint of the weights it changed is written
        with pytest.raises(
            NonFiniteError, match=r"the loss is not finite .* at step 3 \(epoch 0\)"
        ):
            seg.on_save_checkpoint({})
        assert seg.stopped_at_step == 3
        return
    seg.on_before_optimizer_step(optimizer)
    optimizer.step()
    assert seg.skipped_steps == 1
    for key, value in seg.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert not optimizer.state  # no momentum buffer was started


def nan_ready(seg: SegmentationModule) -> torch.optim.Optimizer:
    """A stand-in trainer with what the non-finite check reads; returns the optimizer."""
    attach_trainer(seg, world_size=1, reduce=lambda counts: counts)
    optimizer = torch.optim.SGD(seg.parameters(), lr=0.1)
    seg.trainer.global_step, seg.trainer.current_epoch = 3, 0
    seg.trainer.precision, seg.trainer.is_global_zero = "32-true", True
    seg.trainer.optimizers, seg.trainer.sanity_checking = [optimizer], False
    return optimizer


def test_a_nan_in_any_accumulated_micro_batch_counts():
    seg = module()
    optimizer = nan_ready(seg)
    poisoned = dict(batches(1)[0])
    poisoned["image"] = torch.full(poisoned["image"].shape, float("nan"))
    seg.training_step(poisoned, 0).backward()
    seg.training_step(batches(1)[0], 1).backward()  # the last micro-batch is fine
    seg.on_before_optimizer_step(optimizer)
    with pytest.raises(NonFiniteError, match="the loss is not finite"):
        seg.on_train_end()  # nor are the weights it changed reported


def test_a_non_finite_gradient_of_a_finite_loss_stops_without_clipping():
    seg = module()
    optimizer = nan_ready(seg)
    seg.training_step(batches(1)[0], 0).backward()
    seg.network.conv.bias.grad[0] = float("inf")
    seg.on_before_optimizer_step(optimizer)
    seg.trainer.global_step = 4
    with pytest.raises(NonFiniteError, match=r"the gradient is not finite .* at step 3"):
        seg.on_validation_start()  # nor are the weights it changed validated
    # The next step starts afresh: finite ones go through.
    for step in (4, 5):
        seg.trainer.global_step = step
        optimizer.zero_grad()
        seg.training_step(batches(1)[0], 0).backward()
        seg.on_before_optimizer_step(optimizer)
    seg.on_train_end()


def test_a_non_finite_validation_loss_stops_the_run():
    seg = module()
    nan_ready(seg)
    logits, mask = torch.randn(1, 3, 4, 4), torch.randint(0, 3, (1, 4, 4))
    seg.val_confusion.update(logits.argmax(1), mask)
    seg.val_loss.update(torch.tensor(float("nan")), weight=16)
    with pytest.raises(NonFiniteError, match="the validation loss is not finite"):
        seg.on_validation_epoch_end()


class EncoderAndHead(nn.Module):
    """An encoder and a head, as segmentation_models_pytorch networks have them."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Conv2d(3, 4, 1)
        self.head = nn.Conv2d(4, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def test_the_encoder_rate_is_logged_and_scheduled_with_the_decoders(caplog):
    factory = partial(build_optimizer, solver="sgdm", lr=0.2, encoder_lr_factor=0.5)
    seg = SegmentationModule(
        EncoderAndHead(), factory, 3, ["a", "b", "c"], schedule=Schedule("poly")
    )
    seg.trainer = SimpleNamespace(
        is_global_zero=True,
        estimated_stepping_batches=10,
        train_dataloader=[],
        num_training_batches=5,
        accumulate_grad_batches=1,
    )
    caplog.set_level(logging.INFO, logger="segscale.models.module")
    configured = seg.configure_optimizers()
    message = (
        "training.encoder_lr_factor=0.5: the encoder learns at 0.1, the decoder and head at 0.2"
    )
    assert message in caplog.text
    optimizer, scheduler = configured["optimizer"], configured["lr_scheduler"]["scheduler"]
    for _ in range(3):
        optimizer.step()
        scheduler.step()
    decoder, encoder = (group["lr"] for group in optimizer.param_groups)
    assert decoder < 0.2 and encoder == pytest.approx(decoder * 0.5)
