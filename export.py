"""Write a trained checkpoint as one ONNX or TorchScript file: ``python export.py ckpt=...``."""

from segscale.cli.export import main

if __name__ == "__main__":
    main()
