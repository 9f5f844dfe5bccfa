"""A dataset's pairs: images and masks paired by name, split folders, lists or trees.

And the synthetic set.
"""
