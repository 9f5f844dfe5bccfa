import numpy as np
import pytest
import torch

from segscale.data.sampling.patches import GridPatchDataset
from segscale.data.storage.tiles import Tile
from segscale.training.reporting.whole_tile_prediction import display_stride, predict_whole_tile

# A 10×13 tile on a grid of 4×4 patches: the last row and column of patches overlap
# their neighbours (rows 6-7, columns 9-11), where the later patch is marked ignored.
HEIGHT, WIDTH, SIZE = 10, 13, 4


def grid_of(image: np.ndarray) -> GridPatchDataset:
    return GridPatchDataset([Tile(image, np.zeros(image.shape[:2], np.uint8))], SIZE)


@pytest.mark.parametrize("stride", [1, 3])
def test_stitching_the_grid_equals_predicting_the_whole_image(stride):
    image = np.random.default_rng(0).integers(0, 255, (HEIGHT, WIDTH, 3), dtype=np.uint8)

    def classify(images: torch.Tensor) -> torch.Tensor:  # per pixel: tiling changes nothing
        return images[:, 0] % 5

    direct = classify(torch.from_numpy(image).permute(2, 0, 1)[None])[0].numpy()
    stitched = predict_whole_tile(classify, grid_of(image), 0, stride, batch_size=3)
    np.testing.assert_array_equal(stitched, direct[::stride, ::stride])


def test_each_pixel_comes_from_the_patch_that_scores_it():
    def where_in_patch(images: torch.Tensor) -> torch.Tensor:  # row·SIZE + column in the patch
        rows, cols = torch.meshgrid(torch.arange(SIZE), torch.arange(SIZE), indexing="ij")
        return (rows * SIZE + cols).expand(len(images), SIZE, SIZE)

    stitched = predict_whole_tile(where_in_patch, grid_of(np.zeros((HEIGHT, WIDTH, 3))), 0)
    # The patch that scores pixel r starts at (r // SIZE)·SIZE, or at the last start.
    row = np.arange(HEIGHT) - np.minimum(np.arange(HEIGHT) // SIZE * SIZE, HEIGHT - SIZE)
    col = np.arange(WIDTH) - np.minimum(np.arange(WIDTH) // SIZE * SIZE, WIDTH - SIZE)
    np.testing.assert_array_equal(stitched, row[:, None] * SIZE + col[None, :])
    assert display_stride((6000, 2500), 1024) == 6 and display_stride((96, 64), 1024) == 1
