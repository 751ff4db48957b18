"""IR element types, and rounding to the 16-bit ones.

Invariant: a value of a 16-bit type (``F16``, ``BF16``) is one that type can hold exactly; it is
computed in float32 registers and rounded when formed (:func:`round_to` for constants).
"""

from __future__ import annotations

import enum
import math
import struct


class DType(enum.Enum):
    """Element types the IR computes in. ``INDEX`` is the integer type of loop variables."""

    F32 = "f32"
    #: 16-bit floats: stored in 16 bits, computed in float32 registers (see :func:`round_to`).
    F16 = "f16"
    BF16 = "bf16"
    I64 = "i64"
    I32 = "i32"
    BOOL = "b8"
    U8 = "u8"
    INDEX = "idx"

    @property
    def itemsize(self) -> int:
        return {"f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "b8": 1, "u8": 1, "idx": 8}[self.value]

    @property
    def is_float(self) -> bool:
        return self in (DType.F32, DType.F16, DType.BF16)

    @property
    def is_half(self) -> bool:
        """A 16-bit float: its values live in float32 registers and are rounded when formed."""
        return self in (DType.F16, DType.BF16)

    @property
    def compute(self) -> DType:
        """The type arithmetic on values of this type is done in: float32 for 16-bit floats."""
        return DType.F32 if self.is_half else self

    @property
    def is_integer(self) -> bool:
        return self in (DType.I64, DType.I32, DType.U8, DType.INDEX)


def round_to(value: float, dtype: DType) -> float:
    """``value`` rounded to the nearest ``dtype`` value (ties to even), as a Python float.

    Float32 constants are kept as they are (the kernel's C literal rounds them); 16-bit constants
    are rounded here, so that an expression of a 16-bit type always holds a value of that type.
    """
    if not dtype.is_half or math.isnan(value) or math.isinf(value):
        return value
    if dtype is DType.F16:
        try:
            return float(struct.unpack("<e", struct.pack("<e", value))[0])
        except OverflowError:
            return math.copysign(math.inf, value)
    try:
        bits = struct.unpack("<I", struct.pack("<f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return float(struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0])
