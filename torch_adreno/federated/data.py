"""The bundled digits split across federated clients, non-IID: each client holds mostly a few digits.

Every process (server, each client) computes the same split from the same seed, so nothing but
the client's index has to be passed to a client, on this machine or on a phone elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Partition:
    """One client's share: training and held-out digits, both drawn from its skewed label mix."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor

    def label_counts(self) -> list[int]:
        return torch.bincount(self.y_train, minlength=10).tolist()


def owner_of(label: int, clients: int) -> int:
    """The client that holds most examples of ``label``: digits dealt round-robin (3 clients:
    {0, 3, 6, 9}, {1, 4, 7}, {2, 5, 8})."""
    return label % clients


def split_indices(labels: torch.Tensor, clients: int, skew: float, seed: int) -> list[torch.Tensor]:
    """Indices into ``labels`` per client. Of each label's examples a share ``skew`` goes to its
    owner (:func:`owner_of`), the rest is dealt evenly over the other clients; every example goes
    to exactly one client. ``skew`` = 1/clients is an IID split, 1.0 gives each client only its digits."""
    if clients < 1:
        raise ValueError(f"expected at least 1 client, got {clients}")
    if not 0.0 <= skew <= 1.0:
        raise ValueError(f"expected a skew in [0, 1] (the share of a digit's examples its owner holds), got {skew}")
    generator = torch.Generator().manual_seed(seed)
    shares: list[list[torch.Tensor]] = [[] for _ in range(clients)]
    for label in range(int(labels.max()) + 1 if len(labels) else 0):
        members = (labels == label).nonzero().flatten()
        members = members[torch.randperm(len(members), generator=generator)]
        owner = owner_of(label, clients)
        kept = round(len(members) * skew) if clients > 1 else len(members)
        shares[owner].append(members[:kept])
        others = [c for c in range(clients) if c != owner]
        for i, c in enumerate(others):
            shares[c].append(members[kept:][i::len(others)])
    return [torch.cat(s).sort().values if s else torch.empty(0, dtype=torch.long) for s in shares]


def digits_partitions(clients: int, skew: float, seed: int) -> tuple[list[Partition], torch.Tensor, torch.Tensor]:
    """Each client's :class:`Partition` of the bundled digits (28x28, normalised, as the ``train``
    demo uses them) and the whole test set, which is the union of the clients' test shares."""
    from torch_adreno.data import digits_split

    x_train, y_train, x_test, y_test = digits_split(seed)
    train_parts = split_indices(y_train, clients, skew, seed)
    test_parts = split_indices(y_test, clients, skew, seed + 1)
    partitions = [Partition(x_train[tr], y_train[tr], x_test[te], y_test[te])
                  for tr, te in zip(train_parts, test_parts, strict=True)]
    return partitions, x_test, y_test
