"""The data layer: where pixels come from, a dataset's pairs, classes, the checks, patches.

``segscale.data.storage``: image and mask files, their readers, grids, caches, tiles.
``segscale.data.datasets``: a dataset's pairs (split folders, lists, trees; the synthetic set).
``segscale.data.classes``: mask values and classes (label maps, palettes, classes found).
``segscale.data.checks``: the validation pass, its cache, the dataset's report.
``segscale.data.sampling``: where patches may lie, patches, each rank's loaders.
``segscale.data.augment`` (the patch window and albumentations) and
``segscale.data.datamodule`` (the LightningDataModule) use them.

The public names of all of them are offered here (``segscale.data.PatchSampling``) and by
their package (``segscale.data.sampling.PatchSampling``), each imported when first used:
``import segscale.data`` loads neither torch nor any of its modules.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from segscale.data.augment import Augmentation, PatchPose
    from segscale.data.checks.dataset_problems import InvalidDatasetError
    from segscale.data.checks.dataset_report import (
        DatasetReport,
        ImageNodata,
        NodataReport,
        SplitNodata,
    )
    from segscale.data.checks.mask_value_scan import scan_mask_values
    from segscale.data.checks.pass_reading import PairRequest
    from segscale.data.checks.pixel_counts import MaskCounts
    from segscale.data.checks.validation import validate_dataset
    from segscale.data.checks.validation_cache import ValidationCache
    from segscale.data.checks.value_range import ValueHistogram, ValueRange
    from segscale.data.classes.class_discovery import ClassRow, InferredClasses, infer_classes
    from segscale.data.classes.labels import LabelMap
    from segscale.data.classes.mask_values import MaskValueCensus
    from segscale.data.classes.palette import distinct_colours
    from segscale.data.datamodule import (
        ClassSettings,
        LoaderSettings,
        Normalization,
        PatchSettings,
        SegmentationDataModule,
        segmentation_datamodule,
    )
    from segscale.data.datasets.folder import FolderTiles, SplitFiles
    from segscale.data.datasets.lists import ListedLine, read_list
    from segscale.data.datasets.name_pairing import Naming
    from segscale.data.datasets.synthetic import SyntheticTiles
    from segscale.data.datasets.trees import TreePair
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
    from segscale.data.storage.decode_cache import CachedFile, DecodeCache
    from segscale.data.storage.grids import Grid, WarpedLabels, read_grid
    from segscale.data.storage.mapped_arrays import ChangedFileError, MappedArray
    from segscale.data.storage.pixel_types import check_image_headers
    from segscale.data.storage.rasters import Pixels, UnreadableWindowError, WindowedRaster
    from segscale.data.storage.sources import (
        FileProblem,
        ImageHeader,
        ImageMaskPair,
        MaskFile,
        TileSource,
        read_image,
        read_mask,
    )
    from segscale.data.storage.tiles import (
        LabelledMask,
        Tile,
        UnreadableTileError,
        UnreadableTiles,
        open_tiles,
    )


def exported_names(
    package: str, where: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` for its public names (PEP 562).

    ``where`` maps each name to the module below ``package`` that defines it; the module
    is imported when the name is first asked for, so importing the package imports none.
    """

    def attribute(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(f"{package}.{module}"), name)

    def names() -> list[str]:
        return sorted({*import_module(package).__dict__, *where})

    return attribute, names


