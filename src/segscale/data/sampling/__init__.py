"""What a training step draws: where patches may lie, patches, each rank's loaders."""

from __future__ import annotations

from typing import TYPE_CHECKING

from segscale.data import exported_names

if TYPE_CHECKING:
    from segscale.data.sampling.class_locations import (
        ClassCentres,
        LocationSampler,
        TileClassLocations,
    )
    from segscale.data.sampling.loaders import DeferredStartLoader, EpochShardSampler
    from segscale.data.sampling.patches import (
        GridPatchDataset,
        PatchDraw,
        PatchSampling,
        RandomPatchDataset,
    )
    from segscale.data.sampling.valid_windows import (
        TileValidCells,
        TileWindows,
        ValidCellCounter,
        Validity,
        ValidPixels,
    )

_WHERE = {
    "ClassCentres": "class_locations",
    "DeferredStartLoader": "loaders",
    "EpochShardSampler": "loaders",
    "GridPatchDataset": "patches",
    "LocationSampler": "class_locations",
    "PatchDraw": "patches",
    "PatchSampling": "patches",
    "RandomPatchDataset": "patches",
    "TileClassLocations": "class_locations",
    "TileValidCells": "valid_windows",
    "TileWindows": "valid_windows",
    "ValidCellCounter": "valid_windows",
    "ValidPixels": "valid_windows",
    "Validity": "valid_windows",
}
"""Each public name and the module that defines it, imported when the name is first used."""

__all__ = [
    "ClassCentres",
    "DeferredStartLoader",
    "EpochShardSampler",
    "GridPatchDataset",
    "LocationSampler",
    "PatchDraw",
    "PatchSampling",
    "RandomPatchDataset",
    "TileClassLocations",
    "TileValidCells",
    "TileWindows",
    "ValidCellCounter",
    "ValidPixels",
    "Validity",
]
__getattr__, __dir__ = exported_names(__name__, _WHERE)
