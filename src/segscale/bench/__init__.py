"""``bench.py``: will more devices make this training faster, and by how much.

``segscale.bench.measure`` times the config on this machine; ``segscale.bench.predict``
is the step model those numbers feed (``predicted_scaling`` feeds it); the driver
(``benchmark``: the command, its ``bench`` section's checks), its time plan
(``duration``), the verdict (``verdict``) and what it leaves behind (``report``) read
both.
"""

from segscale.bench.benchmark import bench, check_bench, device_counts, finish

__all__ = ["bench", "check_bench", "device_counts", "finish"]
