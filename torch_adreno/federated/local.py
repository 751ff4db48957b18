"""A federation on this machine (a Flower server and client processes over loopback), the server
on its own for clients elsewhere, and one client process: what ``python -m torch_adreno
federated`` runs.

Every process the local federation starts it also stops: clients run in their own sessions (a
Ctrl-C reaches only this process, which then stops them), they exit by themselves when this
process dies without cleaning up (:func:`~torch_adreno.federated.client.exit_with_parent`), and
whatever still runs at the end is terminated, then killed. A client that dies is reported with
its exit status and the end of its log, and the rounds go on with the others (FedAvg accepts
failures); the whole run is bounded by ``timeout``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from torch_adreno.federated.server import FederationServer, RecordingFedAvg, RoundReport


@dataclass
class FederationSettings:
    """Everything the server and every client must agree on, and the bounds of a run."""

    clients: int = 3
    rounds: int = 5
    epochs: int = 2  # local epochs per round
    batch_size: int = 32
    lr: float = 2e-3
    skew: float = 0.9  # share of a digit's examples its owner client holds (non-IID)
    seed: int = 0
    optimizer_state: str = "reset"
    device: str | int | None = None
    zero_copy: bool | None = None  # None: the backend's "auto"
    round_timeout: float = 300.0
    timeout: float = 1800.0  # the whole federation
    fail_at: dict[int, int] = field(default_factory=dict)  # client index -> round it crashes in (testing)

    def options(self) -> dict[str, object]:
        options: dict[str, object] = {}
        if self.device is not None:
            options["device"] = self.device
        if self.zero_copy is not None:
            options["zero_copy"] = self.zero_copy
        return options

    def client_arguments(self, index: int, server: str) -> list[str]:
        """The command line of client ``index`` connecting to ``server``."""
        args = ["federated", "--role", "client", "--server", server, "--client-index", str(index),
                "--clients", str(self.clients), "--epochs", str(self.epochs), "--batch-size", str(self.batch_size),
                "--lr", repr(self.lr), "--skew", repr(self.skew), "--seed", str(self.seed),
                "--optimizer-state", self.optimizer_state]
        if self.device is not None:
            args += ["--device", str(self.device)]
        if self.zero_copy is False:
            args.append("--no-zero-copy")
        if index in self.fail_at:
            args += ["--fail-at-round", str(self.fail_at[index])]
        return args


@dataclass
class ClientExit:
    index: int
    status: int
    #: The round in progress when the exit was noticed (polled: may be one after the crash's).
    during_round: int
    log_tail: str


@dataclass
class FederationResult:
    rounds: list[RoundReport]
    client_exits: list[ClientExit]  # clients that exited with a non-zero status, in order
    timed_out: bool
    initial_weights: list[np.ndarray]
    client_pids: list[int]  # of the client processes started here (all ended by now)

    @property
    def final_accuracy(self) -> float | None:
        done = [r.global_accuracy for r in self.rounds if r.global_accuracy is not None]
        return done[-1] if done else None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _model() -> torch.nn.Module:
    from torch_adreno.models import LeNet

    return LeNet()


def _host_evaluator(x: torch.Tensor, y: torch.Tensor) -> Callable[[list[np.ndarray]], tuple[float, float]]:
    """Loss and accuracy of weights on (x, y), with eager PyTorch on the host: the reference the
    server holds (it needs no device)."""
    model = _model().eval()

    def evaluate(weights: list[np.ndarray]) -> tuple[float, float]:
        keys = list(model.state_dict())
        model.load_state_dict({k: torch.from_numpy(np.asarray(w)) for k, w in zip(keys, weights, strict=True)})
        with torch.no_grad():
            logits = model(x)
        return float(F.cross_entropy(logits, y)), float((logits.argmax(1) == y).float().mean())

    return evaluate


def run_federation(settings: FederationSettings, address: str, *, spawn_clients: bool,
                   on_round: Callable[[RoundReport], None] | None = None,
                   on_event: Callable[[str], None] | None = None) -> FederationResult:
    """Serve ``settings.rounds`` rounds of FedAvg on ``address``; with ``spawn_clients``, start
    ``settings.clients`` client processes on this machine connecting to it (``address`` should
    then be a loopback one), else wait for clients from elsewhere. Returns when the rounds are done,
    all clients are gone, or ``settings.timeout`` passed, with every started process stopped."""
    from torch_adreno.federated.data import digits_partitions

    say = on_event or (lambda message: None)
    _, x_test, y_test = digits_partitions(settings.clients, settings.skew, settings.seed)
    torch.manual_seed(settings.seed)
    initial = [t.detach().numpy().copy() for t in _model().state_dict().values()]
    stopping = threading.Event()  # cut short: rounds that end meanwhile are not reported

    def report(round_: RoundReport) -> None:
        if on_round is not None and not stopping.is_set():
            on_round(round_)

    strategy = RecordingFedAvg(initial_weights=initial, local_epochs=settings.epochs,
                               evaluate_global=_host_evaluator(x_test, y_test), on_round=report)
    server = FederationServer(address, strategy, round_timeout=settings.round_timeout)
    deadline = time.monotonic() + settings.timeout
    processes: dict[int, subprocess.Popen[bytes]] = {}
    logs: dict[int, Path] = {}
    pids: list[int] = []
    exits: list[ClientExit] = []
    stop_watching = threading.Event()
    timed_out = threading.Event()
    log_dir = tempfile.TemporaryDirectory(prefix="torch_adreno_federated_")

    def watch() -> None:
        """Report clients that die, and end the federation when none is left or time is up."""
        while not stop_watching.wait(0.5):
            for index, process in list(processes.items()):
                status = process.poll()
                if status is None:
                    continue
                del processes[index]
                if status != 0:
                    exit_ = ClientExit(index, status, len(strategy.rounds), _tail(logs[index]))
                    exits.append(exit_)
                    say(f"client {index} exited with status {status} (noticed in round {exit_.during_round}: the exit is "
                        "polled, so a crash late in a round may be noticed in the next); "
                        f"the federation goes on with the others. Its log ends:\n{exit_.log_tail}")
            if spawn_clients and not processes:
                server.abort()
            if time.monotonic() > deadline:
                timed_out.set()
                say(f"the federation ran past its time limit ({settings.timeout:g} s): stopping it")
                server.abort()
                _stop(processes)
                processes.clear()  # stopped here: not crashes to report
                return

    watcher = threading.Thread(target=watch, name="federation-watch", daemon=True)
    runner: threading.Thread | None = None
    try:
        server.start()
        if spawn_clients:
            env = dict(os.environ)
            for index in range(settings.clients):
                logs[index] = Path(log_dir.name) / f"client{index}.log"
                with open(logs[index], "wb") as log:
                    processes[index] = subprocess.Popen(
                        [sys.executable, "-m", "torch_adreno", *settings.client_arguments(index, address),
                         "--exit-with-parent"],
                        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                        start_new_session=True)  # a Ctrl-C here must not reach them: we stop them
                pids.append(processes[index].pid)
        watcher.start()
        started = f" (client processes {', '.join(map(str, pids))})" if pids else ""
        say(f"server on {address}: waiting for {settings.clients} clients{started}")
        if not server.wait_for_clients(settings.clients, deadline - time.monotonic()):
            if not processes and spawn_clients:
                say("no client is left to wait for")
            else:
                say(f"only {server.client_manager.num_available()} of {settings.clients} clients connected "
                    "in time; training with those")
        # Flower waits for a round's fits in a thread pool that a KeyboardInterrupt cannot cut short
        # (its shutdown waits for every fit): the rounds run in a thread of their own, and this
        # one, which gets the interrupt, stops the clients and the server, which ends them at once.
        outcome: list[BaseException | None] = []

        def serve() -> None:
            try:
                server.run(settings.rounds)
                outcome.append(None)
            except BaseException as err:  # handed to the caller below
                outcome.append(err)

        runner = threading.Thread(target=serve, name="federation-rounds", daemon=True)
        runner.start()
        while runner.is_alive():
            runner.join(0.2)
        if outcome and outcome[0] is not None:
            raise outcome[0]
    finally:
        stop_watching.set()
        if watcher.is_alive():
            watcher.join()
        server.abort()
        # Done: the server tells the clients to leave, then what has not left is stopped. Cut short
        # (Ctrl-C, an error): the clients are stopped first, which ends the fits the rounds wait for.
        cut_short = runner is None or runner.is_alive()
        if cut_short:
            stopping.set()
        try:
            if cut_short:
                _stop(processes)
        finally:
            try:
                server.stop()
            finally:
                _stop(processes, grace=10.0)
                if runner is not None:
                    runner.join(timeout=30.0)
                log_dir.cleanup()
    return FederationResult(strategy.rounds, exits, timed_out.is_set(), initial, pids)


def _tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(f"    {line}" for line in text[-lines:])


def _stop(processes: dict[int, subprocess.Popen[bytes]], grace: float = 5.0) -> None:
    """Terminate, then kill, what still runs of ``processes`` (each in its own session)."""
    for process in processes.values():
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    ends = time.monotonic() + grace
    for process in processes.values():
        try:
            process.wait(timeout=max(0.1, ends - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_client(settings: FederationSettings, index: int, server: str, *, connect_timeout: float = 60.0,
               exit_with_parent: bool = False) -> None:
    """Client ``index`` of ``settings.clients``: its share of the digits, trained on this device,
    connected to ``server`` until the server ends the federation."""
    from flwr.compat.client.app import start_client

    from torch_adreno.federated.client import AdrenoClient
    from torch_adreno.federated.client import exit_with_parent as watch_parent
    from torch_adreno.federated.data import digits_partitions

    if exit_with_parent:
        watch_parent()
    if not 0 <= index < settings.clients:
        raise ValueError(f"client index {index} is not in 0..{settings.clients - 1}")
    partitions, _, _ = digits_partitions(settings.clients, settings.skew, settings.seed)
    torch.manual_seed(settings.seed + 1 + index)
    client = AdrenoClient(_model(), partitions[index], client_index=index, epochs=settings.epochs,
                          batch_size=settings.batch_size, lr=settings.lr, optimizer_state=settings.optimizer_state,
                          options=settings.options(), seed=settings.seed,
                          fail_at_round=settings.fail_at.get(index))
    start_client(server_address=server, client=client.to_client(), insecure=True,
                 max_wait_time=connect_timeout)


def format_round(report: RoundReport, clients: int) -> str:
    """What the federated command prints for a round: the global accuracy, each client's metrics."""
    accuracy = "n/a" if report.global_accuracy is None else f"{report.global_accuracy:.2%}"
    on_device = "" if report.device_accuracy is None else f", on the clients' devices {report.device_accuracy:.2%}"
    lines = [f"round {report.number}: global test accuracy {accuracy}{on_device}; "
             f"{len(report.clients)} of {clients} clients trained; weights sent {report.bytes_sent:,} B, "
             f"received {sum(c.bytes_received for c in report.clients):,} B"]
    for c in report.clients:
        m = c.metrics
        lines.append(
            f"  client {c.client_index}: {c.num_examples} examples, loss {float(m['loss']):.3f}, local accuracy "
            f"{float(m['accuracy']):.2%}, step {float(m['step_time_ms']):.1f} ms ({int(m['replayed_steps'])} of "
            f"{int(m['steps'])} steps replayed), device bytes h2d {int(m['bytes_host_to_device']):,} "
            f"d2h {int(m['bytes_device_to_host']):,} shared {int(m['bytes_shared']):,}, "
            f"weights up {c.bytes_received:,} B; ran on {m['devices']!s}")
    lines += [f"  failed: {f}" for f in report.failures]
    return "\n".join(lines)
