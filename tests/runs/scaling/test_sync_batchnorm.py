"""GlobalBatchNorm on two gloo ranks equals nn.BatchNorm2d on the concatenated batch.

Every two-rank check runs in one pair of spawned processes (``ranks``, below), since
starting them costs more than all the checks together.
"""

from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from timm.layers import BatchNormAct2d
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from segscale.errors import ConfigError
from segscale.runs.scaling.sync_batchnorm import GlobalBatchNorm, convert_sync_batchnorm
from tests.helpers.distributed import on_two_ranks
from tests.helpers.host_syncs import HostSyncCounter


def by_value(result: Any) -> Any:
    """``result`` with its tensors as numpy arrays, which a queue pickles by value.

    (Torch shares a tensor sent through a queue with a handle into the sending
    process, which may have exited by the time it is read.)
    """
    if isinstance(result, torch.Tensor):
        return result.detach().numpy()
    if isinstance(result, dict):
        return {key: by_value(value) for key, value in result.items()}
    if isinstance(result, (list, tuple)):
        return type(result)(by_value(value) for value in result)
    return result


def as_tensors(result: Any) -> Any:
    """The inverse of ``by_value``."""
    if isinstance(result, np.ndarray):
        return torch.from_numpy(result)
    if isinstance(result, dict):
        return {key: as_tensors(value) for key, value in result.items()}
    if isinstance(result, (list, tuple)):
        return type(result)(as_tensors(value) for value in result)
    return result


def batch() -> torch.Tensor:
    return torch.randn(6, 3, 5, 5, generator=torch.Generator().manual_seed(0)) * 3 + 1


def uneven_batch(dtype: torch.dtype = torch.float64) -> torch.Tensor:
    # A large mean against the spread: E[x²] - mean² would lose the variance in float32.
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(5, 3, 4, 6, generator=generator) * 0.5 + 40).to(dtype)


def upstream() -> torch.Tensor:
    """A fixed gradient for the normalized output of the uneven batch."""
    generator = torch.Generator().manual_seed(2)
    return torch.randn(5, 3, 4, 6, generator=generator, dtype=torch.float64)


# Uneven shares of the batch of 5: rank 0 takes 4 samples and rank 1 one, or all 5 and none.
SHARES = {"4+1": (4, 1), "5+0": (5, 0)}
CASES = {"4+1": ("4+1", 0.1), "5+0": ("5+0", 0.1), "4+1-cumulative-average": ("4+1", None)}


def rows(share: str, rank: int) -> slice:
    counts = SHARES[share]
    return slice(sum(counts[:rank]), sum(counts[: rank + 1]))


def two_steps(norm: nn.Module, part: slice, reduce_grads: bool) -> list[dict[str, torch.Tensor]]:
    """Two training steps of ``norm`` on rows ``part`` of the uneven batch (×1, then ×2)."""
    norm.weight.data = torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64)
    norm.bias.data = torch.tensor([0.1, -0.2, 0.3], dtype=torch.float64)
    results = []
    for step in range(2):
        norm.zero_grad()
        x = (uneven_batch() * (step + 1))[part].requires_grad_()
        y = norm(x)
        (y * upstream()[part]).sum().backward()
        if reduce_grads:  # DDP averages them; the loss here is a sum over ranks: sum them
            dist.all_reduce(norm.weight.grad)
            dist.all_reduce(norm.bias.grad)
        results.append(
            {
                "output": y.detach(),
                "input_grad": x.grad,
                "weight_grad": norm.weight.grad.clone(),
                "bias_grad": norm.bias.grad.clone(),
                "running_mean": norm.running_mean.clone(),
                "running_var": norm.running_var.clone(),
            }
        )
    return results


class CollectivesAndPasses(TorchDispatchMode):
    """Counts collectives, separately before and after ``backward`` starts.

    Both kinds: ``c10d`` (torch.distributed) and ``_c10d_functional`` (functional
    collectives), less the latter's ``wait_tensor`` (waits for one) and
    ``_wrap_tensor_autograd`` (attaches its backward).
    """

    NOT_COLLECTIVES = ("wait_tensor", "_wrap_tensor_autograd")

    def __init__(self) -> None:
        super().__init__()
        self.counts = {"forward": Counter(), "backward": Counter()}
        self.phase = "forward"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if func.namespace in ("c10d", "_c10d_functional") and (
            name.split("::")[-1] not in self.NOT_COLLECTIVES
        ):
            self.counts[self.phase][name] += 1
        return func(*args, **(kwargs or {}))


def _halves(rank: int) -> list[torch.Tensor]:
    norm = GlobalBatchNorm(3)
    norm.weight.data = torch.tensor([1.0, 2.0, 0.5])
    x = batch()[3 * rank : 3 * rank + 3].requires_grad_()
    y = norm(x)
    # The loss of the whole batch is the mean of the two halves' losses.
    (y * torch.arange(75.0).view(1, 3, 5, 5)).sum().div(2).backward()
    dist.all_reduce(norm.weight.grad)
    return [y.detach(), x.grad, norm.weight.grad, norm.running_var]


