"""The server side: FedAvg that records every round (what each client returned, what failed, the
global model's accuracy) and a bounded Flower server over gRPC.

Flower 1.13+ deprecates ``start_server`` / ``start_client`` for its SuperLink / SuperNode
deployment, but keeps the gRPC transport they use (``flwr.compat``); it is what a client on a
phone reaching a server by address needs, and what runs here. The server is assembled from its
parts rather than through ``start_server`` so that it installs no process-wide signal handlers
and every wait is bounded: a round waits at most ``round_timeout`` for its clients, a round with
no connected client waits ``client_wait`` and is skipped, and the caller can ``abort()`` it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.common import FitIns, Parameters, Scalar, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server import Server
from flwr.server.client_manager import SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg
from flwr.server.superlink.fleet.grpc_bidi.grpc_server import start_grpc_server

from torch_adreno.federated.client import weights_digest


@dataclass
class ClientRound:
    """What one client returned from ``fit`` in one round."""

    client_index: int
    num_examples: int
    metrics: dict[str, Scalar]
    weights: list[np.ndarray]
    bytes_received: int  # the serialized weights the server got from this client


@dataclass
class RoundReport:
    """One round as the server saw it. ``failures``: the clients' fits that raised or never
    answered (a crashed process, a round timeout), with what Flower said."""

    number: int
    clients: list[ClientRound] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    bytes_sent: int = 0  # serialized global weights sent for fit, summed over the clients
    global_weights: list[np.ndarray] | None = None
    global_digest: str | None = None
    global_accuracy: float | None = None  # the aggregated model on the whole test set (host, eager)
    global_loss: float | None = None
    device_accuracy: float | None = None  # the clients' evaluations on the device, example-weighted
    evaluations: int = 0


class BoundedClientManager(SimpleClientManager):
    """Waits at most ``client_wait`` seconds for clients (Flower's own waits a day), and not at
    all once aborted: a federation whose clients all died ends instead of hanging."""

    def __init__(self, client_wait: float) -> None:
        super().__init__()
        self.client_wait = client_wait
        self.aborted = threading.Event()

    def wait_for(self, num_clients: int, timeout: int = 86400) -> bool:
        return self.wait_until(num_clients, min(timeout, self.client_wait))

    def wait_until(self, num_clients: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for ``num_clients``, ending early once aborted."""
        ends = time.monotonic() + timeout
        while not self.aborted.is_set():
            left = ends - time.monotonic()
            if left <= 0:
                return False
            if super().wait_for(num_clients, timeout=min(left, 0.5)):  # type: ignore[arg-type]
                return True
        return False


def _payload_bytes(parameters: Parameters) -> int:
    return sum(len(t) for t in parameters.tensors)


class RecordingFedAvg(FedAvg):
    """FedAvg (example-weighted average of the clients' weights, failures accepted) that keeps a
    :class:`RoundReport` per round and calls ``on_round(report)`` once a round is complete."""

    def __init__(self, *, initial_weights: list[np.ndarray], local_epochs: int,
                 evaluate_global: Callable[[list[np.ndarray]], tuple[float, float]],
                 on_round: Callable[[RoundReport], None] | None = None, min_clients: int = 1) -> None:
        super().__init__(
            fraction_fit=1.0, fraction_evaluate=1.0, min_fit_clients=min_clients,
            min_evaluate_clients=min_clients, min_available_clients=min_clients,
            initial_parameters=ndarrays_to_parameters(initial_weights), accept_failures=True,
            on_fit_config_fn=lambda r: {"server_round": r, "local_epochs": local_epochs},
            on_evaluate_config_fn=lambda r: {"server_round": r}, inplace=False,
            fit_metrics_aggregation_fn=_weighted_loss_and_accuracy,
            evaluate_metrics_aggregation_fn=_weighted_loss_and_accuracy,
        )
        self._evaluate_global = evaluate_global
        self._on_round = on_round
        self.rounds: list[RoundReport] = []
        self._finished: set[int] = set()

    def _report(self, server_round: int) -> RoundReport:
        while len(self.rounds) < server_round:
            self.rounds.append(RoundReport(len(self.rounds) + 1))
        return self.rounds[server_round - 1]

    def finish_round(self, server_round: int) -> None:
        """Hand the round's report on (once); called after its evaluation, or when it had none."""
        if 1 <= server_round <= len(self.rounds) and server_round not in self._finished:
            self._finished.add(server_round)
            if self._on_round is not None:
                self._on_round(self.rounds[server_round - 1])

    def configure_fit(self, server_round: int, parameters: Parameters,
                      client_manager: Any) -> list[tuple[ClientProxy, FitIns]]:
        self.finish_round(server_round - 1)
        if _aborted(client_manager):
            return []
        instructions = super().configure_fit(server_round, parameters, client_manager)
        self._report(server_round).bytes_sent = _payload_bytes(parameters) * len(instructions)
        return instructions

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, Any]],
                      failures: list[Any]) -> tuple[Parameters | None, dict[str, Scalar]]:
        report = self._report(server_round)
        for _, res in results:
            report.clients.append(ClientRound(int(res.metrics.get("client_index", -1)), res.num_examples,
                                              dict(res.metrics), parameters_to_ndarrays(res.parameters),
                                              _payload_bytes(res.parameters)))
        report.clients.sort(key=lambda c: c.client_index)
        report.failures.extend(_describe_failure(f) for f in failures)
        aggregated, metrics = super().aggregate_fit(server_round, results, failures)
        if aggregated is not None:
            report.global_weights = parameters_to_ndarrays(aggregated)
            report.global_digest = weights_digest(report.global_weights)
        return aggregated, metrics

    def configure_evaluate(self, server_round: int, parameters: Parameters, client_manager: Any) -> list[Any]:
        return [] if _aborted(client_manager) else super().configure_evaluate(server_round, parameters, client_manager)

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        if server_round == 0:
            return None
        loss, accuracy = self._evaluate_global(parameters_to_ndarrays(parameters))
        report = self._report(server_round)
        report.global_loss, report.global_accuracy = loss, accuracy
        return loss, {"accuracy": accuracy}

    def aggregate_evaluate(self, server_round: int, results: list[tuple[ClientProxy, Any]],
                           failures: list[Any]) -> tuple[float | None, dict[str, Scalar]]:
        report = self._report(server_round)
        examples = sum(res.num_examples for _, res in results)
        if examples:
            report.device_accuracy = sum(float(res.metrics["accuracy"]) * res.num_examples
                                         for _, res in results) / examples
        report.evaluations = len(results)
        report.failures.extend(f"evaluate: {_describe_failure(f)}" for f in failures)
        outcome = super().aggregate_evaluate(server_round, results, failures)
        self.finish_round(server_round)
        return outcome


