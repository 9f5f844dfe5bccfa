"""The step model fed with what bench measured: predictions per interconnect and here.

The GPU predictions start from one device's step: only a GPU's measured step is a GPU's.
Where bench measured a CPU there are none (bench has no basis for this config's step on a
GPU: no published step time of it, and its FLOPs give a GPU's step only at a share of the
GPU's peak that bench has not measured); this machine's N are predicted either way.
Where the GPU ranks would use gloo (``segscale.bench.predict.host_staged_link``: Windows, or the
config's choice), the same N GPUs are predicted over gloo's link through host memory
(``segscale.bench.predict.host_staged_link``) beside the NCCL rows, which then say what Linux
or WSL2 would give.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from omegaconf import DictConfig

from segscale.bench.measure.compute import (
    BareLoopResult,
)
from segscale.bench.measure.sharing import Sharing
from segscale.bench.measure.timing import Timing
from segscale.bench.predict.arrival_spread import ALTERNATIVE, GPU_SPREAD, ArrivalSpread, segment_s
from segscale.bench.predict.collective_timing import expected_max_standard_normal
from segscale.bench.predict.host_staged_link import GpuBackend, HostStagedLink
from segscale.bench.predict.interconnects import INTERCONNECTS, Link
from segscale.bench.predict.step_model import predict
from segscale.bench.predict.step_profile import (
    SYNC_BATCHNORM_COLLECTIVES,
    BatchNormSync,
    Collectives,
    Gradients,
    Host,
    StepProfile,
)


@dataclass(frozen=True)
class ModelInputs:
    """What bench measured that the step model needs."""

    bare: BareLoopResult
    lightning: Timing
    compute: dict[str, Any]
    gradients: Gradients
    data_rates: dict[int, float]  # ranks → patches/s of each rank's workers
    sharing: Sharing | None  # CPU ranks side by side (None on GPUs)
    sync_batchnorm: bool  # the ddp runs' setting
    one_device_s: float | None  # the 1-device ddp run's mean step, when it ran

    def profile(self) -> StepProfile:
        """One device's step as ``train.py`` runs it, split as the bare loop measured it.

        The step is the 1-device ddp run's (data loading, DDP's wrapper and the
        framework included), else the in-memory Lightning step's; less the framework's
        measured overhead, it is split into forward, backward and optimizer in the bare
        loop's proportions.
        """
        overhead = max(0.0, self.compute["overhead"]["overhead_ms"] / 1000)
        step = self.one_device_s or self.lightning.mean_s
        scale = max(step - overhead, 0.5 * step) / self.bare.step.mean_s
        return StepProfile(
            forward_s=self.bare.forward_s * scale,
            backward_s=self.bare.backward_s * scale,
            optimizer_s=self.bare.optimizer_s * scale,
            batch=self.compute["batch"],
            jitter=self.lightning.jitter,
            overhead_s=overhead,
        )

    def gpu_basis(self) -> dict[str, Any]:
        """What GPU predictions start from: this GPU's step, and which of its steps."""
        return {
            "device": self.compute["device"],
            "step_s": self.one_device_s or self.lightning.mean_s,
            "step": "the 1-device train.py run's"
            if self.one_device_s
            else "bench's own, data in memory",
        }

    def batchnorm(self, synchronized: bool, compute_s: float = 0.0) -> BatchNormSync | None:
        """Segscale's synchronized batch norm of this network (``None`` when off)."""
        layers = self.compute["batchnorm_layers"]
        if not synchronized or not layers:
            return None
        channels = self.compute["batchnorm_channels"] / layers
        forward, backward, host_syncs = SYNC_BATCHNORM_COLLECTIVES["segscale"]
        message = (2 * channels + 1) * 8  # sums, squared deviations and the count, float64
        return BatchNormSync(layers, message, forward, backward, host_syncs, compute_s)

    def collectives(self) -> Collectives:
        """DDP's buffer broadcast and the loss normaliser's all-reduce."""
        return Collectives.ddp(self.compute["buffer_bytes"])


