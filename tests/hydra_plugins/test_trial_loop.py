import json

from hydra.core.utils import JobReturn

from hydra_plugins.segscale_plugins.trial_loop import was_pruned
from segscale.training.callbacks.trial_pruning import TrialPruned


def test_a_pruned_job_is_known_by_its_exception_or_its_summary(tmp_path):
    def job(value, summary=None):
        (tmp_path / "0").mkdir(exist_ok=True)
        if summary:
            (tmp_path / "0" / "summary.json").write_text(json.dumps(summary))
        result = JobReturn()
        result.return_value = value
        return result

    assert was_pruned(job(TrialPruned("pruned after epoch 0")), tmp_path / "0")
    assert not was_pruned(job(RuntimeError("exit code 1")), tmp_path / "0")
    assert was_pruned(job(0.3, {"status": "pruned"}), tmp_path / "0")
    assert not was_pruned(job(0.3, {"status": "failed", "error": "boom"}), tmp_path / "0")
    assert not was_pruned(job(0.3, {"status": "finished"}), tmp_path / "0")