def _weighted_loss_and_accuracy(results: list[tuple[int, dict[str, Scalar]]]) -> dict[str, Scalar]:
    """The clients' ``loss`` and ``accuracy`` metrics averaged, weighted by their examples."""
    total = sum(n for n, _ in results)
    return {key: sum(n * float(m[key]) for n, m in results) / total
            for key in ("loss", "accuracy") if total and all(key in m for _, m in results)}


def _aborted(client_manager: Any) -> bool:
    return isinstance(client_manager, BoundedClientManager) and client_manager.aborted.is_set()


def _describe_failure(failure: Any) -> str:
    if isinstance(failure, BaseException):
        return f"{type(failure).__name__}: {failure}".strip().rstrip(":")
    _, res = failure
    return f"client returned status {res.status.code.name}: {res.status.message}"


class FederationAborted(Exception):
    """Raised inside Flower's round loop once the federation was aborted: the rounds left are not run."""


class _AbortableServer(Server):
    def fit_round(self, server_round: int, timeout: float | None) -> Any:
        if _aborted(self.client_manager()):
            raise FederationAborted(f"aborted before round {server_round}")
        return super().fit_round(server_round, timeout)


class FederationServer:
    """A Flower gRPC server on ``address`` (``host:port``) running ``strategy`` for ``rounds``.
    ``start()`` listens, ``wait_for_clients`` blocks until ``n`` connected (bounded), ``run()``
    trains, ``abort()`` (any thread) makes the rounds left end at once, ``stop()`` closes it."""

    def __init__(self, address: str, strategy: RecordingFedAvg, *, round_timeout: float,
                 client_wait: float = 30.0) -> None:
        self.address = address
        self.strategy = strategy
        self.round_timeout = round_timeout
        self.client_manager = BoundedClientManager(client_wait)
        self.server = _AbortableServer(client_manager=self.client_manager, strategy=strategy)
        self._grpc: Any = None

    def start(self) -> None:
        self._grpc = start_grpc_server(client_manager=self.client_manager, server_address=self.address)

    def wait_for_clients(self, count: int, timeout: float) -> bool:
        """Block until ``count`` clients connected (True), ``timeout`` passed or ``abort()`` (False)."""
        return self.client_manager.wait_until(count, timeout)

    def run(self, rounds: int) -> list[RoundReport]:
        """Run the rounds (fewer once aborted); the reports of those that ran."""
        with contextlib.suppress(FederationAborted):
            self.server.fit(num_rounds=rounds, timeout=self.round_timeout)
        self.strategy.finish_round(len(self.strategy.rounds))
        return self.strategy.rounds

    def abort(self) -> None:
        self.client_manager.aborted.set()

    def stop(self) -> None:
        """Tell the connected clients to leave, then close the port."""
        if self._grpc is not None:
            try:
                self.server.disconnect_all_clients(timeout=5)
            finally:
                # Until gRPC's own threads are done: a process exiting meanwhile aborts in C++
                # ("terminate called without an active exception").
                self._grpc.stop(grace=1).wait(10)
                self._grpc = None
