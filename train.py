"""Train a segmentation network: ``python train.py [overrides]`` (see README.md)."""

from segscale.cli.train import main

if __name__ == "__main__":
    main()
