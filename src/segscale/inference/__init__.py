"""Applying a trained network to whole images."""
