"""Variable-length batches padded to a few lengths, so that a TrainingStep replays them.

A :class:`~torch_adreno.TrainingStep` compiles and captures a step per batch geometry: a loader
whose sequence length changes every batch would compile every step. :class:`Buckets` pads each
batch along its sequence dimension to the smallest of a few lengths that holds it, so the step
sees as many geometries as there are buckets, each compiled and captured once, then replayed.

    buckets = torch_adreno.Buckets((64, 128, 256), pad={"input_ids": tokenizer.pad_token_id,
                                                       "attention_mask": 0, "labels": -100})
    for batch in loader:
        batch = buckets(batch)
        loss = step(batch["input_ids"], batch["attention_mask"], batch["labels"])

Padding must not change the loss: pad labels with the loss's ignore index (-100 for
``cross_entropy`` and Hugging Face models) and the attention mask with 0. A causal model padded
on the right computes the same loss without a mask (no real token attends to a later one).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F


class Buckets:
    """Pads the tensors named in ``pad`` (dictionary keys, or positions of a tuple or list batch)
    along ``dim`` to the smallest of ``lengths`` that holds them; other entries pass unchanged.

    A mapping batch comes back as a ``dict``, a tuple as a tuple, a list as a list.

    Invariants: every padded tensor of one batch had the same length along ``dim`` (else
    ``ValueError``); a batch longer than the largest bucket is refused (``ValueError``), never
    cut; the padded values are ``pad``'s; each padded entry is a new tensor.
    """

    def __init__(self, lengths: Sequence[int], pad: Mapping[Any, float | int], dim: int = 1) -> None:
        if not lengths or any(not isinstance(n, int) or n < 1 for n in lengths):
            raise ValueError(f"Buckets needs positive integer lengths, got {list(lengths)}")
        if not pad:
            raise ValueError("Buckets needs the pad value of each sequence tensor, e.g. "
                             "pad={'input_ids': 0, 'attention_mask': 0, 'labels': -100}")
        self.lengths = tuple(sorted(set(lengths)))
        self.pad = dict(pad)
        self.dim = dim

    def length_for(self, length: int) -> int:
        """The bucket a sequence of ``length`` goes to."""
        index = bisect.bisect_left(self.lengths, length)
        if index == len(self.lengths):
            raise ValueError(f"a batch of length {length} is longer than the largest bucket, {self.lengths[-1]}: "
                             "add a larger length to Buckets, or cut the sequences before batching")
        return self.lengths[index]

    def __call__(self, batch: Any) -> Any:
        if isinstance(batch, Mapping):
            entries = dict(batch)
        elif isinstance(batch, (tuple, list)):
            entries = dict(enumerate(batch))
        else:
            raise TypeError(f"Buckets pads a dict, tuple or list batch, not {type(batch).__name__}")
        missing = [key for key in self.pad if key not in entries]
        if missing:
            raise KeyError(f"the batch has no {', '.join(map(repr, missing))} to pad (it has {list(entries)})")
        lengths = {key: self._length(key, entries[key]) for key in self.pad}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"the sequence tensors differ in length along dim {self.dim}: {lengths}")
        target = self.length_for(next(iter(lengths.values())))
        for key, value in self.pad.items():
            tensor = entries[key]
            dim = self.dim % tensor.dim()
            # F.pad takes (before, after) pairs from the last dimension backwards. A new tensor even
            # where nothing is missing: batch arguments then never share memory (a step replays a
            # capture only for batches whose arguments share memory as the captured ones did).
            widths = [0, 0] * (tensor.dim() - dim - 1) + [0, target - tensor.shape[self.dim]]
            entries[key] = F.pad(tensor, widths, value=value)
        if isinstance(batch, Mapping):
            return entries
        values = [entries[i] for i in range(len(batch))]
        return type(batch)(values) if isinstance(batch, tuple) else values

    def _length(self, key: Any, value: Any) -> int:
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            raise TypeError(f"batch entry {key!r} is not a tensor with a sequence dimension")
        return int(value.shape[self.dim])
