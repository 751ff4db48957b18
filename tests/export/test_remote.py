"""The step server (``torch-adreno-step serve``, native/PROTOCOL.md) and its client
(``torch_adreno.remote``), on loopback over a CPU OpenCL runtime. The server under test is the
AddressSanitizer + UBSan build (leaks included), stopped at the end with SIGTERM: a clean exit and a
quiet sanitizer are asserted then. Remote steps give the native library's and the Python runner's
losses bit for bit; state reads and writes round-trip; a learning rate set remotely trains as the
file with that rate; bad, hostile and half-sent messages get error replies or a closed connection,
and the next client is served; a server off loopback needs a token."""

from __future__ import annotations

import dataclasses
import random
import re
import signal
import socket
import struct
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from native_fixtures import SANITIZER_OPTIONS, damage_message, damaged_copies, view_and_copy_step

from torch_adreno.cli import main as cli_main
from torch_adreno.cli.native import NativeBuild
from torch_adreno.export.data_file import load_batches
from torch_adreno.remote import (
    NativeStep,
    RemoteConnectionError,
    RemoteDevice,
    RemoteServerError,
    RemoteTimeout,
    device_profile,
    parse_remote,
    protocol,
)
from torch_adreno.remote.protocol import Message
from torch_adreno.runner import StepRunner, choose_device, integrity
from torch_adreno.runner import format as fmt

pytestmark = pytest.mark.device


@dataclass
class Server:
    process: subprocess.Popen
    port: int
    log: Path

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")


def start_server(build: NativeBuild, environment: dict[str, str], folder: Path, *args: str,
                 sanitized: bool = False, extra_env: dict[str, str] | None = None) -> Server:
    """``serve --port 0 ARGS``; waits for its "listening on HOST:PORT" line."""
    env = dict(environment, **(SANITIZER_OPTIONS if sanitized else {}), **(extra_env or {}))
    log = folder / f"server-{len(list(folder.glob('server-*.log')))}.log"
    process = subprocess.Popen([str(build.executable), "serve", "--port", "0", *args], stdout=subprocess.PIPE,
                               stderr=log.open("w"), text=True, env=env)
    assert process.stdout is not None
    line = process.stdout.readline()
    found = re.match(r"listening on (\S+):(\d+) ", line)
    if found is None:
        process.wait(timeout=30)
        pytest.fail(f"the server did not start: {line!r} {log.read_text()[-3000:]}")
    return Server(process, int(found.group(2)), log)


def stop(server: Server) -> str:
    """SIGTERM, a clean exit, no sanitizer report; the server's log."""
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=60) == 0, server.stderr()[-4000:]
    log = server.stderr()
    assert "Sanitizer" not in log and "runtime error" not in log, log[-4000:]
    return log


@pytest.fixture(scope="module")
def server(sanitized, environment, platforms, tmp_path_factory) -> Iterator[Server]:
    """The sanitized server on the first CPU runtime found, its program cache of its own."""
    folder = tmp_path_factory.mktemp("server")
    running = start_server(sanitized, environment, folder, "--device", platforms[0], "--cache-dir",
                           str(folder / "cache"), "--io-timeout-s", "5", "--max-message-mib", "64", sanitized=True)
    try:
        yield running
        stop(running)
    finally:
        running.process.kill()


@pytest.fixture
def opencl_library(environment, monkeypatch) -> None:
    """NativeStep in this process loads the OpenCL library pyopencl loaded."""
    monkeypatch.setenv("TORCH_ADRENO_OPENCL_LIBRARY", environment["TORCH_ADRENO_OPENCL_LIBRARY"])


def bits(losses: list[float]) -> list[int]:
    return [int(np.float32(loss).view(np.uint32)) for loss in losses]


def rows(data: Path, count: int) -> list[list[np.ndarray]]:
    batches = load_batches(data)
    names = sorted(batches)
    return [[batches[name][i % len(batches[names[0]])] for name in names] for i in range(count)]


