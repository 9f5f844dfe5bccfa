"""The seed's question: DeepLabV3+ Inception-ResNet-v2, 512², two V100s on Windows (gloo) or NCCL.

What is measured here, what is published and what is assumed, each named:

- the network (measured here, on the CPU): the preset
  ``experiment=deeplabv3plus_inceptionresnetv2-d16_b20-10e_512x512`` built with smp; its
  parameters, those its forward pass uses (what DDP all-reduces), its batch-norm layers
  and buffers; FLOPs per 512² patch, forward and backward (``segscale.bench.measure.flops``);
- one V100's step (computed): the FLOPs over the V100 PCIe's fp32 peak
  (``segscale.bench.measure.flops.PEAKS``) at the share of the peak a published step reached,
  counted with the same counter: the PyTorch DeepLabV3+ row of docs/bench.md's table
  (mmseg DeepLabV3+ R50-D8 at 512×1024, batch 4, fp32, 0.900 s on a V100-SXM2: smp's
  DeepLabV3+ R50 at output stride 8 stands for it) and, beside it, NVIDIA's ResNet-50
  (367 images/s in fp32 on a V100); the step split as the published rows' (forward :
  backward from the FLOPs, optimizer 3 %, jitter 2 %);
- gloo's host all-reduce (measured here): ``measure_allreduce`` between 2 CPU processes
  of this machine, all-reduces of 4 B to one DDP bucket, ``--repeats`` times;
- the GPU's copies to and from pinned host memory (published): CUDA's bandwidthTest
  on a Tesla V100 (32 MB, PCIe 3.0 x16), router-gao/cuda-demo
  ``cuda-samples/02-cuda-bandwidth.md``: 11.4 GB/s to the host, 9.6 GB/s back;
- NCCL on Linux or WSL2 (published): bench's ``PCIe 3.0 x16`` row (2 GPUs, no
  peer-to-peer: NCCL through host memory on its own path).

The step model (``segscale.bench.predict.step_model``) predicts 2 GPUs both ways. Writes what
it measured and counted into ``--out`` and prints README.md's tables; ``--table FILE``
prints them from a stored file without measuring (the predictions are the step
model's on those numbers, made again each time).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import segmentation_models_pytorch as smp
import timm
import torch
from torch import nn

from segscale.atomic_files import write_text_atomically
from segscale.bench.measure.ddp_runs import measure_allreduce
from segscale.bench.measure.flops import device_peak, training_flops
from segscale.bench.predict.arrival_spread import GPU_SPREAD
from segscale.bench.predict.host_staged_link import HostStagedLink, PinnedCopies
from segscale.bench.predict.interconnects import Interconnect, find_interconnect
from segscale.bench.predict.step_model import Prediction, predict
from segscale.bench.predict.step_profile import (
    DDP_BUCKET_BYTES,
    SYNC_BATCHNORM_COLLECTIVES,
    BatchNormSync,
    Collectives,
    Gradients,
    StepProfile,
)
from segscale.bench.verdict import GLOO_TERMS, TERMS, Findings, through_host
from segscale.configs import compose_config
from segscale.models.networks import build_network

PRESET = "experiment=deeplabv3plus_inceptionresnetv2-d16_b20-10e_512x512"
SIDE = 512
GLOBAL_BATCH = 20  # MATLAB's MiniBatchSize: the global batch, 10 per GPU on two
DEVICES = 2
V100 = "Tesla V100-PCIE-16GB"  # a Windows workstation's V100 16 GB: the PCIe card
V100_COPIES = PinnedCopies(
    11.4e9,
    9.6e9,
    "CUDA bandwidthTest on a Tesla V100, 32 MB pinned (router-gao/cuda-demo)",
)
NCCL_LINK = "PCIe 3.0 x16"
# the published rows' assumptions (tests/bench/predict/test_published_scaling.py)
OPTIMIZER_SHARE = 0.03
JITTER = 0.02
# Published V100 fp32 steps: (name, seconds per step, patches, its V100 as torch names it)
DEEPLAB_REFERENCE = ("mmseg DeepLabV3+ R50-D8, 512×1024", 0.900, 4, "Tesla V100-SXM2-32GB")
RESNET_REFERENCE = ("NVIDIA ResNet-50 v1.5, 224²", 112 / 367.0, 112, "Tesla V100-SXM2-16GB")


class Trainable(nn.Module):
    """A network with the ``loss_fn`` the FLOP counter calls (the loss itself is not counted)."""

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = network
        self.loss_fn = nn.CrossEntropyLoss(reduction="none")

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        """The network's output."""
        return self.network(image)


