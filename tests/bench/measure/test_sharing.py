"""The host terms from side-by-side loops: arithmetic with fixed inputs."""

from __future__ import annotations

import pytest
from torch import nn

from segscale.bench.measure.sharing import SideBySide, batchnorm_layers, sharing


def test_host_terms_from_alone_and_together():
    alone = SideBySide(1, plain_s=0.40, sync_points_s=None, sync_batchnorm_s=None, sync_points=29)
    # Side by side: 0.50 s plain, +29 ms with a sync point after each of 29 layers, and
    # 0.60 s with synchronized batch norm (2 × 29 sync points = 58 ms, the rest arithmetic).
    together = SideBySide(
        2, plain_s=0.50, sync_points_s=0.529, sync_batchnorm_s=0.60, sync_points=29
    )
    terms = sharing(alone, together)
    assert terms.slowdown == pytest.approx(1.25)
    assert terms.sync_point_s == pytest.approx(0.001)
    assert terms.sync_batchnorm_compute_s == pytest.approx(0.60 - 0.50 - 0.058)
    assert terms.as_dict()["together"]["sync_points"] == 29


def test_noise_never_makes_a_term_negative():
    alone = SideBySide(1, 0.50, None, None, 10)
    together = SideBySide(2, 0.45, 0.44, 0.44, 10)  # a quiet spell: faster side by side
    terms = sharing(alone, together)
    assert (terms.slowdown, terms.sync_point_s, terms.sync_batchnorm_compute_s) == (1.0, 0.0, 0.0)


def test_batchnorm_layers_are_counted_from_the_network():
    net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.Sequential(nn.BatchNorm1d(4)))
    assert len(batchnorm_layers(net)) == 2
    assert batchnorm_layers(nn.Linear(2, 2)) == []
