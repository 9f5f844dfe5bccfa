import copy
import math

import pytest
import torch
from torch import nn

from segscale.configs import compose_config
from segscale.errors import ConfigError
from segscale.models.optim import (
    SOLVERS,
    Schedule,
    build_optimizer,
    clip_gradients,
    lr_scheduler,
)
from tests.helpers.host_syncs import HostSyncCounter


def network() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Conv2d(4, 2, 1, bias=False))


@pytest.mark.parametrize(
    ("solver", "kind"),
    [
        ("sgdm", torch.optim.SGD),
        ("adam", torch.optim.Adam),
        ("adamw", torch.optim.AdamW),
        ("rmsprop", torch.optim.RMSprop),
    ],
)
def test_solvers(solver, kind):
    optimizer = build_optimizer(network(), solver, lr=0.5, weight_decay=0.1)
    assert isinstance(optimizer, kind) and optimizer.param_groups[0]["lr"] == 0.5


def test_norm_layers_and_biases_can_be_left_undecayed():
    net = network()
    decay_all = build_optimizer(net, "sgdm", weight_decay=0.1, decay_norm_and_bias=True)
    assert len(decay_all.param_groups) == 1
    assert len(decay_all.param_groups[0]["params"]) == len(list(net.parameters()))
    split = build_optimizer(net, "sgdm", weight_decay=0.1, decay_norm_and_bias=False)
    decayed, exempt = split.param_groups
    assert decayed["weight_decay"] == 0.1 and exempt["weight_decay"] == 0.0
    # conv1 weight and conv2 weight are decayed; conv1 bias, BN weight and bias are not.
    assert {id(p) for p in decayed["params"]} == {id(net[0].weight), id(net[2].weight)}
    assert len(exempt["params"]) == 3


@pytest.mark.parametrize("solver", ["sgdm", "adam", "adamw"])
def test_a_fused_optimizer_steps_as_the_default_one(solver):
    torch.manual_seed(0)
    # No bias before the batch norm: its gradient is 0 up to rounding, and Adam's
    # normalised update (g / sqrt(v)) would turn that rounding into steps of size lr.
    nets = [nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4), nn.Conv2d(4, 2, 1))]
    nets.append(copy.deepcopy(nets[0]))
    image, target = torch.randn(2, 3, 8, 8), torch.randn(2, 2, 6, 6)
    optimizers = [
        build_optimizer(nets[0], solver, lr=0.1, weight_decay=0.01),
        build_optimizer(nets[1], solver, lr=0.1, weight_decay=0.01, fused=True),
    ]
    assert optimizers[1].defaults["fused"] is True
    for net, optimizer in zip(nets, optimizers, strict=True):
        for _ in range(3):
            optimizer.zero_grad()
            (net(image) - target).square().mean().backward()
            optimizer.step()
    for default, fused in zip(nets[0].parameters(), nets[1].parameters(), strict=True):
        torch.testing.assert_close(fused, default, rtol=1e-5, atol=1e-6)


def test_a_fused_rmsprop_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"optimizer\.fused=true.*'rmsprop'.*no fused"):
        build_optimizer(network(), "rmsprop", fused=True)


def test_unknown_solver_names_the_key():
    with pytest.raises(ConfigError, match=r"optimizer\.solver='lbfgs'.*sgdm"):
        build_optimizer(network(), "lbfgs")


def rates(schedule: Schedule, steps_per_epoch: int, total: int) -> list[float]:
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = lr_scheduler(optimizer, schedule, steps_per_epoch, total)
    out = []
    for _ in range(total):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def test_piecewise_drops_at_each_period_boundary():
    lr = rates(Schedule("piecewise", drop_period=3, drop_factor=0.2), steps_per_epoch=4, total=40)
    for epoch in range(10):
        expected = 0.2 ** (epoch // 3)
        assert lr[4 * epoch] == pytest.approx(expected) and lr[4 * epoch + 3] == pytest.approx(
            expected
        )


def test_poly_and_cosine_decay_over_training():
    poly = rates(Schedule("poly", power=1.0), steps_per_epoch=5, total=10)
    assert poly == pytest.approx([1 - s / 10 for s in range(10)])
    cosine = rates(Schedule("cosine", min_factor=0.1), steps_per_epoch=5, total=10)
    assert cosine[0] == pytest.approx(1.0) and cosine[5] == pytest.approx(0.55)
    assert rates(Schedule("none"), 5, 10) == [1.0] * 10


def test_warmup_composes_with_a_schedule():
    lr = rates(Schedule("piecewise", drop_period=1, drop_factor=0.5, warmup_steps=4), 4, 12)
    assert lr[:4] == pytest.approx([0.0, 0.25, 0.5, 0.75])  # warmup during epoch 0
    assert lr[4] == pytest.approx(0.5) and lr[8] == pytest.approx(0.25)
    by_epochs = rates(Schedule("poly", power=1.0, warmup_epochs=0.5, warmup_start_factor=0.5), 4, 8)
    assert by_epochs[:3] == pytest.approx([0.5, 0.75 * (1 - 1 / 8), 1 - 2 / 8])


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["scheduler.name=exponential"], r"scheduler\.name"),
        (["scheduler=piecewise", "scheduler.drop_period=0"], r"scheduler\.drop_period"),
        (["scheduler=piecewise", "scheduler.drop_factor=0.0"], r"scheduler\.drop_factor"),
        (["scheduler=piecewise", "scheduler.drop_factor=1.5"], r"scheduler\.drop_factor"),
        (["scheduler.warmup_steps=-1"], r"scheduler\.warmup_steps"),
    ],
)
def test_bad_schedules_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key + "=.* is not allowed: expected"):
        compose_config("train", overrides)


