"""The data layer's public names: offered by ``segscale.data`` and by their package."""

import importlib
import subprocess
import sys

import pytest

PACKAGES = [
    "segscale.data",
    "segscale.data.storage",
    "segscale.data.datasets",
    "segscale.data.classes",
    "segscale.data.sampling",
    "segscale.data.checks",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_every_exported_name_is_its_module_s_object(name):
    package = importlib.import_module(name)
    assert package.__all__ == sorted(package.__all__)
    for exported in package.__all__:
        value = getattr(package, exported)
        assert value.__name__ == exported
        assert value.__module__.startswith(f"{name}.")
        assert getattr(sys.modules[value.__module__], exported) is value
        assert exported in dir(package)
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        package.NoSuchName  # noqa: B018


def test_each_package_offers_its_names_at_the_top():
    data = importlib.import_module("segscale.data")
    below = [n for p in PACKAGES[1:] for n in importlib.import_module(p).__all__]
    assert set(below) <= set(data.__all__)
    assert data.PatchSampling is importlib.import_module("segscale.data.sampling").PatchSampling


def test_importing_the_layer_imports_none_of_its_modules():
    code = (
        "import sys, segscale.data, segscale.data.sampling; "
        "print(sorted(m for m in sys.modules if m.startswith('segscale.data')), "
        "'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["['segscale.data',", "'segscale.data.sampling']", "False"]
