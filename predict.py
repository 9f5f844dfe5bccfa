"""Apply a trained checkpoint to images of any size: ``python predict.py ckpt=... input=...``."""

from segscale.cli.predict import main

if __name__ == "__main__":
    main()