def test_warmup_in_epochs_and_in_steps_is_refused():
    with pytest.raises(ConfigError, match=r"scheduler\.warmup_epochs"):
        Schedule(warmup_epochs=1, warmup_steps=5)


def with_gradients(*gradients: list[float]) -> list[nn.Parameter]:
    parameters = []
    for values in gradients:
        parameter = nn.Parameter(torch.zeros(len(values)))
        parameter.grad = torch.tensor(values)
        parameters.append(parameter)
    return parameters


def test_l2norm_clips_each_parameter_on_its_own():
    small, large = with_gradients([0.3, 0.4], [3.0, 4.0])
    clip_gradients([small, large], 1.0, "l2norm")
    assert small.grad.tolist() == pytest.approx([0.3, 0.4])  # norm 0.5: untouched
    assert large.grad.norm().item() == pytest.approx(1.0)


def test_global_l2norm_clips_all_parameters_together():
    small, large = with_gradients([0.3, 0.4], [3.0, 4.0])
    clip_gradients([small, large], 1.0, "global-l2norm")
    total = torch.cat([small.grad, large.grad]).norm().item()
    assert total == pytest.approx(1.0, rel=1e-4)
    assert small.grad.tolist() == pytest.approx([0.3 / 5.0249, 0.4 / 5.0249], rel=1e-3)


def test_absolute_value_clamps_every_element():
    (parameter,) = with_gradients([-3.0, 0.2, 5.0])
    clip_gradients([parameter], 1.0, "absolute-value")
    assert parameter.grad.tolist() == pytest.approx([-1.0, 0.2, 1.0])
    clip_gradients([parameter], math.inf, "absolute-value")  # .inf: no clipping
    assert parameter.grad.tolist() == pytest.approx([-1.0, 0.2, 1.0])


def test_bad_gradient_thresholds_name_the_key():
    with pytest.raises(ConfigError, match=r"training\.gradient_threshold_method='l1'"):
        compose_config(
            "train", ["training.gradient_threshold=1.0", "training.gradient_threshold_method=l1"]
        )
    with pytest.raises(ConfigError, match=r"training\.gradient_threshold=0"):
        compose_config(
            "train", ["training.gradient_threshold=0", "training.gradient_threshold_method=l2norm"]
        )


def double_gradients(*gradients: list[float]) -> list[nn.Parameter]:
    """Float64 parameters with these gradients: clipping groups tensors by type."""
    parameters = with_gradients(*gradients)
    for parameter in parameters:
        parameter.data, parameter.grad = parameter.data.double(), parameter.grad.double()
    return parameters


@pytest.mark.parametrize("method", ["l2norm", "global-l2norm", "absolute-value"])
def test_clipping_never_makes_the_host_wait_for_the_device(method):
    parameters = [*with_gradients([0.3, 0.4], [0.0, 0.0]), *double_gradients([3.0, 4.0])]
    with HostSyncCounter() as counter:
        clip_gradients(parameters, 1.0, method)
    assert counter.as_dict() == {}


def test_l2norm_leaves_zero_and_small_gradients_as_they_are():
    zero, small = with_gradients([0.0, 0.0], [0.3, 0.4])
    (large,) = double_gradients([30.0, 40.0])
    clip_gradients([zero, small, large, nn.Parameter(torch.ones(2))], 1.0, "l2norm")
    assert zero.grad.tolist() == [0.0, 0.0]
    assert small.grad.tolist() == pytest.approx([0.3, 0.4])
    assert large.grad.tolist() == pytest.approx([0.6, 0.8]) and large.grad.dtype == torch.float64


