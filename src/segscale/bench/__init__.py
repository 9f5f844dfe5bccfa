"""Measurement and prediction code behind ``bench.py``."""
