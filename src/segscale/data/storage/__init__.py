"""Where the pixels come from: image and mask files, their readers, grids, caches, tiles."""
