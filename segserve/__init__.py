"""segserve: serve a segmentation → JPEG pipeline on TorchServe, and measure it."""

__version__ = "0.1.0"
