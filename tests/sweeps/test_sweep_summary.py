import json

from segscale.cli.summarize import main
from segscale.sweeps.sweep_summary import write_sweep_summary

HEADER = "epoch,step,val/loss,val/mIoU,train/loss\n"


def make_job(sweep, number, overrides, curve=None, summary=None):
    folder = sweep / str(number)
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if curve:
        rows = "".join(f"{e},{e},{loss},{miou},\n{e},{e},,,0.5\n" for e, loss, miou in curve)
        (folder / "metrics.csv").write_text(HEADER + rows)
    if summary:
        (folder / "summary.json").write_text(json.dumps(summary))


def test_one_row_per_job_with_status_best_epoch_and_what_differs(tmp_path):
    make_job(
        tmp_path,
        0,
        ["trainer.max_epochs=3", "optimizer.lr=0.01"],
        curve=[(0, 1.0, 0.2), (1, 0.8, 0.5), (2, 0.7, 0.4)],
        summary={"metrics": {"val/mIoU": 0.4}, "epochs": 3, "wall_time_s": 9.5},
    )
    make_job(tmp_path, 1, ["trainer.max_epochs=3", "optimizer.lr=0.03"])  # failed early
    rows = write_sweep_summary(tmp_path)
    assert [(r["job"], r["status"], r["overrides"]) for r in rows] == [
        (0, "completed", "optimizer.lr=0.01"),
        (1, "failed", "optimizer.lr=0.03"),
    ]
    assert rows[0]["best_epoch"] == 1 and rows[0]["best_val/mIoU"] == 0.5
    assert rows[0]["val/mIoU"] == 0.4 and rows[0]["wall_time_s"] == 9.5
    markdown = (tmp_path / "sweep_summary.md").read_text()
    assert "`trainer.max_epochs=3`" in markdown and "| 1 | optimizer.lr=0.03 | failed |" in markdown
    assert (tmp_path / "sweep_summary.csv").read_text().count("\n") == 3
    assert (tmp_path / "sweep_curves.png").stat().st_size > 1000


def test_summarize_command_prints_the_table_and_refuses_a_missing_folder(tmp_path, capsys):
    make_job(tmp_path, 0, ["optimizer.lr=0.01"], summary={"metrics": {"val/mIoU": 0.3}})
    assert main([str(tmp_path)]) == 0
    assert "| 0 | optimizer.lr=0.01 | completed | 0.3 |" in capsys.readouterr().out
    assert main([str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_stopped_job_shows_how_it_ended_without_the_searchs_bookkeeping(tmp_path):
    trial = ["search_trial.storage='sqlite:///x.db'", "search_trial.number=0"]
    make_job(tmp_path, 0, ["optimizer.lr=1e-07", *trial], summary={"status": "pruned"})
    preempted = {"status": "preempted", "stop": {"signal": "SIGTERM", "step": 5}}
    make_job(
        tmp_path, 1, ["optimizer.lr=1e-06", *trial[:1], "search_trial.number=1"], summary=preempted
    )
    make_job(tmp_path, 2, ["optimizer.lr=0.01"], summary={"status": "failed", "error": "boom"})
    rows = write_sweep_summary(tmp_path)
    assert [(r["status"], r["overrides"]) for r in rows] == [
        ("pruned", "optimizer.lr=1e-07"),
        ("preempted", "optimizer.lr=1e-06"),
        ("failed", "optimizer.lr=0.01"),
    ]
