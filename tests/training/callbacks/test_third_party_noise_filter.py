import pickle
import warnings

from lightning.pytorch.utilities._pytree import _tree_flatten

from segscale.training.callbacks.third_party_noise_filter import ThirdPartyNoiseFilter


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
