"""Evaluate a checkpoint on a labelled split: ``python evaluate.py ckpt=... [datamodule=...]``."""

from segscale.cli.evaluate import main

if __name__ == "__main__":
    main()