def flops_per_patch(network: nn.Module, height: int, width: int, classify: bool = False) -> dict:
    """Forward and backward FLOPs of one patch (``classify``: a label per image)."""
    mask = torch.zeros((2,) if classify else (2, height, width), dtype=torch.long)
    counted = training_flops(
        Trainable(network), {"image": torch.zeros(2, 3, height, width), "mask": mask}
    )
    return {"forward": counted.forward, "backward": counted.backward}


def seed_network() -> dict[str, Any]:
    """The preset's network: parameters (all, used), batch-norm layers, buffers, FLOPs."""
    model = compose_config("train", [PRESET]).model
    network = build_network(
        model.arch,
        model.encoder,
        6,
        3,
        model.output_stride,
        None,
        decoder_channels=model.decoder_channels,
    )
    network.train()
    network(torch.zeros(2, 3, 128, 128)).sum().backward()  # which parameters the network uses
    parameters = list(network.parameters())
    used = [p for p in parameters if p.grad is not None]
    norms = [
        m
        for m in network.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.weight.grad is not None
    ]
    return {
        "parameters": sum(p.numel() for p in parameters),
        "used_parameters": sum(p.numel() for p in used),
        # in the order a backward pass produces them, roughly: the last layers first
        "used_gradient_sizes": [4.0 * p.numel() for p in reversed(used)],
        "all_gradient_sizes": [4.0 * p.numel() for p in reversed(parameters)],
        "batchnorm_layers": len(norms),
        "batchnorm_channels": sum(int(m.num_features) for m in norms),
        "buffer_bytes": sum(b.numel() * b.element_size() for m in norms for b in m.buffers()),
        "flops": flops_per_patch(network, SIDE, SIDE),
    }


def references() -> dict[str, Any]:
    """The share of a V100's fp32 peak that each published step reached (bench's counter)."""
    deeplab = smp.DeepLabV3Plus(
        "resnet50", encoder_weights=None, encoder_output_stride=8, decoder_channels=512, classes=19
    )
    rows = []
    for (name, step_s, patches, device), flops in (
        (DEEPLAB_REFERENCE, flops_per_patch(deeplab, 512, 1024)),
        (RESNET_REFERENCE, flops_per_patch(timm.create_model("resnet50"), 224, 224, classify=True)),
    ):
        peak = device_peak(device)
        assert peak is not None
        total = flops["forward"] + flops["backward"]
        share = total * patches / step_s / peak.fp32
        rows.append(
            {
                "name": name,
                "step_s": step_s,
                "patches": patches,
                "flops": flops,
                "peak": peak.fp32,
                "utilisation": share,
            }
        )
    return {"deeplab": rows[0], "resnet": rows[1]}


def host_allreduce(nbytes: int, repeats: int) -> list[dict[str, Any]]:
    """The gloo all-reduce between 2 CPU processes of this machine, ``repeats`` times."""
    curves = []
    for _ in range(repeats):
        link = measure_allreduce(DEVICES, nbytes, cuda=False)
        curves.append({"points": [list(p) for p in link.points], "source": link.source})
    return curves


def median_curve(curves: list[dict[str, Any]]) -> Interconnect:
    """The repeats' curve of medians: at each measured size, the median of its times."""
    sizes = [x for x, _ in curves[0]["points"]]
    times = [
        statistics.median(curve["points"][i][1] for curve in curves) for i in range(len(sizes))
    ]
    source = f"{curves[0]['source']}, the median of {len(curves)} repeats"
    points = tuple(zip(sizes, times, strict=True))  # the medians of rising curves rise
    return Interconnect("gloo between host processes (measured)", points, source)


def profile(facts: dict[str, Any], utilisation: float, batch: int) -> StepProfile:
    """One V100 PCIe's step of ``batch`` patches at ``utilisation`` of its fp32 peak."""
    peak = device_peak(V100)
    assert peak is not None
    flops = facts["flops"]
    compute = batch * (flops["forward"] + flops["backward"]) / (peak.fp32 * utilisation)
    work = (1 - OPTIMIZER_SHARE) * compute
    forward = work * flops["forward"] / (flops["forward"] + flops["backward"])
    return StepProfile(forward, work - forward, OPTIMIZER_SHARE * compute, batch, JITTER)


def two_gpus(
    facts: dict[str, Any],
    step: StepProfile,
    link: Any,
    synchronized: bool,
    sizes: str = "used_gradient_sizes",
) -> Prediction:
    """The step model's prediction for 2 V100s over ``link``."""
    gradients = Gradients.uniform(facts[sizes])
    layers = facts["batchnorm_layers"]
    batchnorm = None
    if synchronized:
        forward, backward, host_syncs = SYNC_BATCHNORM_COLLECTIVES["segscale"]
        message = (2 * facts["batchnorm_channels"] / layers + 1) * 8
        batchnorm = BatchNormSync(layers, message, forward, backward, host_syncs)
    collectives = Collectives.ddp(facts["buffer_bytes"])
    host = GPU_SPREAD.host(step, batchnorm, collectives)
    return predict(step, gradients, DEVICES, link, host, batchnorm, collectives)


