"""The error that lists every unusable file of a dataset, and its message.

Problems of single files come one per line (many of one kind summarised), then the mask
values that no class claims in one table (value, pixels, files, a few file names;
``MaskValueCensus``), with what to do about them.
"""

from __future__ import annotations

from segscale.data.classes.labels import LabelMap
from segscale.data.classes.mask_values import MaskValueCensus
from segscale.data.storage.sources import FileProblem
from segscale.errors import ConfigError

MAX_LINES_PER_KIND = 5
"""Problems of one kind listed one per line; more are summarised (see ``problem_message``)."""


EXAMPLES_PER_KIND = 3
"""Problems shown of a summarised kind."""


class InvalidDatasetError(ConfigError):
    """The dataset has files that cannot be used; the message lists every one."""


def problem_message(
    problems: list[FileProblem],
    unknown: MaskValueCensus | None = None,
    labels: LabelMap | None = None,
    checkpoint: str | None = None,
) -> str:
    """Every problem: those of single files one per line, then unknown mask values.

    More than ``MAX_LINES_PER_KIND`` problems of one ``kind`` (images without a mask,
    ...) are one line with their count, then the first ``EXAMPLES_PER_KIND``.
    ``checkpoint``: the checkpoint whose classes the masks are read with (evaluate.py),
    whose way with unknown values is not training's.
    """
    files = len(unknown.all_files) if unknown else 0
    lines = [f"{len(problems) + files} problem(s) in the dataset (datamodule.source):"]
    lines += _problem_lines(problems)
    if unknown and labels is not None:
        if checkpoint is None:
            lines += _unknown_values(unknown, labels, files)
        else:
            lines += _unknown_to_checkpoint(unknown, labels, files, checkpoint)
    return "\n".join(lines)


def _problem_lines(problems: list[FileProblem]) -> list[str]:
    """One line per problem; a kind with many problems summarised where it first occurs."""
    of_kind: dict[str, list[FileProblem]] = {}
    for problem in problems:
        of_kind.setdefault(problem.kind, []).append(problem)
    lines: list[str] = []
    for problem in problems:
        same = of_kind[problem.kind]
        if not problem.kind or len(same) <= MAX_LINES_PER_KIND:
            lines.append(f"  {problem.path}: {problem.reason}")
        elif problem is same[0]:
            lines.append(f"  {len(same)} {problem.kind}, for example:")
            lines += [f"    {p.path}: {p.reason}" for p in same[:EXAMPLES_PER_KIND]]
            lines.append(f"    ... and {len(same) - EXAMPLES_PER_KIND} more")
    return lines


def _unknown_values(unknown: MaskValueCensus, labels: LabelMap, files: int) -> list[str]:
    """The table of mask values that no class claims, and what to do about them."""
    option = _classes_option()
    named = f"datamodule/classes={option}" if option else "datamodule/classes"
    ignore = f"datamodule.ignore_ids={unknown.override_list()}"
    what = "a value" if len(unknown) == 1 else f"{len(unknown)} values"
    lines = [
        f"  {files} mask(s) hold {what} that {named} does not know "
        f"(it knows {labels.describe_known()}):",
        unknown.table(indent=4),
        *unknown.palette_lines(indent=4),
    ]
    if option == "auto":
        lines.append(
            "  What to do: datamodule/classes=auto took the classes from the training masks, "
            "and no training mask holds these values: add training masks that do, or set "
            f"{ignore} to ignore them."
        )
    else:
        lines.append(
            "  What to do: datamodule/classes=auto takes the classes from the training "
            "masks; or write a classes file of your own (docs/own-data.md); or "
            f"set {ignore} to ignore these values."
        )
    return lines


def _unknown_to_checkpoint(
    unknown: MaskValueCensus, labels: LabelMap, files: int, checkpoint: str
) -> list[str]:
    """The table of mask values that no class of ``checkpoint`` has, and the way forward."""
    what = "a value" if len(unknown) == 1 else f"{len(unknown)} values"
    return [
        f"  {files} mask(s) hold {what} that no class of ckpt={checkpoint!r} has (it knows "
        f"{labels.describe_known()}):",
        unknown.table(indent=4),
        *unknown.palette_lines(indent=4),
        "  What to do: evaluate.py scores the checkpoint's classes, which these masks cannot "
        f"change; set datamodule.ignore_ids={unknown.override_list()} to leave these pixels "
        "out of the scores (added to the values the checkpoint ignores).",
    ]


def _classes_option() -> str | None:
    """The ``datamodule/classes`` option of the running Hydra job, if any (for messages)."""
    # Imported here: the data layer needs Hydra only to name the option in a message.
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    choice = HydraConfig.get().runtime.choices.get("datamodule/classes")
    return str(choice) if choice else None
