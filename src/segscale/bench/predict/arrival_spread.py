"""How far apart GPU ranks reach a sync point: the one assumption of the step model fitted.

A sync point costs its all-reduce plus the wait for the latest rank, E[max of N standard
normals] × the spread (std) of the ranks' arrival
(``segscale.bench.predict.collective_timing``). On CPU ranks bench measures that spread;
on GPUs it has nothing to measure it with, so it takes one of two models, each with two
constants fitted to the same two published rows
(tests/bench/predict/test_published_scaling.py: the spread at a collective to
PaddlePaddle's DeepLabV3+ with synchronized batch norm on 8 V100s in fp32, then the spread at a
host sync to PyTorch's):

- ``CONSTANT``: one spread at every sync point, whatever the step (0.214 ms at a
  collective, 0.733 ms at a host sync).
- ``PER_SEGMENT``: a fraction of the compute between two sync points (the *segment*):
  ranks that left one sync point together drift apart while they compute, as the
  straggler term has it for a whole step (jitter × step). A 44 ms step cut into 127
  segments by 62 batch-norm layers then waits far less at each than a 633 ms step.

``GPU_SPREAD`` is the model that fits the published rows better (the test says how many
of them each puts within the tolerance); ``ALTERNATIVE`` is the other, whose prediction
bench.json shows beside each GPU row.
"""

from __future__ import annotations

from dataclasses import dataclass

from segscale.bench.predict.step_profile import BatchNormSync, Collectives, Host, StepProfile

NO_COLLECTIVES = Collectives()
"""A step with no blocking collective besides synchronized batch norm's."""


@dataclass(frozen=True)
class ArrivalSpread:
    """One model of the ranks' arrival spread on GPUs, with its two fitted constants."""

    name: str
    per_segment: bool
    """Whether the constants are fractions of the segment (else seconds)."""
    collective: float
    """Spread at a collective: seconds, or a fraction of the segment."""
    host_sync: float
    """Spread at a host sync: seconds, or a fraction of the segment."""
    source: str
    """Where the constants come from, in one line."""

    def host(
        self,
        profile: StepProfile,
        sync_batchnorm: BatchNormSync | None,
        collectives: Collectives = NO_COLLECTIVES,
    ) -> Host:
        """The GPU ranks of ``profile``'s step, meeting with this model's spreads."""
        scale = segment_s(profile, sync_batchnorm, collectives) if self.per_segment else 1.0
        return Host(skew_s=self.collective * scale, host_sync_skew_s=self.host_sync * scale)

    def describe(self, profile: StepProfile, sync_batchnorm: BatchNormSync | None) -> str:
        """The spread at a collective of ``profile``'s step, in words, with its source."""
        seconds = self.host(profile, sync_batchnorm).skew_s
        text = f"{1000 * seconds:.3f} ms"
        if self.per_segment:
            text += (
                f" ({self.collective:.1%} of the "
                f"{1000 * segment_s(profile, sync_batchnorm):.2f} ms computed between two)"
            )
        return text

    def as_dict(self) -> dict[str, object]:
        """The model as a plain dict (for bench.json)."""
        return {
            "name": self.name,
            "per_segment": self.per_segment,
            "collective": self.collective,
            "host_sync": self.host_sync,
            "source": self.source,
        }


def segment_s(
    profile: StepProfile,
    sync_batchnorm: BatchNormSync | None,
    collectives: Collectives = NO_COLLECTIVES,
) -> float:
    """Seconds of compute between two sync points of ``profile``'s step, on average.

    The sync points are synchronized batch norm's collectives (layers × forward and
    backward collectives) and the step's other blocking collectives; the step's end is one
    more boundary.
    """
    points = len(collectives.forward)
    if sync_batchnorm is not None:
        per_layer = sync_batchnorm.forward_collectives + sync_batchnorm.backward_collectives
        points += sync_batchnorm.layers * per_layer
    return profile.compute_s / (points + 1)


_FITTED_ON = (
    "fitted to PaddlePaddle's DeepLabV3+ with synchronized batch norm on 8 V100s in fp32, "
    "633 ms steps, and for host syncs to PyTorch's, 900 ms steps"
)

CONSTANT = ArrivalSpread("constant", False, 0.214e-3, 0.733e-3, _FITTED_ON)
"""The same spread at every sync point (seconds)."""

PER_SEGMENT = ArrivalSpread("per segment", True, 0.0446, 0.0802, _FITTED_ON)
"""A spread proportional to the compute between two sync points (fractions of it)."""

GPU_SPREAD = CONSTANT
"""The model GPU predictions use: the one that fits the published rows better."""

ALTERNATIVE = PER_SEGMENT
"""The other model, whose predictions bench.json shows beside the rows."""
