"""The desktop's side of the step server (``torch-adreno-step serve``, ``native/PROTOCOL.md``): a
connection to one remote OpenCL device, and the step loaded on it.

    with RemoteDevice("127.0.0.1", 5555) as device:       # adb forward tcp:5555 tcp:5555
        print(device.properties()["name"])
        step = device.load_step("step.onnx")
        loss = step.step(x, y)                             # numpy arrays in the step's batch order
        state = step.read_state()

One step per connection (a second load_step replaces the first); the server serves one client at a
time and answers another "busy". Every failure is a :class:`RemoteError`: the server's refusals
(:class:`RemoteServerError`, with its code), a reply that does not come in time
(:class:`RemoteTimeout`) and a connection that is gone (:class:`RemoteConnectionError`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from torch_adreno.remote import protocol
from torch_adreno.remote.protocol import Message

PREFIX = "remote:"
#: The token a client gives when none is passed (a server off loopback requires one).
TOKEN_VARIABLE = "TORCH_ADRENO_REMOTE_TOKEN"


class RemoteError(RuntimeError):
    """Anything that went wrong talking to a step server."""


class RemoteServerError(RemoteError):
    """The server refused a request: ``code`` (the C API's status, or the protocol's) and its words."""

    def __init__(self, code: int, message: str) -> None:
        self.code = code
        self.kind = protocol.ERROR_NAMES.get(code, f"error {code}")
        self.server_message = message
        super().__init__(f"step server: {message} ({self.kind} error)")


class RemoteTimeout(RemoteError, TimeoutError):
    """No reply within the timeout; the connection is closed (its stream is out of step)."""


class RemoteConnectionError(RemoteError, ConnectionError):
    """No server there, or the connection broke."""


def parse_remote(spec: str | int | None) -> tuple[str, int] | None:
    """``remote:HOST:PORT`` (``remote:[::1]:PORT`` for IPv6) as ``(host, port)``; None for any other
    device spec (an index, a local name). A remote spec without a valid port raises ValueError."""
    if not isinstance(spec, str) or not spec.strip().lower().startswith(PREFIX):
        return None
    rest = spec.strip()[len(PREFIX):]
    host, colon, port = rest.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"device {spec!r}: a remote device is remote:HOST:PORT (e.g. remote:127.0.0.1:5555, "
                         "the port of `torch-adreno-step serve --port P`)")
    return host, int(port)


#: The requests whose reply takes device work beyond copies: a step load (building the step's
#: programs, ``load_timeout``) and steps (``timeout``); every other reply is due at once
#: (``reply_timeout``), so a port that accepts and never answers is named within seconds.
_LONG_REQUESTS = (Message.LOAD_STEP, Message.RUN)


class RemoteDevice:
    """A connection to ``torch-adreno-step serve`` on ``host:port``, greeted (with ``token`` where
    the server wants one). Seconds allowed: ``connect_timeout`` to connect, ``reply_timeout`` for
    the greeting and every reply that needs no device work (properties, state, settings),
    ``timeout`` for steps (waiting for one recv: a long transfer that keeps coming does not time
    out) and ``load_timeout`` for a step load (it builds the step's programs on the device)."""

    def __init__(self, host: str, port: int, token: str | None = None, timeout: float = 120.0,
                 load_timeout: float = 900.0, connect_timeout: float = 10.0, reply_timeout: float = 10.0) -> None:
        self.address = f"{host}:{port}"
        self.timeout, self.load_timeout, self.reply_timeout = timeout, load_timeout, reply_timeout
        self._generation = 0
        try:
            self._socket: socket.socket | None = socket.create_connection((host, port), timeout=connect_timeout)
        except TimeoutError:
            raise RemoteTimeout(f"no step server answered at {self.address} within {connect_timeout} s") from None
        except OSError as error:
            raise RemoteConnectionError(
                f"no step server at {self.address} ({error.strerror or error}): start one on the device with "
                f"`torch-adreno-step serve --port {port}` (and `adb forward tcp:{port} tcp:{port}` for a phone)") from None
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self.hello: dict[str, Any] = json.loads(self._request(Message.HELLO, protocol.text(token or "")))
        except RemoteTimeout:
            raise RemoteTimeout(
                f"{self.address} accepted the connection but no step server greeted within {reply_timeout} s: is "
                f"`torch-adreno-step serve --port {port}` what listens there (and the adb forward to the phone's "
                "port, where one is used)?") from None
        #: The server's caps: max_message_bytes, max_steps_per_run, max_text_bytes.
        self.limits: dict[str, int] = self.hello["limits"]

    @classmethod
    def from_spec(cls, spec: str, token: str | None = None, **options: Any) -> RemoteDevice:
        """Connect to the device a ``remote:HOST:PORT`` spec names; ``token`` defaults to
        $TORCH_ADRENO_REMOTE_TOKEN."""
        address = parse_remote(spec)
        if address is None:
            raise ValueError(f"device {spec!r} is not a remote device (remote:HOST:PORT)")
        return cls(*address, token=token if token is not None else os.environ.get(TOKEN_VARIABLE), **options)

    def properties(self) -> dict[str, Any]:
        """The device's properties (name, vendor, driver, OpenCL version, compute units, work-group,
        memory and allocation limits, extensions, fp16, images, unified memory): see
        :func:`torch_adreno.remote.device_profile` for them as a DeviceProfile."""
        return json.loads(self._request(Message.PROPERTIES))

    def load_step(self, step: bytes | str | Path, profile: bool = False) -> RemoteStep:
        """Ship a step file (its bytes, or a path) and open it on the device; ``profile``: time every
        operation with OpenCL events (:meth:`RemoteStep.profile`). Replaces a step loaded before."""
        data = step if isinstance(step, bytes | bytearray | memoryview) else Path(step).read_bytes()
        payload = struct.pack("<I", 1 if profile else 0) + bytes(data)
        layout = json.loads(self._request(Message.LOAD_STEP, payload, self.load_timeout))
        self._generation += 1
        return RemoteStep(self, layout, self._generation)

    def close(self) -> None:
        """Say CLOSE (the server releases the step and serves its next client) and disconnect."""
        if self._socket is None:
            return
        try:
            self._request(Message.CLOSE, timeout=min(self.reply_timeout, 10.0))
        except RemoteError:
            pass  # (gone already: nothing left to release)
        finally:
            self._drop()

    def __enter__(self) -> RemoteDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def connected(self) -> bool:
        return self._socket is not None

    # -- frames ----------------------------------------------------------------------------------

    def _drop(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def _receive(self, count: int, doing: str) -> bytes:
        assert self._socket is not None
        chunks, left = [], count
        while left:
            chunk = self._socket.recv(min(left, 1 << 20))
            if not chunk:
                raise RemoteConnectionError(f"the step server at {self.address} closed the connection {doing}")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _request(self, message: Message, payload: bytes = b"", timeout: float | None = None) -> bytes:
        """Send one request and return its reply's payload (raising the server's error); ``timeout``
        overrides the one of the message's kind (see :data:`_LONG_REQUESTS`)."""
        if self._socket is None:
            raise RemoteConnectionError(f"the connection to {self.address} is closed: make a new RemoteDevice")
        limit = self.limits["max_message_bytes"] if hasattr(self, "limits") else None
        if limit is not None and len(payload) > limit:
            raise RemoteError(f"{message.name}: a message of {len(payload)} bytes; the server takes at most {limit} "
                              "(its --max-message-mib)")
        doing = f"while answering {message.name}"
        if timeout is None:
            timeout = self.timeout if message in _LONG_REQUESTS else self.reply_timeout
        try:
            self._socket.settimeout(timeout)
            # (refused before it was all sent, say as too large: the reply says why, if one came)
            with contextlib.suppress(OSError):
                self._socket.sendall(protocol.frame(message, payload))
            magic, _version, kind, length = protocol.HEADER.unpack(self._receive(protocol.HEADER.size, doing))
            if magic != protocol.MAGIC:
                raise RemoteError(f"{self.address} answered {message.name} with something not of the step protocol")
            body = self._receive(length, doing)
        except TimeoutError:
            self._drop()
            raise RemoteTimeout(f"the step server at {self.address} sent no reply to {message.name} within "
                                f"{timeout} s; the connection is closed") from None
        except OSError as error:
            self._drop()
            raise RemoteConnectionError(f"the connection to {self.address} broke {doing}: {error}") from None
        except RemoteError:
            self._drop()
            raise
        if kind == protocol.ERROR:
            reader = protocol.Reader(body)
            (code,) = reader.unpack("I")
            refusal = RemoteServerError(code, reader.text())
            if code in protocol.CLOSING_ERRORS:
                self._drop()
            raise refusal
        if kind != message | protocol.REPLY:
            self._drop()
            raise RemoteError(f"{self.address} answered {message.name} with message type {kind}")
        return body


def _spec(entry: dict[str, Any]) -> tuple[np.dtype, tuple[int, ...]]:
    return np.dtype(entry["dtype"]), tuple(int(d) for d in entry["shape"])


class RemoteStep:
    """A step loaded on a remote device: its layout (``batch_inputs``, ``state_layout``: name, dtype,
    shape, bytes each) as the server read it from the file, and the calls that run it."""

    def __init__(self, device: RemoteDevice, layout: dict[str, Any], generation: int) -> None:
        self.device = device
        self.layout = layout
        self.batch_inputs: list[dict[str, Any]] = layout["batch"]
        self.state_layout: list[dict[str, Any]] = layout["state"]
        self._generation = generation

    def _check_current(self) -> None:
        if self._generation != self.device._generation:
            raise RemoteError("this step was replaced by a later load_step on the same connection")

    def _batch_bytes(self, batch: Sequence[Any]) -> bytes:
        if len(batch) != len(self.batch_inputs):
            raise ValueError(f"the step takes {len(self.batch_inputs)} batch arrays "
                             f"({', '.join(b['name'] for b in self.batch_inputs)}), got {len(batch)}")
        parts = []
        for value, entry in zip(batch, self.batch_inputs, strict=True):
            array = np.asarray(value)
            dtype, shape = _spec(entry)
            if array.dtype != dtype or array.shape != shape:
                raise ValueError(f"batch input {entry['name']}: the step was exported for {dtype}{list(shape)}, got "
                                 f"{array.dtype}{list(array.shape)} (convert it: no silent casts)")
            parts.append(np.ascontiguousarray(array).tobytes())
        return b"".join(parts)

    def step(self, *batch: Any) -> float:
        """One training step on the batch (numpy arrays, or anything np.asarray takes); its loss."""
        return self.run([batch])[0]

    def run(self, batches: Iterable[Sequence[Any]]) -> list[float]:
        """Several steps in one message (one round trip); their losses."""
        self._check_current()
        encoded = [self._batch_bytes(batch) for batch in batches]
        if not encoded:
            return []
        most = self.device.limits["max_steps_per_run"]
        losses: list[float] = []
        for first in range(0, len(encoded), most):
            chunk = encoded[first:first + most]
            reply = protocol.Reader(self.device._request(Message.RUN, struct.pack("<I", len(chunk)) + b"".join(chunk)))
            (count,) = reply.unpack("I")
            losses += [float(x) for x in reply.unpack(f"{count}f")]
        return losses

    def read_state(self, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """State tensors by name (all of them by default), copied from the device."""
        self._check_current()
        wanted = list(names) if names is not None else []
        payload = struct.pack("<I", len(wanted)) + b"".join(protocol.text(n) for n in wanted)
        reply = protocol.Reader(self.device._request(Message.READ_STATE, payload))
        (count,) = reply.unpack("I")
        return dict(reply.tensor() for _ in range(count))

    def write_state(self, state: Mapping[str, Any]) -> None:
        """Replace state tensors on the device (each of the step's dtype and shape; all are checked
        before any is written)."""
        self._check_current()
        self.device._request(Message.WRITE_STATE, protocol.state_payload({k: np.asarray(v) for k, v in state.items()}))

    def set_input(self, name: str, value: float) -> None:
        """Set a one-element state input, such as the learning rate ``lr``, converted to its dtype."""
        self._check_current()
        self.device._request(Message.SET_INPUT, protocol.text(name) + struct.pack("<d", float(value)))

    def profile(self, reset: bool = False) -> dict[str, Any]:
        """``last_step``: the last step's host phases on the device (upload_ms, enqueue_ms, wait_ms);
        with ``load_step(..., profile=True)``, ``operations``: each operation's name, device
        milliseconds summed over its runs, and runs, since the load or the last ``reset``."""
        self._check_current()
        return json.loads(self.device._request(Message.PROFILE, struct.pack("<B", 1 if reset else 0)))

    def close(self) -> None:
        """Release the step: one step per connection, so this closes the connection."""
        self.device.close()
