import yaml
from omegaconf import OmegaConf

from segscale.training.run_folder.launch_record import (
    has_launch_record,
    launch_record,
    write_launch_record,
)


def test_each_launch_gets_its_own_record(tmp_path):
    assert not has_launch_record(tmp_path)
    for launch in (1, 2, 3):
        record = write_launch_record(tmp_path, launch_record(OmegaConf.create({"launch": launch})))
        assert record == tmp_path / ".hydra" / ("" if launch == 1 else f"launch-{launch}")
        assert has_launch_record(tmp_path)
    assert yaml.safe_load((tmp_path / ".hydra" / "config.yaml").read_text()) == {"launch": 1}
    launch3 = tmp_path / ".hydra" / "launch-3" / "config.yaml"
    assert yaml.safe_load(launch3.read_text()) == {"launch": 3}
