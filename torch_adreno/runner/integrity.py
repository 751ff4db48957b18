"""The integrity record of a step file: SHA-256 digests of its parts, written at export
(:func:`seal`) and checked by every runner before it uses the file (:func:`verify`), so that a
file changed after export (a flipped bit on a phone's storage, a cut copy, an edit) is refused as
a damaged file naming the part, instead of failing in a kernel build or training on garbage.

The record is the model's metadata :data:`INTEGRITY_KEY`, JSON::

    {"algorithm": "sha256",
     "tensors": {"<initializer name>": "<hex digest of its values>", ...},
     "kernel_sources": "<hex digest>",
     "operations": "<hex digest>"}

Each digest is SHA-256 over bytes laid out so that a runner in another language computes the same
(the native runtime does: ``native/src/integrity.c``):

- a tensor: its values as the runner uploads them, little-endian, C order (bool and uint8 one byte
  each): an exported initializer's ``raw_data`` as it is;
- the kernel sources: for each kernel node (domain ``torch_adreno``, not a copy) in file order,
  its ``opencl_source`` as a length-prefixed string;
- the operations: the plan (metadata ``torch_adreno.step``) as a length-prefixed string, then for
  each node of domain ``torch_adreno`` in file order its name and op type, and every attribute but
  ``opencl_source`` in file order: its name, its type (8-byte integer) and, for the four types the
  format uses, its value (INT: 8 bytes; INTS: a count then 8 bytes each; STRING: length-prefixed;
  STRINGS: a count then each length-prefixed).

A length prefix and a count are 8-byte little-endian unsigned integers; integers are 8-byte
little-endian two's complement. Torch-free, as the runner is.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable

import numpy as np
import onnx
from onnx import numpy_helper

from torch_adreno.runner import format as fmt

__all__ = ["INTEGRITY_KEY", "DamagedStepFile", "seal", "verify"]

INTEGRITY_KEY = "torch_adreno.integrity"
ALGORITHM = "sha256"
#: The attribute whose text makes the kernel-sources digest (the rest make the operations digest).
SOURCE_ATTRIBUTE = "opencl_source"
#: At most this many damaged parts are named in one message.
NAMED_PARTS = 4


class DamagedStepFile(fmt.UnsupportedStepFile):
    """A step file whose contents differ from what its integrity record says was exported."""


def _length(count: int) -> bytes:
    return struct.pack("<Q", count)


def _text(data: bytes) -> bytes:
    return _length(len(data)) + data


def tensor_digest(tensor: onnx.TensorProto) -> str:
    """The digest of an initializer's values (the ``raw_data`` bytes where it has them)."""
    if tensor.HasField("raw_data"):
        return hashlib.sha256(tensor.raw_data).hexdigest()
    array = np.ascontiguousarray(numpy_helper.to_array(tensor))
    return array_digest(array)


def array_digest(array: np.ndarray) -> str:
    """The digest of ``array``'s values, little-endian in C order (what :func:`tensor_digest` gives
    for the initializer ``numpy_helper.from_array`` makes of it)."""
    little = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False)
    return hashlib.sha256(little.reshape(-1).view(np.uint8).data).hexdigest()


def _kernel_nodes(model: onnx.ModelProto) -> Iterable[onnx.NodeProto]:
    return (n for n in model.graph.node if n.domain == fmt.DOMAIN)


def kernel_sources_digest(model: onnx.ModelProto) -> str:
    digest = hashlib.sha256()
    for node in _kernel_nodes(model):
        if node.op_type == fmt.COPY_OP:
            continue
        for attribute in node.attribute:
            if attribute.name == SOURCE_ATTRIBUTE:
                digest.update(_text(attribute.s))
    return digest.hexdigest()


def _attribute_bytes(attribute: onnx.AttributeProto) -> bytes:
    kind = attribute.type
    parts = [_text(attribute.name.encode()), struct.pack("<q", kind)]
    if kind == onnx.AttributeProto.INT:
        parts.append(struct.pack("<q", attribute.i))
    elif kind == onnx.AttributeProto.INTS:
        parts.append(_length(len(attribute.ints)) + struct.pack(f"<{len(attribute.ints)}q", *attribute.ints))
    elif kind == onnx.AttributeProto.STRING:
        parts.append(_text(attribute.s))
    elif kind == onnx.AttributeProto.STRINGS:
        parts.append(_length(len(attribute.strings)) + b"".join(_text(s) for s in attribute.strings))
    return b"".join(parts)


