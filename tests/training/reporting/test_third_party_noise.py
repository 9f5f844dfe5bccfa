import logging
import pickle
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from lightning.pytorch.utilities._pytree import _tree_flatten

from segscale.training.reporting.third_party_noise import (
    ThirdPartyNoiseFilter,
    third_party_noise_filtered,
)
from tests.training.callbacks.scheduled_fit import scheduled_fit


@contextmanager
def lightning_output() -> Iterator[list[str]]:
    """What Lightning logs and warns within the block: one line each, as it prints them."""
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("lightning.pytorch")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield lines
    finally:
        logger.removeHandler(handler)
    lines += [str(w.message) for w in caught]


def is_noise(line: str) -> bool:
    return line.startswith("💡 Tip:") or "LeafSpec" in line


def test_a_fit_shows_lightnings_lines_but_no_tip_and_no_leafspec_warning(tmp_path):
    with lightning_output() as unfiltered:
        scheduled_fit(tmp_path / "unfiltered")
    # The capture sees both (Lightning 2.6 with PyTorch >= 2.10), so it can see them go.
    assert any(line.startswith("💡 Tip:") for line in unfiltered)
    assert any("LeafSpec" in line for line in unfiltered)

    with lightning_output() as filtered, third_party_noise_filtered():
        scheduled_fit(tmp_path / "filtered")
    assert [line for line in filtered if is_noise(line)] == []
    assert any(line.startswith("GPU available") for line in filtered)  # the useful ones stay


def test_only_the_known_warning_is_filtered_and_only_within_the_block():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with third_party_noise_filtered():
            _tree_flatten(1)  # Lightning's call that PyTorch deprecates: filtered
            # The same message from anywhere else, and any other FutureWarning, still show.
            warnings.warn(
                "`isinstance(treespec, LeafSpec)` is deprecated", FutureWarning, stacklevel=1
            )
            warnings.warn("something else", FutureWarning, stacklevel=1)
        _tree_flatten(1)
    assert [(w.filename.endswith("_pytree.py"), str(w.message)[:30]) for w in caught] == [
        (False, "`isinstance(treespec, LeafSpec"),
        (False, "something else"),
        (True, "`isinstance(treespec, LeafSpec"),
    ]
    assert logging.getLogger("lightning.pytorch.utilities.rank_zero").filters == []


def test_the_callback_filters_in_each_process_from_setup_to_teardown():
    callback = ThirdPartyNoiseFilter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        callback.setup(None, None, "fit")  # type: ignore[arg-type]
        # What ddp_spawn sends to a rank: the callback without this process's filters.
        assert pickle.loads(pickle.dumps(callback))._filters is None
        _tree_flatten(1)
        callback.teardown(None, None, "fit")  # type: ignore[arg-type]
        _tree_flatten(1)
    assert len(caught) == 1
