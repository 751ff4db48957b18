"""Images over buffers: the runtime side of a kernel's image operands (see
:class:`torch_adreno.kernels.ImageOperand`).

A kernel that reads an operand through an image takes, after its buffer arguments, one
``image2d_t`` per :class:`ImageOperand`; the image shows the bytes of the buffer bound for that
operand in the same launch. Two ways to make it:

- *shared*: with ``cl_khr_image2d_from_buffer``, the image is made over the buffer's own memory
  (its row pitch a multiple of the device's pitch alignment, the buffer's address of its base
  address alignment); whatever writes the buffer (an optimizer update, a graph's store) is what the
  next launch reads, nothing to keep in step;
- *copied*: otherwise (PoCL, or a width or address the device cannot share) an image of its own,
  filled from the buffer by a device copy enqueued right before every launch that reads it.

Invariant: a launch never reads a stale image. A copied image is refreshed before each launch
that reads it, in the compiled graphs and in a replayed step alike (its recording replays the
refreshes), so a write to the buffer between two launches (an optimizer step, a memory slot
reused by another buffer) is always seen; this costs one device copy of the operand per read,
which the shared images do not. (Refreshing only after a write would need every writer tracked,
and with zero-copy the host writes parameters' memory itself — an eager optimizer step, a NumPy
view — unseen by any device-side bookkeeping.)
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyopencl as cl

from torch_adreno.kernels.choices import images_enabled
from torch_adreno.kernels.program import ImageOperand, KernelSource
from torch_adreno.runtime.heap import placement
from torch_adreno.targets import DeviceProfile

_log = logging.getLogger(__name__)

#: Per channel type of an :class:`ImageOperand`: the image format (RGBA: 4 elements per texel, the
#: order every OpenCL device with images supports for reading floats and halves) and its texel bytes.
IMAGE_FORMATS: dict[str, tuple[cl.ImageFormat, int]] = {
    "float32": (cl.ImageFormat(cl.channel_order.RGBA, cl.channel_type.FLOAT), 16),
    "float16": (cl.ImageFormat(cl.channel_order.RGBA, cl.channel_type.HALF_FLOAT), 8),
}


def texel_bytes(operand: ImageOperand) -> int:
    return IMAGE_FORMATS[operand.channel_type][1]


@dataclass
class BoundImage:
    """The image one operand reads, over (or copied from) ``buffer``."""

    image: cl.Image
    buffer: cl.Buffer
    operand: ImageOperand
    #: Made over the buffer's memory (cl_khr_image2d_from_buffer); else a copy refreshed before reads.
    shared: bool
    #: A copy of a sub-buffer is refreshed from these bytes of its parent (buffer, byte offset):
    #: PoCL 3.0 faults copying from a sub-buffer into an image.
    parent: tuple[cl.Buffer, int] | None = None

    @property
    def nbytes(self) -> int:
        return self.operand.width * self.operand.height * texel_bytes(self.operand)

    def refresh(self, queue: cl.CommandQueue) -> cl.Event | None:
        """Make a copied image show the buffer's current bytes (nothing to do for a shared one)."""
        if self.shared:
            return None
        buffer, offset = self.parent or (self.buffer, 0)
        return cl.enqueue_copy(queue, self.image, buffer, offset=offset, origin=(0, 0),  # type: ignore[call-overload]
                               region=(self.operand.width, self.operand.height))


def image_descriptor(operand: ImageOperand, buffer: cl.Buffer | None) -> cl.ImageDescriptor:
    """A 2D image over ``buffer`` (cl_khr_image2d_from_buffer), rows ``operand.width`` texels apart;
    without a buffer, an image of its own."""
    desc = cl.ImageDescriptor()
    desc.image_type = cl.mem_object_type.IMAGE2D
    # pyopencl takes 2 or 3 extents (its stub says 3).
    desc.shape = (operand.width, operand.height)  # type: ignore[assignment]
    desc.pitches = (operand.width * texel_bytes(operand) if buffer is not None else 0, 0)
    desc.num_mip_levels = 0
    desc.num_samples = 0
    desc.buffer = buffer
    return desc


