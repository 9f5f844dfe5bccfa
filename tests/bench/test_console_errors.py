import pytest

from segscale.bench.console_errors import first_error

HINT = "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace."
INFO = "[2026-12-01 22:22:17,212][segscale.cli.train][INFO] - {}"
ERROR = "[2026-12-01 22:22:19,001][segscale.cli.train][ERROR] - {}"
WARNED = "/site/lightning/trainer.py:12: UserWarning: something\n  warnings.warn(message)"


@pytest.mark.parametrize(
    ("console", "expected"),
    [
        # Hydra cannot compose the config: its message, not its last line
        (
            "In 'datamodule/synthetic': Could not find 'datamodule/classes/mine'\n\n"
            "Available options in 'datamodule/classes':\n\tauto\n\tbinary\n"
            "Config search path:\n\tprovider=hydra, path=pkg://hydra.conf\n"
            f"\tprovider=schema, path=structured://\n\n{HINT}\n",
            "In 'datamodule/synthetic': Could not find 'datamodule/classes/mine'",
        ),
        # ... after import-time warnings
        (
            f"{WARNED}\nCould not override 'x'.\nKey 'x' is not in struct\n{HINT}\n",
            "Could not override 'x'.",
        ),
        # segscale's refusal, logged: the first ERROR record, not what follows it
        (
            "\n".join(
                [
                    INFO.format("run folder /runs/a"),
                    ERROR.format("datamodule.patch_size=999 is larger than the images"),
                    ERROR.format("rank 1 failed"),
                ]
            ),
            "datamodule.patch_size=999 is larger than the images",
        ),
        # a crash: the line that names the exception ends the first traceback
        (
            "\n".join(
                [
                    INFO.format("Traceback (most recent call last): quoted in a message"),
                    "Error executing job with overrides: ['a=1']",
                    "Traceback (most recent call last):",
                    '  File "/x/train.py", line 3, in run',
                    "    fit()",
                    "    ^^^^^",
                    "RuntimeError: DataLoader worker (pid 4711) is killed by signal",
                    "",
                    "During handling of the above exception, another exception occurred:",
                    "",
                    "Traceback (most recent call last):",
                    "ValueError: the second",
                    "",
                    HINT,
                ]
            ),
            "RuntimeError: DataLoader worker (pid 4711) is killed by signal",
        ),
        # refused before Hydra starts
        (
            "Error: strategy.sync_batchnorm moved: use training.sync_batchnorm\n",
            "strategy.sync_batchnorm moved: use training.sync_batchnorm",
        ),
        # log records, then Hydra's message (an error it reports without a traceback)
        (
            f"{INFO.format('building')}\n{INFO.format('Error: not this one')}\n"
            f"Error locating target 'x.Y'\n{HINT}\n",
            "Error locating target 'x.Y'",
        ),
    ],
)
def test_the_first_error_in_the_words_the_run_gave(console, expected):
    assert first_error(console) == expected


@pytest.mark.parametrize(
    "console",
    [
        "",
        f"{INFO.format('step 3')}\n{WARNED}\n",  # no error named: the caller says what it saw
        f"{INFO.format('Error: in an INFO record')}\n  Error: indented\n",
        f"{INFO.format('step 3')}\n\n{HINT}\n",  # Hydra's advice is no error
    ],
)
def test_output_that_names_no_error_gives_none(console):
    assert first_error(console) is None
