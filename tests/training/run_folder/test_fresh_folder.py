import pytest

from segscale.errors import ConfigError
from segscale.training.run_folder.fresh_folder import check_fresh_folder


def test_a_fresh_run_is_refused_a_folder_with_results(tmp_path):
    check_fresh_folder(tmp_path)
    (tmp_path / "train.log").write_text("a run that failed its checks\n")
    check_fresh_folder(tmp_path)  # nothing trained there
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"already holds a run \(checkpoints/\); continue it"):
        check_fresh_folder(tmp_path)
