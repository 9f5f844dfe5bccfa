"""The export of ``export.py``: a trained network as one ONNX or TorchScript file, checked."""
