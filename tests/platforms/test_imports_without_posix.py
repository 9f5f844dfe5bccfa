"""Every module of segscale imports where ``fcntl``, ``resource`` and POSIX's signals are not.

A fresh interpreter takes them away from segscale's own modules, as Windows has them
not: ``import fcntl`` (or ``resource``, ``termios``, ``pwd``, ``grp``) from a segscale
module fails as it does there, and ``signal.SIGUSR1`` (and every other signal Windows
lacks) read by a segscale module is an ``AttributeError``. Libraries keep them (they
choose for themselves what to import where). Then every module of ``segscale`` and of
its Hydra plugins is imported, the commands' modules (``segscale.cli``) among them, and
the shims at the repository's root (``train.py`` ...).
"""

import subprocess
import sys
import textwrap

import pytest

from segscale.platforms.signals import WINDOWS_SIGNALS
from tests.conftest import REPO

POSIX_ONLY_MODULES = ("fcntl", "resource", "termios", "pwd", "grp")

IMPORT_ALL = textwrap.dedent(
    """
    import builtins, importlib, importlib.util, pkgutil, signal, sys, types

    BLOCKED, KEPT, REPO = set(sys.argv[1].split(",")), set(sys.argv[2].split(",")), sys.argv[3]

    def ours(name):
        # Whether the module called name is segscale's (its plugins, a shim).
        ours = ("segscale", "hydra_plugins.segscale_plugins", "shim")
        return name in ours or (name or "").startswith(tuple(f"{o}." for o in ours))

    real_import = builtins.__import__

    def windows_import(name, globals=None, locals=None, fromlist=(), level=0):
        importer = (globals or {}).get("__name__")
        if level == 0 and name.split(".")[0] in BLOCKED and ours(importer):
            raise ModuleNotFoundError(f"No module named {name!r} (as on Windows)", name=name)
        return real_import(name, globals, locals, fromlist, level)

    builtins.__import__ = windows_import

    # signal as Windows has it, for segscale's modules; the real one for everyone else.
    posix_only = {
        name for name in dir(signal)
        if name.startswith("SIG") and not name.startswith("SIG_") and name not in KEPT
    }
    windows_signal = types.ModuleType("signal", signal.__doc__)
    windows_signal.__dict__.update(
        {k: v for k, v in vars(signal).items() if k not in posix_only}
    )

    def missing_on_windows(name):
        caller = sys._getframe(1).f_globals.get("__name__")
        if name in posix_only and not ours(caller):
            return getattr(signal, name)
        raise AttributeError(f"module 'signal' has no attribute {name!r} (as on Windows)")

    windows_signal.__getattr__ = missing_on_windows
    sys.modules["signal"] = windows_signal

    failed = []
    names = []
    for package in ("segscale", "hydra_plugins.segscale_plugins"):
        module = importlib.import_module(package)
        names += [package] + [
            info.name for info in pkgutil.walk_packages(
                module.__path__, package + ".", onerror=lambda name: failed.append(name)
            )
        ]
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as error:
            failed.append(f"{name}: {type(error).__name__}: {error}")
    for shim in ("train", "predict", "evaluate", "bench", "export", "data"):
        spec = importlib.util.spec_from_file_location("shim", f"{REPO}/{shim}.py")
        try:
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
        except Exception as error:
            failed.append(f"{shim}.py: {type(error).__name__}: {error}")
    print(len(names), "modules")
    if failed:
        sys.exit("\\n".join(failed))
    """
)


@pytest.mark.slow
def test_every_module_imports_without_posix_only_modules_and_signals():
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            IMPORT_ALL,
            ",".join(POSIX_ONLY_MODULES),
            ",".join(WINDOWS_SIGNALS),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    count = int(result.stdout.split()[0])
    assert count > 150  # every module was found and imported
