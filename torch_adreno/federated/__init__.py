"""Federated learning with Flower on the compiled, replayed :class:`~torch_adreno.TrainingStep`.

:class:`AdrenoClient` (a Flower ``NumPyClient``) trains on one device; :func:`run_federation`
serves FedAvg rounds, with client processes on this machine or clients elsewhere. Needs the
``federated`` extra (``pip install 'torch-adreno[federated]'``: Flower).
"""

from __future__ import annotations

from torch_adreno.federated.client import OPTIMIZER_STATE_MODES, AdrenoClient, weights_digest
from torch_adreno.federated.data import Partition, digits_partitions, split_indices
from torch_adreno.federated.local import (
    FederationResult,
    FederationSettings,
    format_round,
    free_port,
    run_client,
    run_federation,
)
from torch_adreno.federated.server import FederationServer, RecordingFedAvg, RoundReport

__all__ = [
    "OPTIMIZER_STATE_MODES", "AdrenoClient", "FederationResult", "FederationServer", "FederationSettings",
    "Partition", "RecordingFedAvg", "RoundReport", "digits_partitions", "format_round", "free_port", "run_client",
    "run_federation", "split_indices", "weights_digest",
]
