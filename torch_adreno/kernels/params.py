"""Parameter records: what each argument of a kernel is, as data.

The code writer knows, for every argument it declares, which IR buffer it binds, its C name, its
element type, whether the kernel writes through it and whether another argument shares its bytes.
:class:`KernelParam` keeps exactly that, so that every later stage reads the records instead of
the rendered text: the kernel's signature (the ``KERNEL_PARAMS`` macro) and the operands it
reaches at offsets of an arena (the ``KERNEL_LOCALS`` macro) are rendered from them
(:meth:`torch_adreno.kernels.program.KernelSource.render`), the arena rewrite of a replayed step
replaces records (:mod:`torch_adreno.kernels.arena_params`), the runtime binds arguments by them.

Invariant: a record's declaration is the only text that declares its kernel argument (or local,
for an operand in an arena); the kernel text names arguments only by their C names and takes its
signature only through ``KERNEL_PARAMS``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from torch_adreno import ir
from torch_adreno.kernels.expressions import STORAGE_CTYPE


class Role(enum.Enum):
    """What an argument is to the runtime that binds it."""

    #: An IR buffer (``KernelParam.key`` names it), a ``__global`` pointer to its elements.
    BUFFER = "buffer"
    #: A ``__read_only image2d_t`` over the bytes of the IR buffer ``key`` (the texture path).
    IMAGE = "image"
    #: The device's index error record (``index_check.cl``).
    INDEX_ERROR = "index error"
    #: The token naming the launch in that record (an ``int`` passed by value).
    INDEX_TOKEN = "index check token"
    #: A buffer holding several operands at byte offsets (a replayed step's arena).
    ARENA = "arena"
    #: An ``int`` passed by value: where an operand is in an arena (see :class:`ArenaLocation`).
    ARENA_OFFSET = "arena offset"


#: The roles bound to a buffer the caller names in :attr:`KernelSource.params`.
BOUND_BUFFER_ROLES = (Role.BUFFER, Role.ARENA)


@dataclass(frozen=True)
class ArenaLocation:
    """Where an operand is when it is not an argument of its own: in the arena argument whose C
    name is ``arena``, at ``unit`` times the value of the argument whose C name is ``offset`` bytes
    (an argument, not a constant: kernels alike but for their operands' offsets are one function)."""

    arena: str
    offset: str
    unit: int


@dataclass(frozen=True)
class KernelParam:
    """One parameter of a kernel.

    ``key`` is the IR buffer bound to it (an image's: the buffer it views), or for the arguments
    that are not IR buffers the key of their role (:data:`INDEX_ERROR_KEY`, an arena's name).
    ``located``: a buffer the kernel does not take as an argument but finds at an offset of an
    arena argument (it is then declared as a local pointer at the top of the body, with the
    same type and qualifiers, under the same C name, so the kernel text is the same either way).
    """

    key: str
    c_name: str
    role: Role
    dtype: ir.DType
    #: The kernel writes through it (no ``const``).
    written: bool = False
    #: Another argument of the kernel may use the same bytes (an in-place update): no ``restrict``.
    aliased: bool = False
    #: ``__global`` for memory, ``__private`` for a value passed by value.
    address_space: str = "__global"
    located: ArenaLocation | None = None

    @property
    def is_argument(self) -> bool:
        """Whether the kernel takes it as an argument (not an operand found in an arena)."""
        return self.located is None

    def pointer_type(self) -> str:
        """The pointer type of a memory argument: ``__global const float*``."""
        qualifier = "volatile " if self.role is Role.INDEX_ERROR else "" if self.written else "const "
        return f"{self.address_space} {qualifier}{STORAGE_CTYPE[self.dtype]}*"

    def declaration(self) -> str:
        """The C declaration of the parameter (in ``KERNEL_PARAMS``, or a helper's parameter list)."""
        if self.role is Role.IMAGE:
            return f"__read_only image2d_t {self.c_name}"
        if self.address_space == "__private":
            return f"const {STORAGE_CTYPE[self.dtype]} {self.c_name}"
        restrict = "" if self.aliased else " restrict"
        return f"{self.pointer_type()}{restrict} {self.c_name}"

    def local_declaration(self) -> str:
        """A located operand's declaration at the top of the body: its pointer at its offset."""
        assert self.located is not None, f"{self.c_name} is an argument, not an operand in an arena"
        pointer = self.pointer_type()
        where = self.located
        return f"{self.declaration()} = ({pointer})({where.arena} + (size_t){where.offset} * {where.unit}UL);"


#: Keys of the index check arguments (no IR buffer has such a name).
INDEX_ERROR_KEY = "<index error>"
INDEX_TOKEN_KEY = "<index check token>"


def buffer_record(buffer: str, c_name: str, dtype: ir.DType, written: bool, aliased: bool = False) -> KernelParam:
    return KernelParam(buffer, c_name, Role.BUFFER, dtype, written, aliased)


def arena_record(key: str, c_name: str) -> KernelParam:
    """An arena argument: bytes (``uchar``), written through, shared by the operands in it."""
    return KernelParam(key, c_name, Role.ARENA, ir.DType.U8, written=True, aliased=True)


def image_record(buffer: str, c_name: str, dtype: ir.DType) -> KernelParam:
    return KernelParam(buffer, c_name, Role.IMAGE, dtype)
