"""Buffer transfers enqueued without pyopencl's argument dispatch, for the per-step hot paths.

``pyopencl.enqueue_copy`` chooses which OpenCL call to make from its arguments' types, in Python,
on every call (~2.5 us on PoCL's host, more than the enqueue itself for a small transfer). A
replayed training step knows each transfer's kind when it is built, so it calls the one entry
point directly. These are pyopencl's own bindings of those entry points (``pyopencl._cl``): the
one module that reaches past pyopencl's public API, so that a pyopencl upgrade that moves them
breaks here, in one place.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pyopencl as cl
import pyopencl._cl as _cl

from torch_adreno.runner.format import fill_commands


def write_buffer(queue: cl.CommandQueue, buffer: cl.Buffer, host: Any, offset: int = 0,
                 blocking: bool = False) -> cl.Event:
    """Copy the bytes of ``host`` (a buffer-protocol object) into ``buffer`` from byte ``offset``.
    Not blocking: ``host`` must stay alive and unchanged until the queue has run the write."""
    return _cl._enqueue_write_buffer(queue, buffer, host, offset, None, blocking)


def read_buffer(queue: cl.CommandQueue, buffer: cl.Buffer, host: Any, offset: int = 0,
                blocking: bool = True) -> cl.Event:
    """Copy ``buffer``'s bytes from ``offset`` into ``host`` (as many as ``host`` holds)."""
    return _cl._enqueue_read_buffer(queue, buffer, host, offset, None, blocking)


def copy_buffer_call(queue: cl.CommandQueue, source: cl.Buffer, destination: cl.Buffer, nbytes: int,
                     source_offset: int = 0, destination_offset: int = 0) -> Callable[[], cl.Event]:
    """A call enqueueing the device copy of ``nbytes`` from ``source`` to ``destination`` (a
    partial of the binding itself: no Python frame of ours per enqueue)."""
    return functools.partial(_cl._enqueue_copy_buffer, queue, source, destination, nbytes, source_offset,
                             destination_offset, None)


def fill_buffer_call(queue: cl.CommandQueue, buffer: cl.Buffer, pattern: bytes, offset: int,
                     nbytes: int) -> Callable[[], cl.Event]:
    """A call enqueueing the fill of ``nbytes`` of ``buffer`` from ``offset`` with ``pattern``
    repeated (offset and size multiples of its length)."""
    return functools.partial(_cl._enqueue_fill_buffer, queue, buffer, pattern, offset, nbytes, None)


def enqueue_fill(queue: cl.CommandQueue, buffer: cl.Buffer, offset: int, nbytes: int) -> None:
    """Fill ``nbytes`` of ``buffer`` from ``offset`` (even) with the pattern of
    ``fill_uninitialized_memory`` (:func:`torch_adreno.runner.format.fill_commands`: one fill, and
    one more of a single byte for an odd count)."""
    for start, size, pattern in fill_commands(offset, nbytes):
        _cl._enqueue_fill_buffer(queue, buffer, pattern, start, size, None)
