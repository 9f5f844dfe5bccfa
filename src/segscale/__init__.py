"""segscale: config-driven semantic segmentation on one device or many."""

__version__ = "0.1.0"
