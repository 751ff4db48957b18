"""The step server's wire format, version 1 (``native/PROTOCOL.md``): frames of a 16-byte header
(``TASP``, the version, the message type, the payload's length; little-endian) and a payload whose
fields each message type defines. Plain functions over bytes, shared by the client and the tests
that fuzz the server."""

from __future__ import annotations

import struct
from collections.abc import Mapping
from enum import IntEnum

import numpy as np

MAGIC = b"TASP"
VERSION = 1
HEADER = struct.Struct("<4sHHQ")
#: A reply's type is the request's | REPLY, or ERROR.
REPLY = 0x8000
ERROR = 0xFFFF
#: Names and tokens: at most this many bytes.
MAX_TEXT = 4096


class Message(IntEnum):
    HELLO = 1
    PROPERTIES = 2
    LOAD_STEP = 3
    RUN = 4
    READ_STATE = 5
    WRITE_STATE = 6
    SET_INPUT = 7
    PROFILE = 8
    CLOSE = 9


#: The codes of an error reply: the C API's tas_status (1-7), then the protocol's own.
ERROR_NAMES = {
    1: "bad argument", 2: "file", 3: "format", 4: "device", 5: "OpenCL", 6: "out of memory", 7: "index out of range",
    100: "malformed message", 101: "message too large", 102: "not a protocol frame", 103: "protocol version",
    104: "unauthorized", 105: "no step loaded", 106: "unknown message type", 107: "busy",
}
#: Errors after which the server has closed the connection.
CLOSING_ERRORS = frozenset({101, 102, 103, 104, 107})

#: The C API's tas_dtype codes.
DTYPES: dict[int, np.dtype] = {0: np.dtype(np.float32), 1: np.dtype(np.int64), 2: np.dtype(np.int32),
                               3: np.dtype(np.bool_), 4: np.dtype(np.uint8)}
DTYPE_CODES = {dtype: code for code, dtype in DTYPES.items()}


def frame(message: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(MAGIC, VERSION, message, len(payload)) + payload


def text(value: str) -> bytes:
    encoded = value.encode()
    if len(encoded) > MAX_TEXT or b"\0" in encoded:
        raise ValueError(f"a name or token of at most {MAX_TEXT} bytes without NUL, got {len(encoded)} bytes")
    return struct.pack("<I", len(encoded)) + encoded


def tensor(name: str, array: np.ndarray) -> bytes:
    code = DTYPE_CODES.get(array.dtype)
    if code is None:
        raise TypeError(f"state tensor {name}: dtype {array.dtype} is not one the step format uses "
                        f"({', '.join(str(d) for d in DTYPES.values())})")
    data = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
    return (text(name) + struct.pack("<BB", code, array.ndim) + struct.pack(f"<{array.ndim}q", *array.shape)
            + struct.pack("<Q", len(data)) + data)


class Reader:
    """Fields of a reply's payload in order; a short payload raises ValueError."""

    def __init__(self, payload: bytes) -> None:
        self.payload = memoryview(payload)
        self.at = 0

    def take(self, count: int) -> memoryview:
        if count > len(self.payload) - self.at:
            raise ValueError(f"a reply of {len(self.payload)} bytes ends inside its fields")
        part = self.payload[self.at:self.at + count]
        self.at += count
        return part

    def unpack(self, layout: str) -> tuple:
        form = struct.Struct("<" + layout)
        return form.unpack(self.take(form.size))

    def text(self) -> str:
        (length,) = self.unpack("I")
        return bytes(self.take(length)).decode(errors="replace")

    def tensor(self) -> tuple[str, np.ndarray]:
        name = self.text()
        code, rank = self.unpack("BB")
        shape = self.unpack(f"{rank}q")
        (size,) = self.unpack("Q")
        dtype = DTYPES.get(code)
        if dtype is None:
            raise ValueError(f"state tensor {name}: dtype code {code} is not one of the protocol's")
        array = np.frombuffer(bytes(self.take(size)), dtype=dtype.newbyteorder("<")).astype(dtype, copy=False)
        return name, array.reshape(shape)

    def rest(self) -> bytes:
        return bytes(self.take(len(self.payload) - self.at))


def state_payload(state: Mapping[str, np.ndarray]) -> bytes:
    return struct.pack("<I", len(state)) + b"".join(tensor(name, np.asarray(value)) for name, value in state.items())