class Raw:
    """A client speaking frames by hand."""

    def __init__(self, port: int) -> None:
        self.socket = socket.create_connection(("127.0.0.1", port), timeout=30)

    def send(self, data: bytes) -> None:
        self.socket.sendall(data)

    def reply(self) -> tuple[int, bytes] | None:
        """The next frame's type and payload; None when the server closed the connection."""
        try:
            header = self._exactly(protocol.HEADER.size)
            if header is None:
                return None
            _, _, kind, length = protocol.HEADER.unpack(header)
            payload = self._exactly(length)
            return None if payload is None else (kind, payload)
        except ConnectionResetError:
            return None

    def _exactly(self, count: int) -> bytes | None:
        data = b""
        while len(data) < count:
            chunk = self.socket.recv(count - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    def request(self, message: int, payload: bytes = b"") -> tuple[int, bytes] | None:
        self.send(protocol.frame(message, payload))
        return self.reply()

    def hello(self) -> None:
        kind, _ = self.request(Message.HELLO, protocol.text(""))  # type: ignore[misc]
        assert kind == Message.HELLO | protocol.REPLY

    def closed(self) -> bool:
        return self.reply() is None

    def close(self) -> None:
        self.socket.close()


def error_of(reply: tuple[int, bytes] | None) -> tuple[int, str]:
    assert reply is not None and reply[0] == protocol.ERROR, reply
    reader = protocol.Reader(reply[1])
    (code,) = reader.unpack("I")
    return code, reader.text()


# -- the device and its profile ----------------------------------------------------------------------

def test_remote_properties_make_the_local_runtimes_device_profile(server, platforms) -> None:
    from torch_adreno.runtime import get_runtime

    with RemoteDevice("127.0.0.1", server.port) as device:
        assert device.hello["protocol"] == protocol.VERSION and device.hello["server"].startswith("torch-adreno-step")
        assert device.limits["max_message_bytes"] == 64 << 20
        properties = device.properties()
    remote, local = device_profile(properties), get_runtime(platforms[0]).profile
    # The image alignments (OpenCL 2.0 queries) pyopencl cannot make, so the local profile holds 0
    # for them ("not reported"); the server asks the driver itself.
    unread = {name: getattr(remote, name) for name in ("image_pitch_alignment", "image_base_address_alignment")
              if getattr(local, name) == 0}
    assert remote == dataclasses.replace(local, **unread)
    assert properties["opencl_c_version"].startswith("OpenCL C") and properties["unusable"] == ""


def test_parse_remote() -> None:
    assert parse_remote("remote:127.0.0.1:5555") == ("127.0.0.1", 5555)
    assert parse_remote(" REMOTE:phone.local:80 ") == ("phone.local", 80)
    assert parse_remote("remote:[::1]:7000") == ("::1", 7000)
    assert parse_remote("Intel(R) OpenCL") is None and parse_remote("0") is None and parse_remote(1) is None
    for bad in ("remote:host", "remote:host:0", "remote:host:99999", "remote::5555"):
        with pytest.raises(ValueError, match="remote:HOST:PORT"):
            parse_remote(bad)


def test_devices_lists_the_remote_device(server, platforms, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TORCH_ADRENO_DEVICE", f"remote:127.0.0.1:{server.port}")
    assert cli_main(["devices"]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"^R remote:127\.0\.0\.1:{server.port}: {re.escape(platforms[0])}: ", out, re.MULTILINE), out
    assert "work-group <=" in out.split("\n[")[0] and "R = the remote device" in out
    monkeypatch.setenv("TORCH_ADRENO_DEVICE", "remote:127.0.0.1:1")
    assert cli_main(["devices"]) == 1
    assert "no step server at 127.0.0.1:1" in capsys.readouterr().out


# -- training through the server ------------------------------------------------------------------------

def test_30_remote_steps_are_the_native_librarys_and_the_python_runners_bit_for_bit(
        server, native, platforms, exported, opencl_library) -> None:
    step, data = exported("mlp")
    batches = rows(data, 30)
    with RemoteDevice("127.0.0.1", server.port) as device:
        remote = device.load_step(step)
        assert [b["name"] for b in remote.batch_inputs] == ["batch_0", "batch_1"]
        theirs = [remote.step(*batch) for batch in batches[:25]] + remote.run(batches[25:])  # one message, 5 steps
        remote_state = remote.read_state()
    with NativeStep(native.library, step, device=platforms[0]) as local:
        ours = [local.step(*batch) for batch in batches]
        local_state = local.read_state()
    with NativeStep(native.library, step, device=platforms[0], fill_uninitialized_memory=True) as filled:
        assert bits([filled.step(*batch) for batch in batches]) == bits(ours)  # (fills change no bit)
    runner = StepRunner.load(step, choose_device(platforms[0]))
    python = [runner.step(*batch) for batch in batches]
    assert bits(theirs) == bits(ours) == bits(python)
    runner_state = runner.state()
    assert remote_state.keys() == local_state.keys() == runner_state.keys()
    for name, value in runner_state.items():
        assert remote_state[name].dtype == value.dtype and np.array_equal(remote_state[name], value), name
        assert np.array_equal(local_state[name], value), name


def test_state_reads_and_writes_round_trip_and_a_bad_write_changes_nothing(server, exported) -> None:
    step, _ = exported("mlp")
    with RemoteDevice("127.0.0.1", server.port) as device:
        remote = device.load_step(step)
        state = remote.read_state()
        assert {entry["name"] for entry in remote.state_layout} == set(state)
        changed = {"fc1.weight": state["fc1.weight"] * np.float32(0.5),
                   "optimizer.fc1.weight.momentum_buffer": np.full_like(state["fc1.weight"], 0.25)}
        remote.write_state(changed)
        after = remote.read_state(list(changed))
        assert all(np.array_equal(after[name], value) for name, value in changed.items())
        with pytest.raises(RemoteServerError, match=r"fc2.weight is dtype 0 of rank 2 .* got dtype 0 of rank 1") as err:
            remote.write_state({"fc1.bias": state["fc1.bias"] + 1, "fc2.weight": state["fc2.weight"].reshape(-1)})
        assert err.value.code == 1
        assert np.array_equal(remote.read_state(["fc1.bias"])["fc1.bias"], state["fc1.bias"])  # all or nothing
        with pytest.raises(RemoteServerError, match="the step has no state tensor 'nope'"):
            remote.read_state(["nope"])


def test_a_learning_rate_set_remotely_trains_as_the_file_with_that_rate(server, platforms, exported, tmp_path) -> None:
    step, data = exported("mlp")
    batches = rows(data, 4)
    model = onnx.load(str(step))
    lr = next(t for t in model.graph.initializer if t.name == "lr")
    lr.CopyFrom(onnx.numpy_helper.from_array(np.array(0.2, dtype=onnx.numpy_helper.to_array(lr).dtype), "lr"))
    faster = tmp_path / "lr02.onnx"
    onnx.save(integrity.seal(model), str(faster))
    runner = StepRunner.load(faster, choose_device(platforms[0]))
    expected = [runner.step(*b) for b in batches]
    default_runner = StepRunner.load(step, choose_device(platforms[0]))
    default = [default_runner.step(*b) for b in batches]
    with RemoteDevice("127.0.0.1", server.port) as device:
        remote = device.load_step(step)
        remote.set_input("lr", 0.2)
        theirs = [remote.step(*b) for b in batches]
        with pytest.raises(RemoteServerError, match="SET_INPUT: the step has no state tensor learning_rate"):
            remote.set_input("learning_rate", 0.1)
    assert bits(theirs) == bits(expected)
    assert bits(theirs[1:]) != bits(default[1:])  # (the first loss comes before any update)


def test_profile_reports_phases_and_every_operations_device_time(server, exported) -> None:
    step, data = exported("mlp")
    nodes = [n.name for n in onnx.load(str(step), load_external_data=False).graph.node if n.domain == fmt.DOMAIN]
    with RemoteDevice("127.0.0.1", server.port) as device:
        remote = device.load_step(step, profile=True)
        remote.run(rows(data, 3))
        profile = remote.profile(reset=True)
        assert profile["profiled"] and profile["last_step"]["wait_ms"] > 0
        timed = profile["operations"]
        assert [row["name"] for row in timed] == nodes[:remote.layout["operations"]]
        assert all(row["runs"] == 3 for row in timed) and sum(row["milliseconds"] for row in timed) > 0
        assert all(row["runs"] == 0 for row in remote.profile()["operations"])  # reset
        plain = device.load_step(step)
        assert plain.profile()["operations"] == [] and not plain.profile()["profiled"]


# -- what the server refuses ------------------------------------------------------------------------------

def test_bad_messages_get_an_error_reply_naming_what_is_wrong(server, exported) -> None:
    step, _ = exported("mlp")
    raw = Raw(server.port)
    assert error_of(raw.request(Message.PROPERTIES))[0] == 104 and raw.closed()  # no HELLO first
    raw = Raw(server.port)
    raw.send(b"GET / HTTP/1.1\r\n\r\n")
    code, message = error_of(raw.reply())
    assert code == 102 and "no TASP magic" in message and raw.closed()
    raw = Raw(server.port)
    raw.send(protocol.HEADER.pack(protocol.MAGIC, 2, Message.HELLO, 0))
    code, message = error_of(raw.reply())
    assert code == 103 and "protocol version 2; this server speaks version 1" in message and raw.closed()
    raw = Raw(server.port)
    raw.send(protocol.HEADER.pack(protocol.MAGIC, 1, Message.LOAD_STEP, 1 << 40))
    code, message = error_of(raw.reply())
    assert code == 101 and "at most 67108864 (--max-message-mib)" in message and raw.closed()

    raw = Raw(server.port)
    assert error_of(raw.request(Message.HELLO, protocol.text("") + b"x"))[0] == 100 and raw.closed()
    raw = Raw(server.port)
    raw.hello()
    assert error_of(raw.request(Message.RUN, struct.pack("<I", 1)))[0] == 105  # no step loaded
    assert error_of(raw.request(77))[:1] == (106,)
    code, message = error_of(raw.request(Message.LOAD_STEP, struct.pack("<I", 0) + b"not a model"))
    assert code == 3 and "is not a valid ONNX model" in message
    assert error_of(raw.request(Message.LOAD_STEP, struct.pack("<I", 2) + step.read_bytes()))[0] == 100  # flags
    kind, _ = raw.request(Message.LOAD_STEP, struct.pack("<I", 0) + step.read_bytes())  # type: ignore[misc]
    assert kind == Message.LOAD_STEP | protocol.REPLY
    code, message = error_of(raw.request(Message.RUN, struct.pack("<I", 2) + bytes(1000)))
    assert code == 100 and "2 steps of 402432 batch bytes each" in message and "got 1000" in message
    assert error_of(raw.request(Message.RUN, struct.pack("<I", 0)))[0] == 100
    assert error_of(raw.request(Message.READ_STATE, struct.pack("<I", 1000)))[0] == 100
    assert error_of(raw.request(Message.READ_STATE, struct.pack("<I", 1) + struct.pack("<I", 50) + b"ab"))[0] == 100
    assert error_of(raw.request(Message.SET_INPUT, protocol.text("lr")))[0] == 100
    assert error_of(raw.request(Message.PROFILE, b"\x01\x02"))[0] == 100
    kind, payload = raw.request(Message.PROPERTIES)  # type: ignore[misc]
    assert kind == Message.PROPERTIES | protocol.REPLY and b'"max_alloc_bytes"' in payload  # still served
    raw.close()


def test_a_damaged_step_file_is_refused_by_the_server_naming_the_part(server, exported, tmp_path) -> None:
    step, data = exported("mlp")
    with RemoteDevice("127.0.0.1", server.port) as device:
        for damaged, what in damaged_copies(step, tmp_path).values():
            with pytest.raises(RemoteServerError, match=damage_message(None, what)):
                device.load_step(damaged)
        remote = device.load_step(step)  # the same connection serves the sound file
        assert np.isfinite(remote.step(*rows(data, 1)[0]))


def test_a_client_gone_mid_message_or_mid_step_leaves_the_server_serving_the_next(server, exported) -> None:
    step, data = exported("mlp")
    raw = Raw(server.port)
    raw.hello()
    raw.send(protocol.HEADER.pack(protocol.MAGIC, 1, Message.RUN, 1000) + bytes(10))  # half a frame
    raw.close()
    raw = Raw(server.port)
    raw.hello()
    raw.send(protocol.frame(Message.LOAD_STEP, struct.pack("<I", 0) + step.read_bytes()))
    assert raw.reply()[0] == Message.LOAD_STEP | protocol.REPLY  # type: ignore[index]
    batch = b"".join(np.ascontiguousarray(a).tobytes() for a in rows(data, 1)[0])
    raw.send(protocol.frame(Message.RUN, struct.pack("<I", 20) + batch * 20))  # 20 steps, and gone
    raw.close()
    raw = Raw(server.port)
    raw.send(protocol.HEADER.pack(protocol.MAGIC, 1, Message.HELLO, 8)[:9])  # half a header
    raw.close()
    with RemoteDevice("127.0.0.1", server.port) as device:
        assert np.isfinite(device.load_step(step).step(*rows(data, 1)[0]))
    log = server.stderr()
    assert re.search(r"closed the connection inside a message \(10 of 1000 bytes\)", log), log[-3000:]
    assert re.search(r"closed the connection inside a frame header \(9 of 16 bytes\)", log), log[-3000:]


def test_a_second_client_is_told_the_server_is_busy(server) -> None:
    with RemoteDevice("127.0.0.1", server.port):
        with pytest.raises(RemoteServerError, match="busy: this server serves one client at a time") as err:
            RemoteDevice("127.0.0.1", server.port)
        assert err.value.code == 107
    with RemoteDevice("127.0.0.1", server.port) as device:  # served once the first has left
        assert device.properties()["name"]


def test_timeouts_and_a_dead_server_are_clear_errors(native, environment, platforms, exported, tmp_path) -> None:
    step, data = exported("mlp")
    with pytest.raises(RemoteConnectionError, match=r"no step server at 127\.0\.0\.1:1 .*torch-adreno-step serve"):
        RemoteDevice("127.0.0.1", 1)
    running = start_server(native, environment, tmp_path, "--device", platforms[0], "--no-cache")
    try:
        device = RemoteDevice("127.0.0.1", running.port, timeout=0.02)
        remote = device.load_step(step)
        with pytest.raises(RemoteTimeout, match=r"sent no reply to RUN within 0\.02 s; the connection is closed"):
            remote.run(rows(data, 10))  # (10 MLP steps: over 100 ms on a CPU device)
        assert not device.connected
        with pytest.raises(RemoteConnectionError, match="is closed: make a new RemoteDevice"):
            remote.step(*rows(data, 1)[0])
        device = RemoteDevice("127.0.0.1", running.port)  # (after the 10 steps: the server is serving again)
        remote = device.load_step(step)
        running.process.kill()
        running.process.wait(timeout=30)
        with pytest.raises(RemoteConnectionError, match=r"127\.0\.0\.1:\d+ (closed the connection|broke)"):
            remote.step(*rows(data, 1)[0])
    finally:
        running.process.kill()


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port on loopback that accepts connections (the kernel's backlog) and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


def test_a_port_that_accepts_and_never_answers_is_named_within_seconds(silent_port) -> None:
    start = time.perf_counter()
    with pytest.raises(RemoteTimeout, match=rf"127\.0\.0\.1:{silent_port} accepted the connection but no step "
                       rf"server greeted within 0\.5 s: is `torch-adreno-step serve --port {silent_port}`"):
        RemoteDevice("127.0.0.1", silent_port, reply_timeout=0.5)
    assert time.perf_counter() - start < 5


def test_a_training_step_on_a_silent_port_says_so_within_seconds(silent_port) -> None:
    """The default timeouts: a TrainingStep on remote:HOST:PORT names the address in seconds, not
    after the two minutes a step may take."""
    import torch

    import torch_adreno

    model = torch.nn.Linear(2, 2)
    start = time.perf_counter()
    with pytest.raises(RemoteTimeout, match=rf"127\.0\.0\.1:{silent_port} accepted the connection but no step"):
        torch_adreno.TrainingStep(model, lambda m, x: m(x).sum(), torch.optim.SGD(model.parameters(), lr=0.1),
                                  options={"device": f"remote:127.0.0.1:{silent_port}"})
    assert time.perf_counter() - start < 15


def test_a_server_off_loopback_needs_a_token(sanitized, environment, platforms, tmp_path, monkeypatch) -> None:
    done = subprocess.run([str(sanitized.executable), "serve", "--port", "0", "--host", "0.0.0.0"],
                          capture_output=True, text=True, env=dict(environment, **SANITIZER_OPTIONS), timeout=120)
    assert done.returncode == 2 and "0.0.0.0 is not a loopback address: serving it needs a token" in done.stderr
    running = start_server(sanitized, environment, tmp_path, "--host", "0.0.0.0", "--device", platforms[0],
                           sanitized=True, extra_env={"TORCH_ADRENO_SERVE_TOKEN": "s3cret"})
    try:
        for token, said in ((None, "no token given"), ("s3cre", "wrong token"), ("s3cret!", "wrong token")):
            with pytest.raises(RemoteServerError, match=said) as err:
                RemoteDevice("127.0.0.1", running.port, token=token)
            assert err.value.code == 104
        with RemoteDevice("127.0.0.1", running.port, token="s3cret") as device:
            assert device.properties()["name"]
        monkeypatch.setenv("TORCH_ADRENO_REMOTE_TOKEN", "s3cret")
        with RemoteDevice.from_spec(f"remote:127.0.0.1:{running.port}") as device:  # the token from the environment
            assert device.hello["protocol"] == 1
        stop(running)
    finally:
        running.process.kill()


# -- fuzzing ------------------------------------------------------------------------------------------------

def _corpus(step: bytes) -> list[tuple[int, bytes]]:
    """Valid requests on the hand-made step (one float32 [4, 3] batch input, state ``w``)."""
    batch = np.arange(12, dtype=np.float32).tobytes()
    return [
        (Message.PROPERTIES, b""),
        (Message.RUN, struct.pack("<I", 1) + batch),
        (Message.RUN, struct.pack("<I", 3) + batch * 3),
        (Message.READ_STATE, struct.pack("<I", 0)),
        (Message.READ_STATE, struct.pack("<I", 1) + protocol.text("w")),
        (Message.WRITE_STATE, protocol.state_payload({"w": np.array([2.5], np.float32)})),
        (Message.SET_INPUT, protocol.text("w") + struct.pack("<d", 1.5)),
        (Message.PROFILE, b"\x00"),
        (Message.HELLO, protocol.text("")),
        (Message.LOAD_STEP, struct.pack("<I", 0) + step),
        (Message.CLOSE, b""),
    ]


def _mutant(generator: random.Random, message: int, payload: bytes, step_size: int) -> tuple[bytes, bool]:
    """A mutated frame, and whether its header may claim more bytes than it carries (the sender
    then half-closes, so that the server sees the end rather than wait). LOAD_STEP's step file is
    cut short but never altered inside: a step runs the kernels it carries, and on a CPU device an
    altered kernel could write anywhere (the readers' own fuzz test covers altered files)."""
    kind = generator.randrange(8)
    if message == Message.LOAD_STEP:
        cut = generator.randrange(4, 4 + step_size)
        return protocol.frame(message, payload[:cut]), False
    data = bytearray(protocol.frame(message, payload))
    if kind == 0:  # flip bits in the payload
        for _ in range(generator.randint(1, 4)):
            if len(data) > protocol.HEADER.size:
                data[generator.randrange(protocol.HEADER.size, len(data))] ^= 1 << generator.randrange(8)
        return bytes(data), False
    if kind == 1:  # a random message type
        data[6:8] = struct.pack("<H", generator.choice([0, 10, 0x8001, 0xFFFF, generator.randrange(1 << 16)]))
        return bytes(data), False
    if kind == 2:  # counts and sizes in the payload replaced by extremes
        for _ in range(generator.randint(1, 2)):
            if len(data) >= protocol.HEADER.size + 4:
                at = generator.randrange(protocol.HEADER.size, len(data) - 3)
                data[at:at + 4] = struct.pack("<I", generator.choice([0, 1, 7, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF]))
        return bytes(data), False
    if kind == 3:  # the payload cut short, its header telling the truth
        cut = generator.randrange(0, len(payload) + 1)
        return protocol.frame(message, payload[:cut]), False
    if kind == 4:  # garbage after the fields
        return protocol.frame(message, payload + bytes(generator.randrange(256) for _ in range(generator.randint(1, 9)))), False
    if kind == 5:  # a lying length
        data[8:16] = struct.pack("<Q", generator.choice([len(payload) + 1, len(payload) + 100, 1 << 26, (1 << 64) - 1]))
        return bytes(data), True
    if kind == 6:  # random bytes
        return bytes(generator.randrange(256) for _ in range(generator.randint(1, 64))), True
    data[generator.randrange(0, 6)] ^= 0xFF  # magic or version broken
    return bytes(data), False


def test_a_thousand_fuzzed_messages_crash_nothing(server, tmp_path) -> None:
    step = tmp_path / "tiny.onnx"
    onnx.save(view_and_copy_step(), str(step))
    step_bytes = step.read_bytes()
    corpus = _corpus(step_bytes)
    generator = random.Random(49)
    sent = replies = closed = 0
    codes: Counter[int] = Counter()
    raw: Raw | None = None
    while sent < 1200:
        if raw is None:
            raw = Raw(server.port)
            raw.hello()
            assert raw.request(Message.LOAD_STEP, struct.pack("<I", 0) + step_bytes)[0] & protocol.REPLY  # type: ignore[index]
        message, payload = corpus[generator.randrange(len(corpus))]
        data, lying = _mutant(generator, message, payload, len(step_bytes))
        sent += 1
        try:
            raw.send(data)
            if lying:
                raw.socket.shutdown(socket.SHUT_WR)  # the server sees the end of a frame that lied
            reply = raw.reply()
        except OSError:  # (it closed the connection after the last reply: a mutant said CLOSE, say)
            reply = None
        if reply is not None and reply[0] == protocol.ERROR:
            codes[error_of(reply)[0]] += 1
        if reply is None or lying or message == Message.CLOSE:
            closed += 1
            raw.close()
            raw = None
        else:
            replies += 1
    if raw is not None:
        raw.close()
    assert replies > 600 and closed > 50, (replies, closed)
    assert {1, 3, 100, 101, 102, 103, 106} <= set(codes), codes  # refused for many reasons, each named
    with RemoteDevice("127.0.0.1", server.port) as device:  # still serving, the step still exact
        remote = device.load_step(step_bytes)
        x = np.arange(12, dtype=np.float32).reshape(4, 3)
        assert remote.step(x) == 2 * x[1:3].sum() + 0.5
    assert server.process.poll() is None
