"""Performance options measured one at a time against the config as given.

Each option is flipped on its own (every other value stays the config's) and the bare
training step is timed again: ``trainer.precision`` (each of 32-true, bf16-mixed,
16-mixed that the config does not use; 16-mixed on GPUs only),
``training.channels_last``, ``training.compile`` and, on GPUs, ``trainer.benchmark``
(cuDNN autotuning). The verdict then names the option that measured fastest, with its
gain.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from segscale.bench.measure.compute import BareLoopResult, StepPlan, bare_loop
from segscale.errors import ConfigError
from segscale.models.module import SegmentationModule
from segscale.progress import Progress
from segscale.runs.builders import build_module

OPTIONS = ("precision", "channels_last", "compile", "cudnn_benchmark")
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")


def option_variants(cfg: DictConfig, names: list[str], on_gpu: bool) -> list[dict[str, Any]]:
    """The overrides to measure: one dict per variant, each changing one key of ``cfg``."""
    unknown = sorted(set(names) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"bench.options has {unknown}: expected names from {list(OPTIONS)}")
    variants: list[dict[str, Any]] = []
    if "precision" in names:
        current = str(cfg.trainer.precision)
        current = "32-true" if current == "32" else current
        # float16 on a CPU is emulated (40× slower here): a GPU option only
        offered = PRECISIONS if on_gpu else ("32-true", "bf16-mixed")
        variants += [{"trainer.precision": p} for p in offered if p != current]
    for name, key in (("channels_last", "training.channels_last"), ("compile", "training.compile")):
        if name in names:
            variants.append({key: not bool(cfg.training.get(name))})
    if "cudnn_benchmark" in names and on_gpu:  # no cuDNN on a CPU: nothing to tune
        variants.append({"trainer.benchmark": not bool(cfg.trainer.get("benchmark"))})
    return variants


def label(overrides: dict[str, Any]) -> str:
    """A variant as the command-line overrides that select it (``{}``: the config as given)."""
    if not overrides:
        return "as configured"
    return " ".join(f"{key}={str(value).lower()}" for key, value in overrides.items())


def measure_option(
    cfg: DictConfig,
    overrides: dict[str, Any],
    build: Callable[[DictConfig], SegmentationModule],
    batch: dict[str, torch.Tensor],
    device: torch.device,
    plan: StepPlan,
) -> BareLoopResult:
    """The bare step of ``cfg`` with ``overrides`` (built by ``build``) on ``batch``."""
    variant = copy.deepcopy(cfg)
    for key, value in overrides.items():
        OmegaConf.update(variant, key, value)
    previous = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = bool(variant.trainer.get("benchmark"))
    try:
        return bare_loop(build(variant), batch, str(variant.trainer.precision), device, plan)
    finally:
        torch.backends.cudnn.benchmark = previous


def measure_options(
    cfg: DictConfig,
    variants: list[dict[str, Any]],
    datamodule: Any,
    learning_rate: float,
    batch: dict[str, torch.Tensor],
    device: torch.device,
    options: DictConfig,
    progress: Progress,
) -> list[dict[str, Any]]:
    """The bare step of the config as given and of each variant (one option changed)."""
    if not variants:
        return []
    plan = StepPlan(options.warmup_steps, options.option_steps, 1)

    def build_variant(variant: DictConfig) -> Any:
        return build_module(variant, datamodule, learning_rate)

    rows: list[dict[str, Any]] = []
    for overrides in [{}, *variants]:
        row: dict[str, Any] = {"option": label(overrides), "overrides": overrides, "error": None}
        try:
            result = measure_option(cfg, overrides, build_variant, batch, device, plan)
        # torch raises RuntimeError (its compiler and autocast errors derive from it) for
        # an option this machine lacks: reported in the table, the other options go on.
        except RuntimeError as error:
            row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        else:
            row |= {
                "step_s": result.step.mean_s,
                "peak_memory_mb": result.peak_memory_mb,
                "warmup_s": result.warmup_s,
            }
        rows.append(row)
        if overrides:
            progress(f"option {row['option']}")
    base = rows[0].get("step_s")
    for row in rows:
        row["speedup"] = base / row["step_s"] if base and row.get("step_s") else None
    return rows
