"""Mask values and classes: label maps, palettes, the classes found in the masks."""
