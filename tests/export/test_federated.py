"""Federated learning with Flower on the replayed TrainingStep: the non-IID split, the client's
traffic per round, a 2-client federation over loopback, a client crash, Ctrl-C."""

from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

# Flower reads this when it is imported: tests never report usage.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
pytest.importorskip("flwr", reason="the federated extra (pip install '.[federated]') is not installed")

import torch_adreno
from torch_adreno.federated import (
    AdrenoClient,
    FederationSettings,
    digits_partitions,
    free_port,
    run_federation,
    split_indices,
    weights_digest,
)
from torch_adreno.models import LeNet

# -- the split (no device) -------------------------------------------------------------------------


def test_split_gives_every_example_to_one_client_and_most_of_a_digit_to_its_owner():
    labels = torch.arange(10).repeat_interleave(50)[torch.randperm(500, generator=torch.Generator().manual_seed(1))]
    parts = split_indices(labels, clients=3, skew=0.9, seed=0)
    assert sorted(torch.cat(parts).tolist()) == list(range(500))
    for digit in range(10):
        counts = [int((labels[p] == digit).sum()) for p in parts]
        assert counts[digit % 3] == 45 and sum(counts) == 50  # 90% with the owner, the rest dealt out
        assert all(abs(c - 2.5) <= 0.5 for i, c in enumerate(counts) if i != digit % 3)
    # The same seed gives the same split in every process (server and clients compute it apart).
    assert all(torch.equal(a, b) for a, b in zip(parts, split_indices(labels, 3, 0.9, 0), strict=True))
    iid = split_indices(labels, clients=2, skew=0.5, seed=0)
    assert all(int((labels[p] == d).sum()) == 25 for p in iid for d in range(10))


@pytest.mark.parametrize(("clients", "skew", "message"), [(0, 0.5, "at least 1 client"), (3, 1.5, r"skew in \[0, 1\]")])
def test_split_refuses_bad_settings(clients, skew, message):
    with pytest.raises(ValueError, match=message):
        split_indices(torch.arange(10), clients, skew, 0)


def test_command_refuses_bad_arguments(capsys):
    from torch_adreno.cli import main

    def refused(*args: str) -> str:
        try:
            status = main(["federated", *args])
        except SystemExit as exit_:  # argparse's own refusals
            status = exit_.code
        assert status == 2
        return capsys.readouterr().err

    assert "--fail-client expects CLIENT:ROUND with CLIENT < 2" in refused("--fail-client", "5:1", "--clients", "2")
    assert "--client-index 3 is not below --clients 3" in refused(
        "--role", "client", "--server", "127.0.0.1:1", "--client-index", "3", "--clients", "3")
    assert "--role client needs --server HOST:PORT and --client-index" in refused("--role", "client")
    assert "expected HOST:PORT" in refused("--address", "localhost")
    assert "expected a number in [0, 1]" in refused("--skew", "2")


# -- the client on the device ----------------------------------------------------------------------


@pytest.mark.device
def test_client_moves_weights_and_optimizer_state_once_per_round_not_per_step():
    # Steps of earlier tests still waiting for the collector would have their deferred host copies
    # made by this test's syncs, and counted here.
    gc.collect()
    partitions, _, _ = digits_partitions(clients=3, skew=0.9, seed=0)
    client = AdrenoClient(LeNet(), partitions[0], epochs=1, batch_size=64, options={"zero_copy": False})
    weights = [t.numpy().copy() for t in LeNet().state_dict().values()]
    weight_bytes = sum(w.nbytes for w in weights)
    for server_round in (1, 2, 3):
        with torch_adreno.profile() as prof:
            new_weights, examples, metrics = client.fit(weights, {"server_round": server_round})
        steps = len(partitions[0].y_train) // 64
        assert examples == steps * 64 and metrics["steps"] == steps
        # Round 1 compiles, then captures; later rounds capture once (new weights), then replay.
        assert metrics["replayed_steps"] == steps - (2 if server_round == 1 else 1)
        state = [v for s in client.optimizer.state.values() for v in s.values()]
        state_bytes = sum(v.numel() * v.element_size() for v in state)
        up = [t for t in prof.transfers if t.direction == "h2d" and t.reason == "parameter"]
        down = [t for t in prof.transfers if t.direction == "d2h" and t.reason == "synchronize"]
        # Weights and Adam's state go up once (the round's first step) and come down once (the sync
        # before they are returned), whatever the number of steps; per step only batch and loss move.
        assert sum(t.nbytes for t in up) == weight_bytes + state_bytes, server_round
        assert len(up) == len(weights) + len(state)
        assert sum(t.nbytes for t in down) == weight_bytes + state_bytes
        assert len(down) == len(weights) + len(state)
        assert metrics["bytes_host_to_device"] == prof.bytes_host_to_device
        assert metrics["received_digest"] == weights_digest(weights)
        assert not any(np.array_equal(a, b) for a, b in zip(weights, new_weights, strict=True))
        weights = new_weights