def _collectives_and_syncs(rank: int) -> dict[str, Any]:
    norm = GlobalBatchNorm(3)
    x = uneven_batch(torch.float32)[rows("4+1", rank)].requires_grad_()
    with HostSyncCounter() as syncs, CollectivesAndPasses() as collectives:
        y = norm(x)
        collectives.phase = "backward"
        y.square().sum().backward()
    return {
        "collectives": {pass_: dict(counts) for pass_, counts in collectives.counts.items()},
        "host_syncs": syncs.as_dict(),
    }


def _channels_last_and_half(rank: int) -> dict[str, Any]:
    x = uneven_batch(torch.float32)[rows("4+1", rank)]
    last = GlobalBatchNorm(3)(x.contiguous(memory_format=torch.channels_last))
    half = GlobalBatchNorm(3)
    return {
        "last": last,
        "last_is_channels_last": last.is_contiguous(memory_format=torch.channels_last),
        "half": half(x.half()),
        "half_running_mean": half.running_mean,
    }


HALF_TYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def mixed_step(norm: nn.Module, part: slice, dtype: torch.dtype, reduce_grads: bool) -> dict:
    """One step of ``norm`` (float32 parameters) on rows ``part`` in ``dtype``: mixed precision.

    ``norm`` takes the input in ``dtype`` (the ranks) or the same numbers in float32
    (the reference), and the same gradient.
    """
    norm.weight.data = torch.tensor([1.0, 2.0, 0.5])
    norm.bias.data = torch.tensor([0.1, -0.2, 0.3])
    x = uneven_batch(torch.float32).to(dtype)[part]
    x = (x if reduce_grads else x.float()).requires_grad_()
    y = norm(x)
    (y * upstream().to(dtype)[part].to(y.dtype)).sum().backward()
    if reduce_grads:
        dist.all_reduce(norm.weight.grad)
        dist.all_reduce(norm.bias.grad)
    # numpy (which carries the results between processes) has no bfloat16: the types apart
    return {
        "types": [str(y.dtype), str(x.grad.dtype), str(norm.weight.grad.dtype)],
        "output": y.detach().float(),
        "input_grad": x.grad.float(),
        "weight_grad": norm.weight.grad,
        "bias_grad": norm.bias.grad,
        "running_mean": norm.running_mean,
        "running_var": norm.running_var,
    }


def _every_check(rank: int) -> dict[str, Any]:
    results: dict[str, Any] = {"halves": _halves(rank)}
    for case, (share, momentum) in CASES.items():
        norm = GlobalBatchNorm(3, momentum=momentum).double()
        results[case] = two_steps(norm, rows(share, rank), reduce_grads=True)
    for share in SHARES:
        for name, dtype in HALF_TYPES.items():
            part = rows(share, rank)
            results[f"mixed {share} {name}"] = mixed_step(GlobalBatchNorm(3), part, dtype, True)
    results["layer"] = _collectives_and_syncs(rank)
    results["formats"] = _channels_last_and_half(rank)
    return by_value(results)


@pytest.fixture(scope="module")
def ranks() -> dict[int, dict[str, Any]]:
    """``_every_check`` of each of two gloo ranks."""
    return as_tensors(on_two_ranks(_every_check))