class ImageViews:
    """The images of one device's buffers, made once per (buffer, image shape) and kept while the
    buffer is referenced elsewhere."""

    def __init__(self, context: cl.Context, profile: DeviceProfile) -> None:
        self.context = context
        self.profile = profile
        self._entries: dict[tuple[int, int, int], BoundImage] = {}
        #: Counts, for tests and profiles: images made over buffers, images made as copies, and
        #: launches bound to an image.
        self.shared_made = 0
        self.copies_made = 0
        self.bindings = 0
        #: Images over buffers the driver refused (each then a copy), and the refusals logged.
        self.refused = 0
        self._refusals_said: set[str] = set()
        #: Per kernel name, the image operands (buffer names) its launches were bound to.
        self.bound_kernels: dict[str, tuple[str, ...]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def _can_share(self, buffer: cl.Buffer, operand: ImageOperand) -> bool:
        p = self.profile
        texel = texel_bytes(operand)
        if not p.image_from_buffer or buffer.size < operand.width * operand.height * texel:
            return False
        # Both alignments are in texels (pixels).
        if operand.width % max(p.image_pitch_alignment, 1):
            return False
        try:
            host: Any = buffer.get_info(cl.mem_info.HOST_PTR)
        except (cl.Error, TypeError, ValueError):
            host = None
        # A buffer over host memory (zero-copy) shares only from an address the image unit accepts.
        return not host or int(host) % (max(p.image_base_address_alignment, 1) * texel) == 0

    def _make(self, buffer: cl.Buffer, operand: ImageOperand, parent: tuple[cl.Buffer, int] | None) -> BoundImage:
        shape = (operand.width, operand.height)
        if self._can_share(buffer, operand):
            try:
                image = cl.Image(self.context, cl.mem_flags.READ_ONLY, IMAGE_FORMATS[operand.channel_type][0],
                                 desc=image_descriptor(operand, buffer))
            except cl.Error as err:
                # The driver refused this buffer (an alignment it does not report): a copy, counted,
                # and said once per device and refusal (a model meets it for many of its tensors).
                self.refused += 1
                if str(err) not in self._refusals_said:
                    self._refusals_said.add(str(err))
                    _log.info("the driver refuses images over some buffers (%s, first over a %d-byte one): those "
                              "images are copies instead (said once)", str(err), buffer.size)
            else:
                self.shared_made += 1
                return BoundImage(image, buffer, operand, shared=True)
        image = cl.create_image(self.context, cl.mem_flags.READ_ONLY, IMAGE_FORMATS[operand.channel_type][0],
                                shape=shape)
        self.copies_made += 1
        return BoundImage(image, buffer, operand, shared=False, parent=parent)

    def image_for(self, buffer: cl.Buffer, operand: ImageOperand,
                  parent: tuple[cl.Buffer, int] | None = None) -> BoundImage:
        """The image of ``operand`` over ``buffer``; ``parent``: where ``buffer``'s bytes are in
        the buffer it is a sub-buffer of (byte offset), found by the heap for its regions."""
        key = (id(buffer), operand.width, operand.height)
        entry = self._entries.get(key)
        if entry is None or entry.buffer is not buffer:
            self._drop_unreferenced()
            # A device heap region (a parameter's copy) is a sub-buffer too: copied from its slab.
            entry = self._entries[key] = self._make(buffer, operand, parent or placement(buffer))
        return entry

    def _drop_unreferenced(self) -> None:
        """Forget images whose buffer only this table still references (pyopencl's buffers take no
        weak references): the buffer and its image are released, and the buffer's ``id`` may be
        reused by a new one, which then gets its own image."""
        for key, entry in list(self._entries.items()):
            # References: the entry's field and getrefcount's argument.
            if sys.getrefcount(entry.buffer) <= 2:
                del self._entries[key]

    def bind(self, kernel: cl.Kernel, source: KernelSource, buffer_of: Callable[[str], Any],
             parent_of: Callable[[str], tuple[cl.Buffer, int] | None] | None = None) -> list[BoundImage]:
        """Set ``kernel``'s image arguments (after its buffer arguments) to the images of the buffers
        ``buffer_of`` gives for its image operands (``parent_of``: where a sub-buffer's bytes are
        in its parent); the caller refreshes each before the launch and keeps them referenced
        while the kernel may be enqueued."""
        # After the buffers, and after the index check's two arguments where the kernel has them.
        first = len(source.params) + (2 if source.checks_indices else 0)
        bound = []
        for j, operand in enumerate(source.images):
            entry = self.image_for(buffer_of(operand.buffer), operand,
                                   None if parent_of is None else parent_of(operand.buffer))
            kernel.set_arg(first + j, entry.image)
            bound.append(entry)
        self.bindings += 1
        self.bound_kernels[source.name] = tuple(o.buffer for o in source.images)
        return bound


_views: dict[int, tuple[Any, ImageViews]] = {}


def image_views(runtime: Any) -> ImageViews:
    """The image table of ``runtime`` (a :class:`~torch_adreno.runtime.device.DeviceRuntime`)."""
    held = _views.get(id(runtime))
    if held is None or held[0] is not runtime:
        held = _views[id(runtime)] = (runtime, ImageViews(runtime.context, runtime.profile))
    return held[1]


__all__ = ["IMAGE_FORMATS", "BoundImage", "ImageViews", "image_views", "images_enabled"]
