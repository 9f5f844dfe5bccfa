"""Measure a training config and predict its multi-device speed: ``python bench.py [overrides]``."""

from segscale.cli.bench import main

if __name__ == "__main__":
    main()
