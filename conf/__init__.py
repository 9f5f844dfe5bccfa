"""segscale's config tree: a package only so that it ships, and is found, as ``segscale.conf``."""
