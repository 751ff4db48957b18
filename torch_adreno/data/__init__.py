"""Small datasets shipped with the package (no downloads at run time).

``digits.csv.gz``: the UCI ML hand-written digits test set (1,797 images of 8x8 pixels with values
0..16, 10 classes), as distributed in scikit-learn's data folder; ``shakespeare.txt.gz``: a
public-domain text corpus for language-model fine-tuning (:mod:`.text`); see ``README.md`` beside
them.
"""

from __future__ import annotations

import gzip
from importlib import resources

import numpy as np
import torch
import torch.nn.functional as F


def load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """Images as float32 (N, 1, 8, 8) scaled to [0, 1], and int64 labels (N,)."""
    with resources.files(__name__).joinpath("digits.csv.gz").open("rb") as raw, gzip.open(raw, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    images = torch.from_numpy(table[:, :64].copy()).reshape(-1, 1, 8, 8) / 16.0
    labels = torch.from_numpy(table[:, 64].astype(np.int64))
    return images, labels


def digits_split(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The digits upsampled to 28x28 (LeNet's input) and standardised, split 80/20 by ``seed``:
    train images, train labels, test images, test labels."""
    images, labels = load_digits()
    images = F.interpolate(images, size=(28, 28), mode="bilinear", align_corners=False)
    images = (images - images.mean()) / images.std()
    return _split(images, labels, seed)


#: torchvision's input normalisation for its ImageNet weights: per-channel mean and std of RGB in [0, 1].
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def digits_rgb_split(size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The digits as (N, 3, ``size``, ``size``) RGB images for ImageNet models: upsampled
    bilinearly, the grey value in all three channels, normalised as torchvision normalises
    ImageNet inputs (so that its pretrained weights see values on their scale); split as
    :func:`digits_split` splits for the same ``seed`` (the same digits in each part)."""
    if size < 1:
        raise ValueError(f"image size must be >= 1, got {size}")
    images, labels = load_digits()
    images = F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False).expand(-1, 3, -1, -1)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return _split((images - mean) / std, labels, seed)


def _split(images: torch.Tensor, labels: torch.Tensor, seed: int
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """80/20 by a permutation drawn from ``seed`` (depends on the count only, not the images)."""
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    test = order[: len(order) // 5]
    train = order[len(order) // 5:]
    return images[train], labels[train], images[test], labels[test]
