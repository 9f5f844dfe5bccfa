"""The evaluation run of ``evaluate.py``: a checkpoint scored on a split, and per-image metrics."""
