"""What ``bench`` measures on this machine: the data pipeline, the step, its parts, real runs.

Each module times one thing with the user's config, and returns the numbers the step
model (``segscale.bench.predict``) and the verdict read: the DataLoader's patches/s
(``pipeline``) and the tiles as stored against in memory (``storage``); one device's
step in a bare loop and in Lightning (``compute``, clocked by ``timing``), the
framework's fixed cost per step (``overhead``), the performance options one at a time
(``performance_options``); DDP's gradient buckets (``gradients``) and FLOPs against the
device's peak (``flops``); N CPU ranks side by side (``sharing``); and real ``train.py``
runs with ``strategy=ddp`` on N devices with the all-reduce between them (``ddp_runs``).
"""

from segscale.bench.measure.compute import (
    BareLoopResult,
    Comparison,
    StepPlan,
    bare_loop,
    framework_comparison,
)
from segscale.bench.measure.ddp_runs import (
    ScalingPoint,
    first_error,
    measure_allreduce,
    measure_scaling,
)
from segscale.bench.measure.flops import (
    PEAKS,
    DevicePeak,
    StepFlops,
    Utilisation,
    device_peak,
    measure_utilisation,
    peak_flops,
    training_flops,
)
from segscale.bench.measure.gradients import ddp_buckets, measure_gradients
from segscale.bench.measure.overhead import Overhead, measure_overhead, step_terms
from segscale.bench.measure.performance_options import measure_options, option_variants
from segscale.bench.measure.pipeline import (
    PipelineRates,
    calls_per_second,
    loader_rate,
    measure_pipeline,
)
from segscale.bench.measure.sharing import Sharing, SideBySide, side_by_side
from segscale.bench.measure.storage import StorageRates, decoded_copy, measure_storage
from segscale.bench.measure.timing import StepTimer, Timing, summarize_steps

__all__ = [
    "PEAKS",
    "BareLoopResult",
    "Comparison",
    "DevicePeak",
    "Overhead",
    "PipelineRates",
    "ScalingPoint",
    "Sharing",
    "SideBySide",
    "StepFlops",
    "StepPlan",
    "StepTimer",
    "StorageRates",
    "Timing",
    "Utilisation",
    "bare_loop",
    "calls_per_second",
    "ddp_buckets",
    "decoded_copy",
    "device_peak",
    "first_error",
    "framework_comparison",
    "loader_rate",
    "measure_allreduce",
    "measure_gradients",
    "measure_options",
    "measure_overhead",
    "measure_pipeline",
    "measure_scaling",
    "measure_storage",
    "measure_utilisation",
    "option_variants",
    "peak_flops",
    "side_by_side",
    "step_terms",
    "summarize_steps",
    "training_flops",
]
