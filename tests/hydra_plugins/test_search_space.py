"""A sweep's values reach its jobs as they were swept: Windows paths included."""

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

from hydra_plugins.segscale_plugins.search_space import parameter_overrides

PATHS = [r"C:\Users\me\data", "D:\\tiles\\", r"\\server\share\x", "/data/it's a, b=$c"]


def read_back(overrides: list[str]) -> list[object]:
    """The values Hydra reads from ``key=value`` overrides, in order."""
    return [o.value() for o in OverridesParser.create().parse_overrides(overrides)]


def test_a_trials_sampled_strings_reach_its_job_unchanged():
    for path in PATHS:
        assert read_back(parameter_overrides({"datamodule.source.root": path})) == [path]


def test_a_grids_values_reach_its_jobs_unchanged():
    # As a user quotes them on the command line; Hydra's basic sweeper writes each job's.
    swept = "datamodule.source.root=" + ",".join(
        [r"'C:\Users\me\data'", r"'D:\tiles\\'", r"'\\server\share\x'", '"/data/it\'s a, b=$c"']
    )
    (batch,) = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides([swept]), None)
    assert [read_back(job) for job in batch] == [[path] for path in PATHS]
