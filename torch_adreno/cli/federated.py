"""``federated``: federated learning with Flower on the digits (a local federation, a server or a client).

Flower is an optional dependency (the ``federated`` extra): it is imported when the command runs,
with a clear error where it is missing, and after telemetry is turned off."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from tqdm import tqdm

from torch_adreno.cli.arguments import (
    add_device_argument,
    address,
    positive_float,
    positive_int,
    refuse_bad_device,
    seed_int,
    share,
)


def register(sub: argparse._SubParsersAction) -> None:
    federated = sub.add_parser(
        "federated", help="federated learning with Flower: a local federation on the digits, or a server or client")
    federated.add_argument("--role", choices=("local", "server", "client"), default="local",
                           help="local: a server and --clients client processes on this machine over loopback; "
                                "server: the server alone, for clients elsewhere; client: one client "
                                "(default: %(default)s)")
    federated.add_argument("--clients", type=positive_int, default=3, help="clients in the federation (default: %(default)s)")
    federated.add_argument("--rounds", type=positive_int, default=5, help="FedAvg rounds (default: %(default)s)")
    federated.add_argument("--epochs", type=positive_int, default=2, help="local epochs per round (default: %(default)s)")
    federated.add_argument("--batch-size", type=positive_int, default=32, help="digits per step (default: %(default)s)")
    federated.add_argument("--lr", type=positive_float, default=2e-3, help="Adam's learning rate (default: %(default)s)")
    federated.add_argument("--skew", type=share, default=0.9,
                           help="share of each digit's examples held by the client that owns it; 1/clients is "
                                "IID, 1 gives each client only its own digits (default: %(default)s)")
    federated.add_argument("--seed", type=seed_int, default=0, help="initial weights and data split (default: %(default)s)")
    federated.add_argument("--optimizer-state", choices=("reset", "keep"), default="reset",
                           help="Adam's state at the start of a round: zeroed, or kept from the last round "
                                "(default: %(default)s)")
    add_device_argument(federated)
    federated.add_argument("--no-zero-copy", action="store_true",
                           help="copy parameters to the device even on unified memory (shows the bytes moved)")
    federated.add_argument("--address", type=address, default=None,
                           help="where the server listens (default: 127.0.0.1 and a free port; a server for "
                                "other machines: 0.0.0.0:PORT)")
    federated.add_argument("--server", type=address, default=None, help="the server a client connects to, HOST:PORT")
    federated.add_argument("--client-index", type=seed_int, default=None,
                           help="which share of the digits a client trains on, 0..clients-1")
    federated.add_argument("--round-timeout", type=positive_float, default=300.0,
                           help="seconds a round waits for its clients (default: %(default)s)")
    federated.add_argument("--timeout", type=positive_float, default=1800.0,
                           help="seconds the whole federation may take (default: %(default)s)")
    federated.add_argument("--connect-timeout", type=positive_float, default=60.0,
                           help="seconds a client keeps trying to reach the server (default: %(default)s)")
    federated.add_argument("--fail-client", action="append", default=[], metavar="CLIENT:ROUND",
                           help="fault injection: that client's process exits halfway through that round")
    federated.add_argument("--fail-at-round", type=positive_int, default=None, help=argparse.SUPPRESS)
    federated.add_argument("--exit-with-parent", action="store_true", help=argparse.SUPPRESS)
    federated.set_defaults(fn=cmd_federated)


def cmd_federated(args: argparse.Namespace) -> int:
    # Flower reports usage to its developers unless told not to; our runs have no business calling
    # out (the variable is read when flwr is imported; a setting of the user's own wins).
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    try:
        import flwr  # noqa: F401
    except ImportError:
        print("error: the federated command needs Flower: pip install 'torch-adreno[federated]'", file=sys.stderr)
        return 2
    # Flower logs every step of every round at INFO; the rounds' summaries below say what matters.
    logging.getLogger("flwr").setLevel(logging.WARNING)
    from torch_adreno.federated import (
        FederationSettings,
        RoundReport,
        format_round,
        free_port,
        run_client,
        run_federation,
    )

    if args.role != "server" and refuse_bad_device(args.device):
        return 2
    fail_at = {}
    for spec in args.fail_client:
        index, _, round_ = spec.partition(":")
        if not (index.isdigit() and round_.isdigit() and int(index) < args.clients and int(round_) >= 1):
            print(f"error: --fail-client expects CLIENT:ROUND with CLIENT < {args.clients} and ROUND >= 1, "
                  f"got {spec!r}", file=sys.stderr)
            return 2
        fail_at[int(index)] = int(round_)
    if args.fail_at_round is not None and args.client_index is not None:
        fail_at[args.client_index] = args.fail_at_round
    settings = FederationSettings(
        clients=args.clients, rounds=args.rounds, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
        skew=args.skew, seed=args.seed, optimizer_state=args.optimizer_state, device=args.device,
        zero_copy=False if args.no_zero_copy else None, round_timeout=args.round_timeout, timeout=args.timeout,
        fail_at=fail_at)
    if args.role == "client":
        if args.server is None or args.client_index is None:
            print("error: --role client needs --server HOST:PORT and --client-index", file=sys.stderr)
            return 2
        if args.client_index >= args.clients:
            print(f"error: --client-index {args.client_index} is not below --clients {args.clients}", file=sys.stderr)
            return 2
        run_client(settings, args.client_index, args.server, connect_timeout=args.connect_timeout,
                   exit_with_parent=args.exit_with_parent)
        return 0

    from torch_adreno.federated.data import digits_partitions

    partitions, _, y_test = digits_partitions(args.clients, args.skew, args.seed)
    for i, p in enumerate(partitions):
        print(f"client {i}: {len(p.y_train)} training digits, per digit 0-9: {p.label_counts()}")
    listen = args.address or f"127.0.0.1:{free_port()}"
    bar = tqdm(total=args.rounds, desc="federated rounds", unit="round")

    def on_round(report: RoundReport) -> None:
        bar.write(format_round(report, args.clients))
        bar.update(1)

    def terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # a kill stops the clients and the server as a Ctrl-C does

    signal.signal(signal.SIGTERM, terminate)
    try:
        result = run_federation(settings, listen, spawn_clients=args.role == "local", on_round=on_round,
                                on_event=bar.write)
    except KeyboardInterrupt:
        bar.close()
        print("interrupted: the server and every client process were stopped", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        # Everything this command started is stopped; what is left are gRPC's C++ threads, which
        # an interrupted server leaves in a state where the interpreter's exit aborts the process
        # ("terminate called without an active exception", status -6) one time in a few. Exit
        # without that teardown, with the status of an interrupt.
        os._exit(130)
    bar.close()
    accuracy = result.final_accuracy
    print(f"final global test accuracy: {'n/a' if accuracy is None else f'{accuracy:.2%}'} on {len(y_test)} "
          f"held-out digits after {len(result.rounds)} rounds"
          + (f"; {len(result.client_exits)} client(s) failed" if result.client_exits else "")
          + ("; stopped at the time limit" if result.timed_out else ""))
    return 0 if accuracy is not None and not result.timed_out else 1