def test_two_ranks_normalize_like_one_process_with_the_whole_batch(ranks):
    norm = nn.BatchNorm2d(3)
    norm.weight.data = torch.tensor([1.0, 2.0, 0.5])
    x = batch().requires_grad_()
    y = norm(x)
    (y * torch.arange(75.0).view(1, 3, 5, 5)).sum().div(2).backward()
    for rank in range(2):
        out, grad_x, grad_w, running_var = ranks[rank]["halves"]
        torch.testing.assert_close(out, y.detach()[3 * rank : 3 * rank + 3], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(grad_x, x.grad[3 * rank : 3 * rank + 3], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(grad_w, norm.weight.grad, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(running_var, norm.running_var, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", list(CASES))
def test_uneven_and_empty_ranks_match_batch_norm_on_the_whole_batch(ranks, case):
    share, momentum = CASES[case]
    expected = two_steps(nn.BatchNorm2d(3, momentum=momentum).double(), slice(None), False)
    for rank in range(2):
        part = rows(share, rank)
        for got, want in zip(ranks[rank][case], expected, strict=True):
            for key in ("output", "input_grad"):
                torch.testing.assert_close(got[key], want[key][part], rtol=1e-9, atol=1e-9)
            for key in ("weight_grad", "bias_grad", "running_mean", "running_var"):
                torch.testing.assert_close(got[key], want[key], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dtype", list(HALF_TYPES))
@pytest.mark.parametrize("share", list(SHARES))
def test_half_precision_inputs_match_batch_norm_on_the_whole_batch(ranks, share, dtype):
    """Mixed precision, uneven and empty ranks: outputs, all gradients, running statistics.

    The reference is float32 batch norm on the same numbers; the ranks' output and input
    gradient are in the half type (rounded once), everything else in float32.
    """
    expected = mixed_step(nn.BatchNorm2d(3), slice(None), HALF_TYPES[dtype], False)
    # A half type's rounding of values up to about 6 (the output) and 40 (the gradient).
    close = {"bfloat16": 2**-8, "float16": 2**-11}[dtype]
    for rank in range(2):
        got, part = ranks[rank][f"mixed {share} {dtype}"], rows(share, rank)
        assert got["types"] == [str(HALF_TYPES[dtype])] * 2 + ["torch.float32"]
        assert got["running_mean"].dtype == torch.float32
        for key in ("output", "input_grad"):
            want = expected[key][part]
            torch.testing.assert_close(got[key], want, rtol=close, atol=close)
        for key in ("weight_grad", "bias_grad", "running_mean", "running_var"):
            torch.testing.assert_close(got[key], expected[key], rtol=1e-5, atol=1e-5)


def test_one_collective_each_way_and_no_host_sync_per_layer(ranks):
    for rank in range(2):
        layer = ranks[rank]["layer"]
        assert layer["collectives"] == {
            "forward": {"c10d::allreduce_": 1},
            "backward": {"c10d::allreduce_": 1},
        }
        assert layer["host_syncs"] == {}


def test_channels_last_and_half_inputs(ranks):
    whole = uneven_batch(torch.float32)
    reference = nn.BatchNorm2d(3)
    expected = reference(whole)
    for rank in range(2):
        got, part = ranks[rank]["formats"], rows("4+1", rank)
        assert got["last_is_channels_last"]
        torch.testing.assert_close(got["last"], expected[part], rtol=1e-4, atol=1e-4)
        # float16 input, float32 statistics (float16 holds 40 ± 0.5 to about 0.02).
        assert got["half"].dtype == torch.float16
        assert got["half_running_mean"].dtype == torch.float32
        torch.testing.assert_close(got["half"].float(), expected[part], rtol=0.05, atol=0.05)
        torch.testing.assert_close(
            got["half_running_mean"], reference.running_mean, rtol=1e-3, atol=1e-3
        )


def test_conversion_keeps_weights_and_statistics():
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Sequential(nn.BatchNorm2d(4)))
    net[1].running_mean.fill_(0.5)
    weight = net[1].weight
    converted = convert_sync_batchnorm(net)
    assert isinstance(converted[1], GlobalBatchNorm) and isinstance(
        converted[2][0], GlobalBatchNorm
    )
    assert converted[1].weight is weight  # the same parameter: an optimizer keeps it
    assert converted[1].running_mean.tolist() == pytest.approx([0.5] * 4)
    assert converted[1].num_features == 4
    # Outside a process group it is plain batch norm.
    x = torch.randn(2, 4, 3, 3)
    reference = nn.BatchNorm2d(4)
    reference.running_mean.fill_(0.5)
    torch.testing.assert_close(converted[1](x), reference(x))


def test_every_batchnorm_kind_gets_the_same_layer():
    net = nn.Sequential(nn.BatchNorm2d(4, momentum=None, affine=False), nn.SyncBatchNorm(4))
    net = net.double().eval()
    converted = convert_sync_batchnorm(net)
    assert all(isinstance(layer, GlobalBatchNorm) for layer in converted)
    assert converted[0].momentum is None and converted[0].weight is None
    assert converted[1].running_var.dtype == torch.float64
    assert not converted[0].training


def test_timms_norm_act_layers_keep_their_activation():
    # timm's BatchNormAct2d (the norm of smp's tu- EfficientNets, MobileNets, LCNets)
    # applies an activation after normalizing: plain batch norm in its place would train
    # a network without it (it did: DDP and one process then trained different networks).
    norm_act = BatchNormAct2d(4, act_layer=nn.Hardswish).double()
    x = torch.randn(2, 4, 3, 3, dtype=torch.float64)
    expected = norm_act(x)
    keys = set(norm_act.state_dict())
    converted = convert_sync_batchnorm(nn.Sequential(norm_act))
    assert isinstance(converted[0], GlobalBatchNorm)
    assert isinstance(converted[0].act, nn.Hardswish)
    assert set(converted[0].state_dict()) == keys  # a checkpoint loads either way
    torch.testing.assert_close(converted[0](x), expected)


class ScaledBatchNorm(nn.BatchNorm2d):
    """A batch norm whose forward does more than batch norm (sync batch norm refuses it)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return 2 * super().forward(input)


def test_a_batchnorm_that_does_more_is_refused_naming_it():
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Sequential(ScaledBatchNorm(4)))
    with pytest.raises(ConfigError, match=r"cannot synchronize 1\.0 \(.*ScaledBatchNorm\)"):
        convert_sync_batchnorm(net)
