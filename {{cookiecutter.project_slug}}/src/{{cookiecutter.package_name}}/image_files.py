"""How an image folder's files are read for training, from the folder or from its shards.

numpy and Pillow only: a loader's worker processes start from a server that imports the
modules of what they are sent (this reader among them) before the first worker exists, so
this module imports neither Lightning nor the training code.
"""

from pathlib import Path
from typing import IO

import numpy as np
from PIL import Image


def open_rgb(file: str | Path | IO[bytes]) -> Image.Image:
    """An image file as RGB, as ImageFolder's own loader reads it, except 16-bit grey: scaled to
    8 bits, which Pillow's conversion would clip to 0 or 255."""
    with Image.open(file) as image:
        if image.mode.startswith("I;16"):
            image = Image.fromarray((np.asarray(image) >> 8).astype(np.uint8))
        return image.convert("RGB")