def operations_digest(model: onnx.ModelProto) -> str:
    props = {p.key: p.value for p in model.metadata_props}
    digest = hashlib.sha256(_text(props.get(fmt.PLAN_KEY, "").encode()))
    for node in _kernel_nodes(model):
        digest.update(_text(node.name.encode()) + _text(node.op_type.encode()))
        for attribute in node.attribute:
            if attribute.name != SOURCE_ATTRIBUTE:
                digest.update(_attribute_bytes(attribute))
    return digest.hexdigest()


def record(model: onnx.ModelProto, tensors: dict[str, str] | None = None) -> dict[str, object]:
    """The integrity record of ``model`` as it is now; ``tensors``: digests already computed, by
    initializer name (the export hashes its arrays before they become initializers)."""
    known = tensors or {}
    return {"algorithm": ALGORITHM,
            "tensors": {t.name: known.get(t.name) or tensor_digest(t) for t in model.graph.initializer},
            "kernel_sources": kernel_sources_digest(model), "operations": operations_digest(model)}


def seal(model: onnx.ModelProto, tensors: dict[str, str] | None = None) -> onnx.ModelProto:
    """Write ``model``'s integrity record into its metadata (replacing one it holds) and return
    it: after export, and after a runner replaced the initializers with trained values."""
    text = json.dumps(record(model, tensors), separators=(",", ":"))
    for prop in model.metadata_props:
        if prop.key == INTEGRITY_KEY:
            prop.value = text
            return model
    entry = model.metadata_props.add()
    entry.key, entry.value = INTEGRITY_KEY, text
    return model


def verify(model: onnx.ModelProto, origin: str = "the model") -> None:
    """Raise :class:`DamagedStepFile` naming every damaged part (up to :data:`NAMED_PARTS`) where
    ``model`` differs from its integrity record, or where it has none or an unreadable one."""
    props = {p.key: p.value for p in model.metadata_props}
    if INTEGRITY_KEY not in props:
        raise DamagedStepFile(f"damaged file: {origin} has no integrity record (metadata {INTEGRITY_KEY}); "
                              "a step file holds one from its export: export it again")
    try:
        expected = json.loads(props[INTEGRITY_KEY])
        tensors = expected["tensors"]
        if expected.get("algorithm") != ALGORITHM or not isinstance(tensors, dict) or not all(
                isinstance(v, str) for v in (*tensors.values(), expected["kernel_sources"], expected["operations"])):
            raise ValueError("unexpected fields")
    except (ValueError, KeyError, TypeError) as err:
        raise DamagedStepFile(f"damaged file: {origin}: its integrity record (metadata {INTEGRITY_KEY}) is "
                              f"unreadable ({err}): copy or export the file again") from None
    damaged = []
    if kernel_sources_digest(model) != expected["kernel_sources"]:
        damaged.append("the kernel sources")
    if operations_digest(model) != expected["operations"]:
        damaged.append("the operations and memory plan")
    present = set()
    for tensor in model.graph.initializer:
        present.add(tensor.name)
        if tensor.name not in tensors:
            damaged.append(f"initializer {tensor.name} (not in the record)")
        elif tensor_digest(tensor) != tensors[tensor.name]:
            damaged.append(f"the data of initializer {tensor.name}")
    damaged += [f"initializer {name} (missing)" for name in tensors if name not in present]
    if damaged:
        named = ", ".join(damaged[:NAMED_PARTS]) + (f" and {len(damaged) - NAMED_PARTS} more"
                                                    if len(damaged) > NAMED_PARTS else "")
        raise DamagedStepFile(f"damaged file: {origin}: {named}: not as exported (its SHA-256 differs from the "
                              "file's integrity record: changed or corrupted since): copy or export the file again")