def links(results: dict[str, Any]) -> dict[str, Any]:
    """The two links: gloo through host memory (its host curve measured here), NCCL's row."""
    return {
        "gloo": HostStagedLink(median_curve(results["host_allreduce"]), V100_COPIES),
        "nccl": find_interconnect(NCCL_LINK),
    }


def scenarios(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each per-GPU batch, batch-norm setting and link: the step on 2 V100s against 1."""
    facts, both = results["network"], links(results)
    share = results["references"]["deeplab"]["utilisation"]
    one = profile(facts, share, GLOBAL_BATCH).step_s
    rows = []
    for batch in (GLOBAL_BATCH // DEVICES, GLOBAL_BATCH):
        for synchronized in (True, False):
            for name, link in both.items():
                p = two_gpus(facts, profile(facts, share, batch), link, synchronized)
                row = p.as_dict() | {
                    "batch": batch,
                    "sync_batchnorm": synchronized,
                    "backend": name,
                }
                row["one_gpu_s"] = one * batch * DEVICES / GLOBAL_BATCH  # the same global batch
                if name == "gloo":
                    row["gloo_parts"] = link.gradient_parts(
                        Gradients.uniform(facts["used_gradient_sizes"]), DEVICES
                    )
                rows.append(row)
    return rows


def sensitivity(results: dict[str, Any]) -> list[dict[str, Any]]:
    """10 per GPU under other assumptions: the step, the gradient bytes, the host all-reduce."""
    facts, both = results["network"], links(results)
    deeplab = results["references"]["deeplab"]["utilisation"]
    resnet = results["references"]["resnet"]["utilisation"]
    used, every = "used_gradient_sizes", "all_gradient_sizes"
    cases = [
        ("DeepLabV3+ reference", deeplab, used, 1.0),
        ("ResNet-50 reference", resnet, used, 1.0),
        ("half the DeepLabV3+ reference", deeplab / 2, used, 1.0),
        ("DeepLabV3+ reference, every parameter all-reduced", deeplab, every, 1.0),
        ("DeepLabV3+ reference, host all-reduce 4× slower", deeplab, used, 4.0),
    ]
    rows = []
    for case, share, sizes, slower in cases:
        step = profile(facts, share, GLOBAL_BATCH // DEVICES)
        host = both["gloo"].host
        points = tuple((x, t * slower) for x, t in host.points)
        gloo = replace(both["gloo"], host=replace(host, points=points))
        for synchronized in (True, False):
            gains = {
                name: two_gpus(facts, step, link, synchronized, sizes).speedup
                for name, link in (("gloo", gloo), ("nccl", both["nccl"]))
            }
            rows.append(
                {"case": case, "utilisation": share, "sync_batchnorm": synchronized, **gains}
            )
    return rows


def largest(row: dict[str, Any]) -> str:
    """The largest term beyond compute, named as the verdict names it, with its ms."""
    names = GLOO_TERMS if row["backend"] == "gloo" else TERMS
    key = max(names, key=lambda name: row[name])
    return f"{names[key]}: {1000 * row[key]:.0f} ms"


def verdict_sentences(results: dict[str, Any]) -> str:
    """What bench's verdict would say of 10 per GPU, synchronized batch norm on (the default)."""
    rows = [
        r
        for r in scenarios(results)
        if r["batch"] == GLOBAL_BATCH // DEVICES and r["sync_batchnorm"]
    ]
    gloo = next(r for r in rows if r["backend"] == "gloo")
    nccl = next(r for r in rows if r["backend"] == "nccl")
    off = next(
        r
        for r in scenarios(results)
        if r["batch"] == gloo["batch"] and not r["sync_batchnorm"] and r["backend"] == "gloo"
    )
    gloo["without_sync_batchnorm"] = off
    findings = Findings(
        batch=gloo["batch"],
        compute_rate=0.0,
        pipeline_rate=0.0,
        workers=0,
        best_workers=0,
        best_pipeline_rate=0.0,
        framework_ratio=1.0,
        steps_per_epoch=0,
        most_devices=DEVICES,
        predicted={NCCL_LINK: {DEVICES: nccl["efficiency"]}},
        gloo_reason="Windows has no NCCL",
        gloo_terms=gloo,
    )
    return " ".join(through_host(findings, gloo["efficiency"] < 0.75))


def header(*columns: str) -> list[str]:
    """A markdown table's first two lines."""
    return ["", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def network_rows(facts: dict[str, Any]) -> list[str]:
    """The network as built here."""
    flops = facts["flops"]
    return [
        *header(
            "network", "parameters", "used by the forward pass", "gradient all-reduced",
            "batch-norm layers", "GFLOP per 512² patch (forward + backward)",
        ),
        f"| DeepLabV3+ Inception-ResNet-v2 (d16) | {facts['parameters'] / 1e6:.2f} M | "
        f"{facts['used_parameters'] / 1e6:.2f} M | "
        f"{sum(facts['used_gradient_sizes']) / 2**20:.0f} MiB | {facts['batchnorm_layers']} | "
        f"{flops['forward'] / 1e9:.1f} + {flops['backward'] / 1e9:.1f} |",
    ]  # fmt: skip


def reference_rows(refs: dict[str, Any]) -> list[str]:
    """The published V100 steps and the share of the peak each reached."""
    lines = header(
        "published V100 fp32 step", "seconds", "patches", "GFLOP per patch (bench's counter)",
        "share of the V100's fp32 peak",
    )  # fmt: skip
    for ref in (refs["deeplab"], refs["resnet"]):
        total = ref["flops"]["forward"] + ref["flops"]["backward"]
        lines.append(
            f"| {ref['name']} | {ref['step_s']:.3f} | {ref['patches']} | {total / 1e9:.1f} | "
            f"{ref['utilisation']:.1%} |"
        )
    return lines


def host_rows(results: dict[str, Any]) -> list[str]:
    """Each repeat of gloo's host all-reduce, and their median, which the predictions use."""
    lines = header("gloo's host all-reduce, 2 processes", "latency", "bus bandwidth", "25 MiB")
    runs = [
        (f"repeat {i + 1}", Interconnect("run", tuple(map(tuple, c["points"])), c["source"]))
        for i, c in enumerate(results["host_allreduce"])
    ]
    for name, link in [*runs, ("median (used)", links(results)["gloo"].host)]:
        lines.append(
            f"| {name} | {1e3 * link.latency:.3f} ms | {link.bus_bandwidth / 1e9:.2f} GB/s "
            f"| {1e3 * link.allreduce_time(DDP_BUCKET_BYTES, DEVICES):.1f} ms |"
        )
    return lines


def scenario_rows(results: dict[str, Any]) -> list[str]:
    """2 V100s against 1, per batch, batch-norm setting and link."""
    lines = header(
        "per-GPU batch", "sync batch norm", "backend, link", "1 V100, same global batch",
        "2 V100s, step", "speed-up", "efficiency", "largest cost beyond compute",
        "gradients: to host / host all-reduce / back",
    )  # fmt: skip
    parts_keys = ("device_to_host_s", "host_allreduce_s", "host_to_device_s")
    for r in scenarios(results):
        link = "gloo, through host memory" if r["backend"] == "gloo" else f"NCCL, {NCCL_LINK}"
        parts = r.get("gloo_parts")
        split = " / ".join(f"{1000 * parts[k]:.0f}" for k in parts_keys) + " ms" if parts else "-"
        lines.append(
            f"| {r['batch']} | {'on' if r['sync_batchnorm'] else 'off'} | {link} | "
            f"{1000 * r['one_gpu_s']:.0f} ms | {1000 * r['step_s']:.0f} ms | "
            f"{r['speedup']:.2f}× | {r['efficiency']:.0%} | {largest(r)} | {split} |"
        )
    return lines


def sensitivity_rows(results: dict[str, Any]) -> list[str]:
    """The speed-ups at 10 per GPU under the other assumptions."""
    lines = header(
        "10 per GPU, case", "share of peak", "sync batch norm", "gloo speed-up",
        "NCCL speed-up",
    )  # fmt: skip
    for r in sensitivity(results):
        lines.append(
            f"| {r['case']} | {r['utilisation']:.1%} | {'on' if r['sync_batchnorm'] else 'off'} "
            f"| {r['gloo']:.2f}× | {r['nccl']:.2f}× |"
        )
    return lines


def table(results: dict[str, Any]) -> str:
    """README.md's tables and the verdict's sentences, from the stored measurements."""
    lines = [
        *network_rows(results["network"]),
        *reference_rows(results["references"]),
        *host_rows(results),
        *scenario_rows(results),
        *sensitivity_rows(results),
        "",
        "bench's verdict on these numbers (10 per GPU, synchronized batch norm on):",
        "",
        verdict_sentences(results),
    ]
    return "\n".join(lines)


def main() -> None:
    """Measure, print the tables, write every number."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="host all-reduce measurements (odd)")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results.json"))
    parser.add_argument("--table", type=Path, help="print the tables of a stored results file")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return
    facts = seed_network()
    bucket = int(min(sum(facts["used_gradient_sizes"]), DDP_BUCKET_BYTES))
    results: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
        },
        "network": facts,
        "references": references(),
        "host_allreduce": host_allreduce(bucket, args.repeats),
    }
    write_text_atomically(args.out, json.dumps(results, indent=2))
    print(table(results))


if __name__ == "__main__":
    main()
