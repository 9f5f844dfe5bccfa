"""The prediction run of ``predict.py``: its inputs, outputs, georeference and probability maps."""
