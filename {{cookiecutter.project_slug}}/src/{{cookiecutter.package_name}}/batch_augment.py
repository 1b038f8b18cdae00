"""Random augmentations of whole batches (N, C, H, W): a new draw for every image, on the
batch's own device, in one tensor operation each.

Each matches a torchvision transform in distribution (named in its docstring; the tests
compare them). They draw from the global torch RNG of the batch's device, which checkpoints
store, so a resumed run augments exactly as one that never stopped.
"""

import torch
from torch import Tensor
from torch.nn import functional as F


def random_crop(images: Tensor, padding: int) -> Tensor:
    """Like `v2.RandomCrop(size, padding=padding)`: pad every side with zeros, then cut a
    window of the original size at a random offset."""
    n, _, height, width = images.shape
    padded = F.pad(images, (padding,) * 4)
    device = images.device
    top = torch.randint(0, 2 * padding + 1, (n, 1, 1), device=device)
    left = torch.randint(0, 2 * padding + 1, (n, 1, 1), device=device)
    rows = top + torch.arange(height, device=device).view(1, -1, 1)
    cols = left + torch.arange(width, device=device).view(1, 1, -1)
    batch = torch.arange(n, device=device).view(-1, 1, 1)
    # Advanced indices around a slice put their dimensions first: (N, H, W, C).
    return padded[batch, :, rows, cols].permute(0, 3, 1, 2)


def random_horizontal_flip(images: Tensor, p: float = 0.5) -> Tensor:
    """Like `v2.RandomHorizontalFlip(p)`: each image mirrored left-right with probability p."""
    flip = torch.rand(len(images), device=images.device) < p
    return torch.where(flip.view(-1, 1, 1, 1), images.flip(-1), images)


def random_affine(images: Tensor, degrees: float, translate: float) -> Tensor:
    """Like `v2.RandomAffine(degrees, translate=(translate, translate))`: rotation by an angle
    uniform in ±degrees about the centre, then a shift by whole pixels uniform in ±translate
    of the size; nearest-pixel sampling, zeros outside."""
    n, _, height, width = images.shape
    device = images.device
    angle = torch.deg2rad((torch.rand(n, device=device) * 2 - 1) * degrees)
    shift = (torch.rand(n, 2, device=device) * 2 - 1) * translate
    tx = (shift[:, 0] * width).round()
    ty = (shift[:, 1] * height).round()
    cos, sin = angle.cos(), angle.sin()
    # affine_grid maps each output pixel to where it samples the input, in [-1, 1] units:
    # the inverse rotation of (output - shift), with pixel units rescaled per axis.
    theta = torch.stack(
        [
            torch.stack([cos, sin * height / width, -2 / width * (cos * tx + sin * ty)], dim=1),
            torch.stack([-sin * width / height, cos, -2 / height * (-sin * tx + cos * ty)], dim=1),
        ],
        dim=1,
    )
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    moved = F.grid_sample(images.float(), grid, mode="nearest", align_corners=False)
    return moved.to(images.dtype)