class EncoderDecoder(nn.Module):
    """A network with parts, as segmentation_models_pytorch builds them."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
        self.decoder = nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4))
        self.head = nn.Conv2d(4, 2, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.decoder(self.encoder(x)))


def ids(parameters) -> set[int]:
    return {id(p) for p in parameters}


def test_the_encoder_learns_at_its_factor_of_the_rate():
    net = EncoderDecoder()
    optimizer = build_optimizer(net, "sgdm", lr=0.5, momentum=0.9, encoder_lr_factor=0.1)
    decoder, encoder = optimizer.param_groups
    # The decoder's group first: it is the one the summary and the verbose log read.
    assert (decoder["name"], decoder["lr"], decoder["lr_factor"]) == ("decoder", 0.5, 1.0)
    assert (encoder["name"], encoder["lr"], encoder["lr_factor"]) == ("encoder", 0.05, 0.1)
    assert ids(encoder["params"]) == ids(net.encoder.parameters())
    assert ids(decoder["params"]) == ids([*net.decoder.parameters(), *net.head.parameters()])
    # At 1 the groups are those of a network without parts, unnamed.
    plain = build_optimizer(net, "sgdm", lr=0.5)
    assert len(plain.param_groups) == 1 and "name" not in plain.param_groups[0]


def test_the_schedule_scales_both_groups_alike():
    optimizer = build_optimizer(EncoderDecoder(), "sgdm", lr=0.4, encoder_lr_factor=0.25)
    scheduler = lr_scheduler(optimizer, Schedule("poly", power=1.0, warmup_steps=2), 5, 10)
    for step in range(10):
        decoder, encoder = (group["lr"] for group in optimizer.param_groups)
        expected = Schedule("poly", power=1.0, warmup_steps=2).factor(step, 5, 10)
        assert decoder == pytest.approx(0.4 * expected)
        assert encoder == pytest.approx(0.1 * expected)
        optimizer.step()
        scheduler.step()
    assert decoder < 0.4 * 0.2  # it did decay


def test_the_encoder_factor_keeps_the_decay_rules():
    net = EncoderDecoder()
    optimizer = build_optimizer(
        net, "adamw", lr=0.01, weight_decay=0.1, decay_norm_and_bias=False, encoder_lr_factor=0.5
    )
    groups = {group["name"]: group for group in optimizer.param_groups}
    assert list(groups) == ["decoder", "decoder_no_decay", "encoder", "encoder_no_decay"]
    expected = {
        "decoder": ({id(net.decoder[0].weight), id(net.head.weight)}, 0.1, 0.01),
        "decoder_no_decay": (ids([net.decoder[0].bias, *net.decoder[1].parameters()]), 0.0, 0.01),
        "encoder": ({id(net.encoder[0].weight)}, 0.1, 0.005),
        "encoder_no_decay": (ids([net.encoder[0].bias, *net.encoder[1].parameters()]), 0.0, 0.005),
    }
    for name, (params, decay, lr) in expected.items():
        group = groups[name]
        assert (ids(group["params"]), group["weight_decay"], group["lr"]) == (params, decay, lr)


@pytest.mark.parametrize("solver", list(SOLVERS))
def test_a_zero_factor_leaves_the_encoder_as_it_is(solver):
    # Weight decay and momentum (or moments) go through the rate too: at 0 nothing moves.
    net = EncoderDecoder()
    before = {name: p.detach().clone() for name, p in net.named_parameters()}
    optimizer = build_optimizer(net, solver, lr=0.1, weight_decay=0.1, encoder_lr_factor=0.0)
    for _ in range(3):
        optimizer.zero_grad()
        net(torch.randn(2, 3, 6, 6)).square().mean().backward()
        optimizer.step()
    for name, parameter in net.named_parameters():
        assert torch.equal(parameter, before[name]) is name.startswith("encoder."), name


def test_an_encoder_factor_needs_an_encoder():
    with pytest.raises(ConfigError, match=r"training\.encoder_lr_factor=0\.1 needs .*encoder"):
        build_optimizer(network(), encoder_lr_factor=0.1)
    build_optimizer(network(), encoder_lr_factor=1.0)  # the default asks for none


@pytest.mark.parametrize("factor", ["-0.5", "inf", "nan", "true", "'0.1'"])
def test_a_bad_encoder_factor_names_the_key(factor):
    with pytest.raises(ConfigError, match=r"training\.encoder_lr_factor=.*expected a number >= 0"):
        compose_config("train", [f"training.encoder_lr_factor={factor}"])
