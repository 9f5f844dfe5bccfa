"""A dataset's pairs: images and masks paired by name, split folders, lists or trees.

And the synthetic set.

"""

from __future__ import annotations

from typing import TYPE_CHECKING

from segscale.data import exported_names

if TYPE_CHECKING:
    from segscale.data.datasets.folder import FolderTiles, SplitFiles
    from segscale.data.datasets.lists import ListedLine, read_list
    from segscale.data.datasets.name_pairing import Naming
    from segscale.data.datasets.synthetic import SyntheticTiles
    from segscale.data.datasets.trees import TreePair

_WHERE = {
    "FolderTiles": "folder",
    "ListedLine": "lists",
    "Naming": "name_pairing",
    "SplitFiles": "folder",
    "SyntheticTiles": "synthetic",
    "TreePair": "trees",
    "read_list": "lists",
}
"""Each public name and the module that defines it, imported when the name is first used."""

__all__ = [
    "FolderTiles",
    "ListedLine",
    "Naming",
    "SplitFiles",
    "SyntheticTiles",
    "TreePair",
    "read_list",
]
__getattr__, __dir__ = exported_names(__name__, _WHERE)