def prediction_rows(
    inputs: ModelInputs,
    options: DictConfig,
    here: Link | None,
    counts: list[int],
    on_gpu: bool,
    backend: GpuBackend | None = None,
    gloo: HostStagedLink | None = None,
) -> dict[str, Any]:
    """Predicted speed-up on ``bench.predict_devices`` over each interconnect (and this one).

    GPU interconnects (``on_gpu`` only: built from the step measured on this GPU, as its
    ``gpu_basis`` says; none from a CPU's step): each rank its own device, ranks meeting
    with the arrival spread of ``GPU_SPREAD``, synchronized batch norm as the ddp runs
    have it; beside each row, what the other spread model (``ALTERNATIVE``) predicts
    and, with synchronized batch norm on, the prediction with it off. ``gloo``: the link
    of GPU ranks under gloo (``backend`` says why they would be), predicted the same
    way, each row with what the step's gradients spend in each of its parts. This
    machine: its measured all-reduce (on GPUs under gloo, ``gloo``), and on CPUs what the
    ranks measured side by side (slowdown, sync-point cost, batch norm's arithmetic),
    with synchronized batch norm on and off, beside the measured ddp runs.
    """
    profile = inputs.profile()
    rate_1 = inputs.data_rates[1]
    batchnorm = inputs.batchnorm(inputs.sync_batchnorm)
    rows = [
        row
        for link in (INTERCONNECTS if on_gpu else ())
        for row in _link_rows(inputs, link, options.predict_devices, batchnorm)
    ]
    gloo_rows = []
    if on_gpu and gloo is not None:
        for row in _link_rows(inputs, gloo, options.predict_devices, batchnorm):
            parts = gloo.gradient_parts(inputs.gradients, row["devices"])
            gloo_rows.append(row | {"gloo_parts": parts})
    here_rows = []
    if here is not None:
        # CPU ranks: only the N the side-by-side loops measured (slowdown and sync points
        # depend on N); GPUs: every measured N.
        measured_n = [n for n in counts if n > 1]
        if inputs.sharing is not None and not on_gpu:
            measured_n = [inputs.sharing.devices]
        here_rows = [
            this_machine(inputs, here, n, synchronized, on_gpu) | {"sync_batchnorm": synchronized}
            for n in measured_n
            for synchronized in (True, False)
        ]
    return {
        "profile": asdict(profile),
        "data_rates": {str(n): rate for n, rate in sorted(inputs.data_rates.items())},
        "one_device_throughput": min(profile.throughput, rate_1),
        "devices": list(options.predict_devices),
        "gpu_basis": inputs.gpu_basis() if on_gpu else None,
        "arrival_spread": {  # of GPU ranks at their collectives
            "used": _spread(GPU_SPREAD, inputs, batchnorm),
            "alternative": _spread(ALTERNATIVE, inputs, batchnorm),
        }
        if on_gpu
        else None,
        "interconnects": [
            {
                "name": link.name,
                "bus_bandwidth": link.bus_bandwidth,
                "latency": link.latency,
                "source": link.source,
            }
            for link in [*(INTERCONNECTS if on_gpu else ()), *([here] if here else [])]
        ],
        "rows": rows,
        "gpu_backend": asdict(backend) if on_gpu and backend is not None else None,
        "gloo": {"link": gloo.as_dict(), "rows": gloo_rows} if gloo_rows and gloo else None,
        "this_machine": here.name if here is not None else None,
        "this_machine_rows": here_rows,
    }


def _link_rows(
    inputs: ModelInputs,
    link: Link,
    devices: list[int],
    batchnorm: BatchNormSync | None,
) -> list[dict[str, Any]]:
    """``link``'s GPU row for each of ``devices``, with the other spread and batch norm off."""
    rows = []
    for n in devices:
        row = _gpu_prediction(inputs, link, n, batchnorm, GPU_SPREAD)
        other = _gpu_prediction(inputs, link, n, batchnorm, ALTERNATIVE)
        row["other_spread"] = {key: other[key] for key in _SUMMARY}
        if batchnorm is not None:
            off = _gpu_prediction(inputs, link, n, None, GPU_SPREAD)
            row["without_sync_batchnorm"] = {key: off[key] for key in _SUMMARY}
        rows.append(row)
    return rows


_SUMMARY = ("step_s", "sync_batchnorm_s", "speedup", "efficiency", "data_bound")
"""What a row keeps of a second prediction beside it (another spread, batch norm off)."""


def _gpu_prediction(
    inputs: ModelInputs,
    link: Link,
    n: int,
    sync_batchnorm: BatchNormSync | None,
    spread: ArrivalSpread,
) -> dict[str, Any]:
    profile = inputs.profile()
    prediction = predict(
        profile,
        inputs.gradients,
        n,
        link,
        spread.host(profile, sync_batchnorm, inputs.collectives()),
        sync_batchnorm,
        inputs.collectives(),
        data_rate_1=inputs.data_rates[1],
        data_rate_n=inputs.data_rates[n],
    )
    return prediction.as_dict()


def _spread(
    spread: ArrivalSpread, inputs: ModelInputs, sync_batchnorm: BatchNormSync | None
) -> dict[str, Any]:
    """The spread model and the seconds it gives this step's sync points."""
    profile, collectives = inputs.profile(), inputs.collectives()
    host = spread.host(profile, sync_batchnorm, collectives)
    return spread.as_dict() | {
        "collective_s": host.skew_s,
        "host_sync_s": host.host_sync_skew_s,
        "segment_s": segment_s(profile, sync_batchnorm, collectives),
    }


def this_machine(
    inputs: ModelInputs, link: Link, n: int, synchronized: bool, on_gpu: bool
) -> dict[str, Any]:
    """The prediction for ``n`` ranks of this machine, batch norm ``synchronized`` or not."""
    shared = inputs.sharing
    batchnorm = inputs.batchnorm(synchronized)
    host = GPU_SPREAD.host(inputs.profile(), batchnorm, inputs.collectives())
    extra = 0.0
    if shared is not None and not on_gpu:
        wait = expected_max_standard_normal(shared.devices)
        skew = max(0.0, shared.sync_point_s - link.latency) / wait
        host = Host(slowdown=shared.slowdown, overlap=False, skew_s=skew, host_sync_skew_s=skew)
        extra = shared.sync_batchnorm_compute_s / shared.slowdown
    prediction = predict(
        inputs.profile(),
        inputs.gradients,
        n,
        link,
        host,
        inputs.batchnorm(synchronized, extra),
        inputs.collectives(),
        data_rate_1=inputs.data_rates[1],
        data_rate_n=inputs.data_rates[n],
    )
    return prediction.as_dict()
