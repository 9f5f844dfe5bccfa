"""The step model: data-parallel step time, speed-up and efficiency, from one device's step.

Arithmetic only, on numbers ``segscale.bench.measure`` measured or the sources named
beside them published: the step it starts from and what the ranks share
(``step_profile``), the links' all-reduce time against message size (``interconnects``,
from nccl-tests; gloo through host memory for GPU ranks on Windows,
``host_staged_link``), when a sync point and the backward pass's collectives end
(``collective_timing``), how far apart GPU ranks arrive (``arrival_spread``, the one
fitted assumption), and their sum (``step_model``).
"""

from segscale.bench.predict.arrival_spread import (
    ALTERNATIVE,
    CONSTANT,
    GPU_SPREAD,
    PER_SEGMENT,
    ArrivalSpread,
)
from segscale.bench.predict.collective_timing import (
    backward_pass,
    expected_max_standard_normal,
    sync_point,
)
from segscale.bench.predict.host_staged_link import (
    GpuBackend,
    HostStagedLink,
    PinnedCopies,
    gpu_backend,
    measure_copies,
)
from segscale.bench.predict.interconnects import (
    INTERCONNECTS,
    Interconnect,
    Link,
    Published,
    find_interconnect,
    from_published,
)
from segscale.bench.predict.step_model import Prediction, efficiency, from_terms, predict, speedup
from segscale.bench.predict.step_profile import (
    SYNC_BATCHNORM_COLLECTIVES,
    BatchNormSync,
    Collectives,
    Gradients,
    Host,
    StepProfile,
)

__all__ = [
    "ALTERNATIVE",
    "CONSTANT",
    "GPU_SPREAD",
    "INTERCONNECTS",
    "PER_SEGMENT",
    "SYNC_BATCHNORM_COLLECTIVES",
    "ArrivalSpread",
    "BatchNormSync",
    "Collectives",
    "GpuBackend",
    "Gradients",
    "Host",
    "HostStagedLink",
    "Interconnect",
    "Link",
    "PinnedCopies",
    "Prediction",
    "Published",
    "StepProfile",
    "backward_pass",
    "efficiency",
    "expected_max_standard_normal",
    "find_interconnect",
    "from_published",
    "from_terms",
    "gpu_backend",
    "measure_copies",
    "predict",
    "speedup",
    "sync_point",
]
