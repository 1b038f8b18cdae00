"""What this project's inputs are outside training: image files for predict.py, an image in a
request for serve.py, and the preprocessing an exported model records as data.

numpy and Pillow (and torchvision's list of image suffixes, for a folder given to predict.py):
serving an exported model imports this module, by the name its metadata records, and neither
Lightning nor the model's classes. kit/project.py's `Inputs` lists what the library uses of it.
"""

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from .kit.errors import InputTooLargeError, UnreadableInputError

# serve.py's request body: {"image": "<base64 of an image file>"}.
FIELD = "image"
ONE_FILE = "an image file"
# The files a folder given to predict.py is searched for: torchvision's image suffixes.
ACCEPTED = "image files (.jpg, .jpeg, .png, .ppm, .bmp, .pgm, .tif, .tiff, .webp)"
# The image mode of each channel count that the preprocessing can be recorded for.
MODES = {1: "L", 3: "RGB"}
# The keys of the recorded preprocessing (the library checks an artifact has them all).
STEPS = ("mode", "resize", "interpolation", "center_crop", "value_range")


def files_in(folder: Path) -> list[Path]:
    """The image files under a folder, in sorted order (torchvision's list of suffixes)."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    return sorted(path for path in folder.rglob("*") if path.suffix.lower() in IMG_EXTENSIONS)


def read(source: Path | bytes) -> Image.Image:
    """An image file, or its bytes, as an RGB image."""
    try:
        with (
            source.open("rb") if isinstance(source, Path) else io.BytesIO(source) as file,
            Image.open(file) as image,
        ):
            if image.mode.startswith("I;16"):
                # 16-bit grey: Pillow's conversion would clip it to 0 or 255, not scale it.
                image = Image.fromarray((np.asarray(image) >> 8).astype(np.uint8))
            return image.convert("RGB")
    except Image.DecompressionBombError:
        raise InputTooLargeError("the image has too many pixels") from None
    except UnidentifiedImageError:
        raise UnreadableInputError("not an image file") from None
    except (OSError, ValueError) as error:
        raise UnreadableInputError(f"cannot decode image: {error}") from None


def preprocess(
    image: Image.Image, steps: dict[str, Any], mean: list[float], std: list[float]
) -> np.ndarray:
    """One image -> one model input (C, H, W, float32), with numpy and Pillow only.

    `steps` is the metadata's `preprocessing`: the image is converted to `mode` ("L" or
    "RGB"), resized with `interpolation` to `resize` ([height, width], or an int: the
    shorter side's length, keeping the aspect ratio), cut to its `center_crop` ([height,
    width], or null), and its 8-bit values 0..255 are mapped linearly onto `value_range`
    (the pixel values the model was trained on: [0, 1], or the digits' [0, 16]); then
    `(x - mean) / std` per channel.
    """
    image = image.convert("RGB").convert(steps["mode"])
    width, height = image.size
    size = steps["resize"]
    if isinstance(size, int):  # torchvision's rule: the longer side is rounded down
        short, long = sorted((width, height))
        new_long = int(size * long / short)
        height, width = (new_long, size) if width <= height else (size, new_long)
    else:
        height, width = size
    if (width, height) != image.size:
        image = image.resize((width, height), Image.Resampling[steps["interpolation"].upper()])
    if crop := steps.get("center_crop"):
        top, left = round((height - crop[0]) / 2), round((width - crop[1]) / 2)
        image = image.crop((left, top, left + crop[1], top + crop[0]))
    pixels = np.asarray(image, dtype=np.float32)
    pixels = pixels.reshape(*pixels.shape[:2], -1).transpose(2, 0, 1) * np.float32(1 / 255)
    low, high = steps["value_range"]
    pixels = pixels * np.float32(high - low) + np.float32(low)
    shift, spread = (np.asarray(v, dtype=np.float32).reshape(-1, 1, 1) for v in (mean, std))
    return np.ascontiguousarray((pixels - shift) / spread)


def describe(
    transform: Callable[[Image.Image], Any],
    input_shape: tuple[int, int, int],
    mean: list[float],
    std: list[float],
) -> tuple[dict[str, Any] | None, dict[str, float]]:
    """The data module's prediction transform as data for `preprocess`, and its check.

    Measured, then checked: black and white images give the value range the 8-bit values
    map onto; of the two geometries of torchvision preprocessing (a resize to the input size;
    the shorter side resized, then a centre crop), the first that reproduces `transform` on
    random images of other sizes and shapes, to within one 8-bit step of the model's input,
    is kept. (None, {}) when no description reproduces it.
    """
    channels, height, width = input_shape
    if channels not in MODES:
        return None, {}
    centre, spread = (np.asarray(v, dtype=np.float32).reshape(-1, 1, 1) for v in (mean, std))
    black, white = (
        np.asarray(transform(Image.new("RGB", (width, height), (value,) * 3))) * spread + centre
        for value in (0, 255)
    )
    low, high = (round(float(values.mean()), 4) + 0.0 for values in (black, white))
    tolerance = 1.01 * abs(high - low) / 255 / min(std)  # one 8-bit step, and float rounding
    geometries = (
        {"resize": [height, width], "center_crop": None},
        {"resize": max(height, width), "center_crop": [height, width]},
    )
    for geometry in geometries:
        steps = {
            "mode": MODES[channels],
            "resize": geometry["resize"],
            "interpolation": "bilinear",
            "center_crop": geometry["center_crop"],
            "value_range": [low, high],
        }
        difference = max(
            difference_on(transform, steps, image, mean, std)
            for image in probe_images(height, width)
        )
        if difference <= tolerance:
            return steps, {"max_abs_diff": difference, "tolerance": tolerance}
    return None, {}


def probe_images(height: int, width: int) -> list[Image.Image]:
    """Random RGB images of the input's size, wider, taller and larger (seeded)."""
    rng = np.random.default_rng(0)
    sizes = [(width, height), (2 * width + 3, height + 1), (width + 1, 2 * height + 5)]
    sizes.append((3 * width + 1, 3 * height + 2))
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in sizes]


def difference_on(
    transform: Callable[[Image.Image], Any],
    steps: dict[str, Any],
    image: Image.Image,
    mean: list[float],
    std: list[float],
) -> float:
    """Largest |difference| between `transform` and `steps` on one image (inf: other shape)."""
    expected = np.asarray(transform(image), dtype=np.float32)
    recorded = preprocess(image, steps, mean, std)
    if expected.shape != recorded.shape:
        return float("inf")
    return float(np.abs(expected - recorded).max())
