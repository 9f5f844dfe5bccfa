"""The step model fed with what bench measured: predictions per interconnect and here."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from omegaconf import DictConfig

from segscale.bench.compute import (
    BareLoopResult,
)
from segscale.bench.interconnects import INTERCONNECTS, Interconnect
from segscale.bench.prediction import (
    GPU_COLLECTIVE_SKEW_S,
    GPU_HOST_SYNC_SKEW_S,
    SYNC_BATCHNORM_COLLECTIVES,
    BatchNormSync,
    Collectives,
    Gradients,
    Host,
    StepProfile,
    expected_max_standard_normal,
    predict,
)
from segscale.bench.sharing import Sharing
from segscale.bench.timing import Timing


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
    here: Interconnect | None,
    counts: list[int],
    on_gpu: bool,
) -> dict[str, Any]:
    """Predicted speed-up on ``bench.predict_devices`` over each interconnect (and this one).

    GPU interconnects: each rank its own device, ranks meeting with the published spreads
    (``GPU_COLLECTIVE_SKEW_S``, ``GPU_HOST_SYNC_SKEW_S``), synchronized batch norm as the
    ddp runs have it. This machine: its measured all-reduce curve, and on CPUs what the
    ranks measured side by side (slowdown, sync-point cost, batch norm's arithmetic),
    with synchronized batch norm on and off, to set beside the measured ddp runs.
    """
    profile = inputs.profile()
    rate_1 = inputs.data_rates[1]
    gpu_host = Host(skew_s=GPU_COLLECTIVE_SKEW_S, host_sync_skew_s=GPU_HOST_SYNC_SKEW_S)
    rows = []
    for link in INTERCONNECTS:
        for n in options.predict_devices:
            prediction = predict(
                profile,
                inputs.gradients,
                n,
                link,
                gpu_host,
                inputs.batchnorm(inputs.sync_batchnorm),
                inputs.collectives(),
                data_rate_1=rate_1,
                data_rate_n=inputs.data_rates[n],
            )
            rows.append(prediction.as_dict())
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
        "gpu_skew_s": {"collective": GPU_COLLECTIVE_SKEW_S, "host_sync": GPU_HOST_SYNC_SKEW_S},
        "interconnects": [
            {
                "name": link.name,
                "bus_bandwidth": link.bus_bandwidth,
                "latency": link.latency,
                "source": link.source,
            }
            for link in [*INTERCONNECTS, *([here] if here else [])]
        ],
        "rows": rows,
        "this_machine": here.name if here is not None else None,
        "this_machine_rows": here_rows,
    }


def this_machine(
    inputs: ModelInputs, link: Interconnect, n: int, synchronized: bool, on_gpu: bool
) -> dict[str, Any]:
    """The prediction for ``n`` ranks of this machine, batch norm ``synchronized`` or not."""
    shared = inputs.sharing
    host, extra = Host(skew_s=GPU_COLLECTIVE_SKEW_S, host_sync_skew_s=GPU_HOST_SYNC_SKEW_S), 0.0
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
