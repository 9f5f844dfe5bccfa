import pytest
import torch
import torch.distributed as dist
from torch import nn

from segscale.training.sync_batchnorm import CPUSyncBatchNorm, convert_sync_batchnorm
from tests.distributed import on_two_ranks


def batch() -> torch.Tensor:
    return torch.randn(6, 3, 5, 5, generator=torch.Generator().manual_seed(0)) * 3 + 1


def _synced_half(rank: int) -> tuple[torch.Tensor, ...]:
    norm = CPUSyncBatchNorm(3)
    norm.weight.data = torch.tensor([1.0, 2.0, 0.5])
    x = batch()[3 * rank : 3 * rank + 3].requires_grad_()
    y = norm(x)
    # The loss of the whole batch is the mean of the two halves' losses.
    (y * torch.arange(75.0).view(1, 3, 5, 5)).sum().div(2).backward()
    dist.all_reduce(norm.weight.grad)
    return y.detach(), x.grad, norm.weight.grad, norm.running_var.clone()


def test_two_ranks_normalize_like_one_process_with_the_whole_batch():
    results = on_two_ranks(_synced_half)

    norm = nn.BatchNorm2d(3)
    norm.weight.data = torch.tensor([1.0, 2.0, 0.5])
    x = batch().requires_grad_()
    y = norm(x)
    (y * torch.arange(75.0).view(1, 3, 5, 5)).sum().div(2).backward()
    for rank in range(2):
        out, grad_x, grad_w, running_var = results[rank]
        torch.testing.assert_close(out, y.detach()[3 * rank : 3 * rank + 3], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(grad_x, x.grad[3 * rank : 3 * rank + 3], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(grad_w, norm.weight.grad, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(running_var, norm.running_var, rtol=1e-5, atol=1e-6)


def test_conversion_keeps_weights_and_statistics():
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Sequential(nn.BatchNorm2d(4)))
    net[1].running_mean.fill_(0.5)
    converted = convert_sync_batchnorm(net, "cpu")
    assert isinstance(converted[1], CPUSyncBatchNorm) and isinstance(
        converted[2][0], CPUSyncBatchNorm
    )
    assert converted[1].running_mean.tolist() == pytest.approx([0.5] * 4)
    assert converted[1].num_features == 4
    # Outside a process group it is plain batch norm.
    x = torch.randn(2, 4, 3, 3)
    reference = nn.BatchNorm2d(4)
    reference.running_mean.fill_(0.5)
    torch.testing.assert_close(converted[1](x), reference(x))