_WHERE = {
    "Augmentation": "augment",
    "CachedFile": "storage.decode_cache",
    "ChangedFileError": "storage.mapped_arrays",
    "ClassCentres": "sampling.class_locations",
    "ClassRow": "classes.class_discovery",
    "ClassSettings": "datamodule",
    "DatasetReport": "checks.dataset_report",
    "DecodeCache": "storage.decode_cache",
    "DeferredStartLoader": "sampling.loaders",
    "EpochShardSampler": "sampling.loaders",
    "FileProblem": "storage.sources",
    "FolderTiles": "datasets.folder",
    "Grid": "storage.grids",
    "GridPatchDataset": "sampling.patches",
    "ImageHeader": "storage.sources",
    "ImageMaskPair": "storage.sources",
    "ImageNodata": "checks.dataset_report",
    "InferredClasses": "classes.class_discovery",
    "InvalidDatasetError": "checks.dataset_problems",
    "LabelMap": "classes.labels",
    "LabelledMask": "storage.tiles",
    "ListedLine": "datasets.lists",
    "LoaderSettings": "datamodule",
    "LocationSampler": "sampling.class_locations",
    "MappedArray": "storage.mapped_arrays",
    "MaskCounts": "checks.pixel_counts",
    "MaskFile": "storage.sources",
    "MaskValueCensus": "classes.mask_values",
    "Naming": "datasets.name_pairing",
    "NodataReport": "checks.dataset_report",
    "Normalization": "datamodule",
    "PairRequest": "checks.pass_reading",
    "PatchDraw": "sampling.patches",
    "PatchPose": "augment",
    "PatchSampling": "sampling.patches",
    "PatchSettings": "datamodule",
    "Pixels": "storage.rasters",
    "RandomPatchDataset": "sampling.patches",
    "SegmentationDataModule": "datamodule",
    "SplitFiles": "datasets.folder",
    "SplitNodata": "checks.dataset_report",
    "SyntheticTiles": "datasets.synthetic",
    "Tile": "storage.tiles",
    "TileClassLocations": "sampling.class_locations",
    "TileSource": "storage.sources",
    "TileValidCells": "sampling.valid_windows",
    "TileWindows": "sampling.valid_windows",
    "TreePair": "datasets.trees",
    "UnreadableTileError": "storage.tiles",
    "UnreadableTiles": "storage.tiles",
    "UnreadableWindowError": "storage.rasters",
    "ValidCellCounter": "sampling.valid_windows",
    "ValidPixels": "sampling.valid_windows",
    "ValidationCache": "checks.validation_cache",
    "Validity": "sampling.valid_windows",
    "ValueHistogram": "checks.value_range",
    "ValueRange": "checks.value_range",
    "WarpedLabels": "storage.grids",
    "WindowedRaster": "storage.rasters",
    "check_image_headers": "storage.pixel_types",
    "distinct_colours": "classes.palette",
    "infer_classes": "classes.class_discovery",
    "open_tiles": "storage.tiles",
    "read_grid": "storage.grids",
    "read_image": "storage.sources",
    "read_list": "datasets.lists",
    "read_mask": "storage.sources",
    "scan_mask_values": "checks.mask_value_scan",
    "segmentation_datamodule": "datamodule",
    "validate_dataset": "checks.validation",
}
"""Each public name and the module that defines it, imported when the name is first used."""

__all__ = [
    "Augmentation",
    "CachedFile",
    "ChangedFileError",
    "ClassCentres",
    "ClassRow",
    "ClassSettings",
    "DatasetReport",
    "DecodeCache",
    "DeferredStartLoader",
    "EpochShardSampler",
    "FileProblem",
    "FolderTiles",
    "Grid",
    "GridPatchDataset",
    "ImageHeader",
    "ImageMaskPair",
    "ImageNodata",
    "InferredClasses",
    "InvalidDatasetError",
    "LabelMap",
    "LabelledMask",
    "ListedLine",
    "LoaderSettings",
    "LocationSampler",
    "MappedArray",
    "MaskCounts",
    "MaskFile",
    "MaskValueCensus",
    "Naming",
    "NodataReport",
    "Normalization",
    "PairRequest",
    "PatchDraw",
    "PatchPose",
    "PatchSampling",
    "PatchSettings",
    "Pixels",
    "RandomPatchDataset",
    "SegmentationDataModule",
    "SplitFiles",
    "SplitNodata",
    "SyntheticTiles",
    "Tile",
    "TileClassLocations",
    "TileSource",
    "TileValidCells",
    "TileWindows",
    "TreePair",
    "UnreadableTileError",
    "UnreadableTiles",
    "UnreadableWindowError",
    "ValidCellCounter",
    "ValidPixels",
    "ValidationCache",
    "Validity",
    "ValueHistogram",
    "ValueRange",
    "WarpedLabels",
    "WindowedRaster",
    "check_image_headers",
    "distinct_colours",
    "infer_classes",
    "open_tiles",
    "read_grid",
    "read_image",
    "read_list",
    "read_mask",
    "scan_mask_values",
    "segmentation_datamodule",
    "validate_dataset",
]
__getattr__, __dir__ = exported_names(__name__, _WHERE)
