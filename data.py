"""Inspect a dataset without training: ``python data.py [datamodule overrides]`` (see README.md)."""

from segscale.cli.data import main

if __name__ == "__main__":
    main()
