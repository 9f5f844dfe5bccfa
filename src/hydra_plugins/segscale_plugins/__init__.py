"""segscale's Hydra plugins: the parallel launcher and the Optuna and grid sweepers.

Hydra instantiates launchers and sweepers only from the ``hydra_plugins`` package; the
configs that select them are in ``conf/hydra/``.
"""
