"""segserve: serve a segmentation → JPEG pipeline on TorchServe, and measure it."""

from pathlib import Path

__version__ = "0.1.0"

# The checkout segserve runs from (handlers/, workflows/, model_config/, samples/): the one place that knows how deep
# this file sits, so a module can move between folders without its paths breaking.
ROOT = Path(__file__).resolve().parent.parent