@pytest.mark.device
def test_client_resets_or_keeps_adam_state_per_round():
    partitions, _, _ = digits_partitions(clients=3, skew=0.9, seed=0)
    weights = [t.numpy().copy() for t in LeNet().state_dict().values()]
    steps = len(partitions[1].y_train) // 64
    for mode, expected_steps in (("reset", steps), ("keep", 2 * steps)):
        client = AdrenoClient(LeNet(), partitions[1], epochs=1, batch_size=64, optimizer_state=mode)
        client.fit(weights, {"server_round": 1})
        client.fit(weights, {"server_round": 2})
        client.step.synchronize()
        counts = {int(s["step"]) for s in client.optimizer.state.values()}
        assert counts == {expected_steps}, mode


# -- federations over loopback -------------------------------------------------------------------


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.device
@pytest.mark.slow
def test_two_client_federation_averages_what_the_clients_returned():
    settings = FederationSettings(clients=2, rounds=2, epochs=1, batch_size=64, timeout=400, round_timeout=200)
    result = run_federation(settings, f"127.0.0.1:{free_port()}", spawn_clients=True)
    assert not result.timed_out and not result.client_exits
    assert [r.number for r in result.rounds] == [1, 2]
    received = weights_digest(result.initial_weights)
    for report in result.rounds:
        assert not report.failures
        assert [c.client_index for c in report.clients] == [0, 1]
        # Every client trained from the global weights of the round before (the initial ones first).
        assert all(c.metrics["received_digest"] == received for c in report.clients)
        assert all(int(c.metrics["replayed_steps"]) > 0 for c in report.clients)
        total = sum(c.num_examples for c in report.clients)
        assert report.global_weights is not None
        for i, aggregated in enumerate(report.global_weights):
            expected = sum(c.weights[i].astype(np.float64) * c.num_examples for c in report.clients) / total
            np.testing.assert_allclose(aggregated, expected, rtol=1e-5, atol=1e-7)
        assert not np.allclose(report.clients[0].weights[0], report.clients[1].weights[0])  # non-IID: they differ
        received = report.global_digest
        # The clients' evaluation on their devices, over test shares that together are the test set,
        # agrees with the server's eager evaluation of the same global weights.
        assert report.global_accuracy is not None and report.device_accuracy is not None
        assert abs(report.global_accuracy - report.device_accuracy) <= 2 / 359
    assert result.rounds[-1].global_accuracy > 0.5
    assert all(_gone(pid) for pid in result.client_pids)


@pytest.mark.device
@pytest.mark.slow
def test_federation_goes_on_without_a_client_that_crashed_mid_round():
    result = subprocess.run(
        [sys.executable, "-m", "torch_adreno", "federated", "--clients", "2", "--rounds", "2", "--epochs", "1",
         "--batch-size", "64", "--fail-client", "1:1", "--timeout", "400", "--round-timeout", "200"],
        capture_output=True, text=True, timeout=500, check=False)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    # Where it crashed: round 1's report lists the failure (the process exit itself is polled, so it
    # may be noticed in round 1 or 2).
    assert re.search(r"client 1 exited with status 3 \(noticed in round [12]\b", out), out
    assert re.search(r"round 1: global test accuracy [\d.]+%.*; 1 of 2 clients trained", out), out
    assert re.search(r"round 1:.*\n  client 0: .*\n  failed: ", out), out
    assert re.search(r"round 2: global test accuracy [\d.]+%.*; 1 of 2 clients trained", out), out
    assert "final global test accuracy" in out and "1 client(s) failed" in out
    pids = re.search(r"client processes ([\d, ]+)\)", out).group(1).split(", ")
    assert all(_gone(int(pid)) for pid in pids)


@pytest.mark.device
@pytest.mark.slow
def test_ctrl_c_stops_the_server_and_every_client():
    process = subprocess.Popen(
        [sys.executable, "-m", "torch_adreno", "federated", "--clients", "2", "--rounds", "50", "--epochs", "1",
         "--batch-size", "64", "--timeout", "400"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert process.stdout is not None
    seen = ""
    deadline = time.monotonic() + 300
    pids: list[int] = []
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        seen += line
        match = re.search(r"client processes ([\d, ]+)\)", line)
        if match:
            pids = [int(p) for p in match.group(1).split(", ")]
        if pids and "round 1:" in line:
            break
    assert pids and "round 1:" in seen, seen
    process.send_signal(signal.SIGINT)
    rest, _ = process.communicate(timeout=60)
    assert process.returncode == 130, seen + rest
    assert "interrupted: the server and every client process were stopped" in rest
    assert all(_gone(pid) for pid in pids)


@pytest.mark.device
@pytest.mark.slow
def test_federation_stops_everything_at_its_time_limit():
    settings = FederationSettings(clients=2, rounds=50, epochs=1, batch_size=64, timeout=25, round_timeout=200)
    started = time.monotonic()
    result = run_federation(settings, f"127.0.0.1:{free_port()}", spawn_clients=True)
    assert result.timed_out
    assert time.monotonic() - started < 25 + 45  # the limit, then stopping the clients and the server
    assert len(result.rounds) < 50 and not result.client_exits  # stopped, not crashed
    assert all(_gone(pid) for pid in result.client_pids)
