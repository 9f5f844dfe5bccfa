"""The validation pass: every file checked once, what it learnt cached, the dataset's report."""

from __future__ import annotations

from typing import TYPE_CHECKING

from segscale.data import exported_names

if TYPE_CHECKING:
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

_WHERE = {
    "DatasetReport": "dataset_report",
    "ImageNodata": "dataset_report",
    "InvalidDatasetError": "dataset_problems",
    "MaskCounts": "pixel_counts",
    "NodataReport": "dataset_report",
    "PairRequest": "pass_reading",
    "SplitNodata": "dataset_report",
    "ValidationCache": "validation_cache",
    "ValueHistogram": "value_range",
    "ValueRange": "value_range",
    "scan_mask_values": "mask_value_scan",
    "validate_dataset": "validation",
}
"""Each public name and the module that defines it, imported when the name is first used."""

__all__ = [
    "DatasetReport",
    "ImageNodata",
    "InvalidDatasetError",
    "MaskCounts",
    "NodataReport",
    "PairRequest",
    "SplitNodata",
    "ValidationCache",
    "ValueHistogram",
    "ValueRange",
    "scan_mask_values",
    "validate_dataset",
]
__getattr__, __dir__ = exported_names(__name__, _WHERE)
