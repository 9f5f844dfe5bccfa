"""A non-finite loss stops the run (exit 3) with the last good checkpoint, or is skipped."""

import json
import math
import subprocess

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from segscale.cli.train import main
from segscale.configs import compose_config
from segscale.errors import ConfigError
from segscale.models.nonfinite import (
    NonFiniteError,
    any_nonfinite,
    describe,
    highest,
    highest_rate,
)
from segscale.models.nonfinite_steps import NonFiniteSteps
from segscale.training.run.training_run import train
from tests.conftest import tiny_overrides, train_command
from tests.helpers.in_process import run_in_process

# Tiny runs have 4 steps an epoch: step 5 is in the second epoch, after one validation.
NAN_AT_STEP_5 = [
    "+callbacks.poison._target_=tests.helpers.failing.NaNImagesAt",
    "+callbacks.poison.step=5",
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("devices", "per_epoch"),
    # A global batch of 4, or 8; under DDP the NaN comes on rank 1 alone: rank 0 learns of
    # it through the flag that travels with the loss normalisers, and stops itself.
    [([], 4), (["strategy=ddp", "trainer.devices=2", "+callbacks.poison.rank=1"], 2)],
    ids=["1", "ddp2"],
)
def test_a_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(
    tiny_data_root, tmp_path, devices, per_epoch
):
    run = tmp_path / "run"
    args = [
        *tiny_overrides(tiny_data_root, None),
        f"hydra.run.dir={run}",
        "training.output_network=last-iteration",  # the checkpoint before the bad step
        "+callbacks.poison._target_=tests.helpers.failing.NaNImagesAt",
        f"+callbacks.poison.step={per_epoch + 1}",  # the second step of the second epoch
        *devices,
    ]
    if devices:  # DDP: rank 1 runs the program of __main__, which must be train.py
        command = train_command(*args)
        result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    else:  # train.py's entry point in this process: no 9 s of imports
        result = run_in_process(main, *args, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 3, output[-3000:]
    assert "Traceback" not in output
    bad = per_epoch + 1
    assert f"the loss is not finite (NaN or inf) at step {bad} (epoch 1)" in output
    assert "Likely causes: a learning rate too high" in output
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and f"step {bad}" in summary["error"]
    assert summary["steps"] == bad
    assert "rank 1 failed" not in output
    output_checkpoint = summary["output_checkpoint"]
    assert output_checkpoint.endswith("last.ckpt")
    good = torch.load(output_checkpoint, weights_only=True)
    assert good["global_step"] == per_epoch  # saved at the validation before the NaN
    assert all(
        torch.isfinite(v).all() for v in good["state_dict"].values() if v.is_floating_point()
    )


def test_skip_leaves_the_weights_and_statistics_as_they_were(make_config, tmp_path):
    summary = train(make_config("training.on_nonfinite=skip", *NAN_AT_STEP_5))
    assert summary["status"] == "finished" and summary["skipped_steps"] == 1
    assert summary["steps"] == 8  # the skipped step still counts as a step taken
    assert summary["metrics"]["val/loss"] is not None
    last = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert all(
        torch.isfinite(v).all() for v in last["state_dict"].values() if v.is_floating_point()
    )


INF_GRADIENT_AT_STEP_5 = [
    "+callbacks.poison._target_=tests.helpers.failing.InfGradientAt",
    "+callbacks.poison.step=5",
]


@pytest.mark.parametrize("method", ["l2norm", "global-l2norm", "absolute-value"])
def test_an_infinite_gradient_is_found_before_clipping_hides_it(make_config, tmp_path, method):
    clipped = ["training.gradient_threshold=1.0", f"training.gradient_threshold_method={method}"]
    summary = train(make_config("training.on_nonfinite=skip", *clipped, *INF_GRADIENT_AT_STEP_5))
    assert summary["status"] == "finished" and summary["skipped_steps"] == 1
    last = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert all(
        torch.isfinite(v).all() for v in last["state_dict"].values() if v.is_floating_point()
    )


def test_an_infinite_gradient_stops_the_run_naming_its_step(tiny_data_root, tmp_path):
    run = tmp_path / "run"
    result = run_in_process(
        main,
        *tiny_overrides(tiny_data_root, None),
        f"hydra.run.dir={run}",
        "training.gradient_threshold=1.0",
        "training.output_network=last-iteration",  # the checkpoint before the bad step
        *INF_GRADIENT_AT_STEP_5,
        cwd=tmp_path,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 3, output[-3000:]
    assert "the gradient is not finite (NaN or inf) at step 5 (epoch 1)" in output
    summary = json.loads((run / "summary.json").read_text())
    # The verdict is read a step later, but only the steps before the bad one count, and
    # the last checkpoint is the one before it.
    assert summary["status"] == "failed" and summary["steps"] == 5
    good = torch.load(summary["output_checkpoint"], weights_only=True)
    assert good["global_step"] == 4


def gradients(bad: float | None = None, at: int = 0, dtype=torch.float32) -> list[torch.Tensor]:
    """Three gradients (one empty, one channels_last), ``bad`` put into one element."""
    tensors = [
        torch.randn(64, 3, 3, 3).contiguous(memory_format=torch.channels_last),
        torch.empty(0),
        torch.randn(100_003).to(dtype) * 1e30,  # large but finite: a norm would overflow
    ]
    if bad is not None and at == 0:
        tensors[0][5, 1, 2, 0] = bad
    elif bad is not None:
        tensors[2][77_777] = bad
    return tensors


@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("at", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_nonfinite_element_anywhere_is_found_and_large_finite_ones_are_not(bad, at, dtype):
    flag = any_nonfinite(gradients(bad, at, dtype))
    assert flag.dtype == torch.bool and flag.dim() == 0
    assert bool(flag) is (bad is not None)


def test_no_gradients_are_finite():
    assert not any_nonfinite([])
    assert not any_nonfinite([torch.empty(0)])


def test_policy_and_message():
    assert compose_config("train", ["training.on_nonfinite=skip"]).training.on_nonfinite == "skip"
    with pytest.raises(ConfigError, match=r"on_nonfinite='ignore' is not allowed: .*stop"):
        compose_config("train", ["training.on_nonfinite=ignore"])
    message = describe("gradient", 7, 2, 0.5, "16-mixed")
    assert message.startswith("the gradient is not finite (NaN or inf) at step 7 (epoch 2)")
    assert "float16 overflow under trainer.precision=16-mixed" in message
    assert "(up to 0.5 in the steps before: lower optimizer.lr" in message
    assert "the learning rate itself is not finite" in describe("loss", 7, 2, math.inf, "32")
    # No step has changed the weights: neither the rate nor exploding gradients did it.
    first = describe("loss", 0, 0, None, "32-true")
    assert first.startswith("the loss is not finite (NaN or inf) at step 0 (epoch 0), before any")
    assert "learning rate" not in first and "gradient_threshold" not in first
    assert "model.encoder_weights" in first and "NaN or infinite values in the images" in first


def test_the_highest_rate_of_every_group_and_a_non_finite_one_first():
    groups = [{"params": [torch.zeros(1, requires_grad=True)], "lr": lr} for lr in (0.1, 3.0)]
    assert highest_rate([torch.optim.SGD(groups)]) == 3.0
    assert highest_rate([]) is None
    assert math.isnan(highest([2.0, math.nan, 5.0])) and highest([2.0, math.inf]) == math.inf


class Diverging(NonFiniteSteps):
    """A linear layer trained at ``rates`` (one a step, 0 after the last), NaN from ``bad`` on.

    ``bad="validation"``: training stays finite and the validation loss is NaN.
    """

    def __init__(self, rates: tuple[float, ...], bad: int | str, on_nonfinite="stop") -> None:
        super().__init__(on_nonfinite)
        self.network = nn.Linear(2, 1)
        self.rates, self.bad = rates, bad

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self.network(batch).pow(2).mean()
        if self.bad == self.trainer.global_step:
            loss = loss * math.nan
        self._nonfinite = ~torch.isfinite(loss)
        return loss

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self.guard_step(list(self.network.parameters()), optimizer)

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        if self.bad == "validation":
            raise NonFiniteError(self._describe_nonfinite("validation loss"))

    def configure_optimizers(self) -> dict:
        optimizer = torch.optim.SGD(self.parameters(), lr=1.0)
        factors = [*self.rates, 0.0]  # a poly schedule's last factor: 0 for no step
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: factors[step])
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def diverge(module: Diverging, caplog=None) -> str:
    """Train ``module`` for one epoch, a step a rate; the NonFiniteError's message, or ``""``."""
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=1,
    )
    data = DataLoader([torch.ones(4, 2)] * len(module.rates), batch_size=None)
    try:
        trainer.fit(module, data, DataLoader([torch.ones(4, 2)], batch_size=None))
    except NonFiniteError as error:
        return str(error)
    return ""


@pytest.mark.parametrize(
    ("rates", "bad", "expected"),
    [
        # The verdict of step 1 is read at step 2: the rate named is step 0's, the rate
        # that made the weights step 1 started from, not step 2's (nor step 1's own).
        (
            (2.0, 1e6, 3.0),
            1,
            "at step 1 (epoch 0). Likely causes: a learning rate too high "
            "for this model and batch (up to 2 in the steps before",
        ),
        # The last step's verdict is read when training ends, where the schedule left
        # the rate of a step that never comes: 0.
        (
            (1e6, 1e3, 1.0),
            2,
            "at step 2 (epoch 0). Likely causes: a learning rate too high "
            "for this model and batch (up to 1e+06 in the steps before",
        ),
        (
            (1e6, 1e3, 1.0),
            "validation",
            "the validation loss is not finite (NaN or inf) at "
            "step 3 (epoch 0). Likely causes: a learning rate too high for this model and "
            "batch (up to 1e+06 in the steps before",
        ),
        (
            (1e6, 1e3, 1.0),
            0,
            "at step 0 (epoch 0), before any optimizer step changed the "
            "weights. Likely causes: the weights the run started from",
        ),
    ],
    ids=["step-1", "last-step", "validation", "first-step"],
)
def test_the_message_names_the_rate_of_the_steps_before_the_bad_one(rates, bad, expected):
    assert expected in diverge(Diverging(rates, bad))


def test_a_skipped_step_names_the_rate_of_the_steps_before_it(caplog):
    with caplog.at_level("WARNING"):
        assert diverge(Diverging((2.0, 1e6, 3.0), 1, on_nonfinite="skip")) == ""
    assert "at step 1 (epoch 0)" in caplog.text and "(up to 2 in the steps before" in caplog.text


@pytest.mark.slow
def test_a_non_finite_last_step_with_no_validation_after_it_reports_no_predictions(
    tiny_data_root, tmp_path
):
    # One epoch of 4 steps, validated after 3 batches only (an integer interval): no
    # validation or checkpoint reads the last step's verdict before the callbacks'
    # on_train_end, where the report predicts its sample tiles with the final weights.
    run = tmp_path / "run"
    args = [
        *tiny_overrides(tiny_data_root, None),
        f"hydra.run.dir={run}",
        "trainer.max_epochs=1",
        "trainer.val_check_interval=3",
        "+callbacks.poison._target_=tests.helpers.failing.NaNImagesAt",
        "+callbacks.poison.step=3",
    ]
    result = run_in_process(main, *args, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 3, output[-3000:]
    assert "the loss is not finite (NaN or inf) at step 3 " in output
    assert not (run / "evaluation" / "sample_predictions.png").exists()
    assert "sample predictions" not in (run / "train.log").read_text().lower()
