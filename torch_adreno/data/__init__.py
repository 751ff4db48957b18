"""Small datasets shipped with the package (no downloads at run time).

``digits.csv.gz``: the UCI ML hand-written digits test set (1,797 images of 8x8 pixels with values
0..16, 10 classes), as distributed in scikit-learn's data folder; see ``README.md`` beside it.
"""

from __future__ import annotations

import gzip
from importlib import resources

import numpy as np
import torch


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
    import torch.nn.functional as F

    images, labels = load_digits()
    images = F.interpolate(images, size=(28, 28), mode="bilinear", align_corners=False)
    images = (images - images.mean()) / images.std()
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    test = order[: len(order) // 5]
    train = order[len(order) // 5:]
    return images[train], labels[train], images[test], labels[test]
