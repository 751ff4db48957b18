"""Writes native/tests/fixtures.c: the bytes the C tests read, made by the Python side they must
agree with (a step file sealed by torch_adreno.runner.integrity, a safetensors file written by the
safetensors library, .npz archives written by numpy.savez and numpy.savez_compressed) and the
batch order torch_adreno.runner.data draws for two seeds. Run from the checkout's root:

    PYTHONPATH=. python native/tests/generate_fixtures.py

The .npz entries carry the time they were written, so a run changes those bytes (and nothing the
tests assert)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper
from safetensors.numpy import save as safetensors_save

from torch_adreno.runner import format as fmt
from torch_adreno.runner import integrity, read_step
from torch_adreno.runner.data import Batches

OUT = Path(__file__).resolve().parent / "fixtures.c"
#: The state ``w``'s one value; its 4 bytes occur once in the step file, so a test can flip them.
W_VALUE = np.array([0.3], np.float32)
KERNELS = {
    "k0": "__kernel void k0(__global const float* in0, __global float* out0) {\n"
          "  int i = get_global_id(0); out0[i] = in0[i] * 2.0f; }",
    "k1": "__kernel void k1(__global const float* in1, __global float* w, __global float* loss) {\n"
          "  float s = 0.0f; for (int i = 0; i < N; i++) s += in1[i]; loss[0] = s + w[0]; w[0] += 1.0f; }",
}
#: Examples of the batch-order fixture: x float32 [5, 2] (row r: 10r, 10r + 1), y int64 [5] (row r: r).
EXAMPLES, BATCH_SIZE, BATCHES_CHECKED = 5, 2, 6
SEEDS = (0, 12345)


def step_file() -> bytes:
    """A batch view of rows 1-2 of a [4, 3] input doubled (k0, 6 work-items in one work-group),
    copied to another slot, summed with the state ``w`` (k1, one work-item), a fill before k1;
    build options with an empty one that pyopencl drops."""
    def kernel(name: str, buffers: list[int], size: int, local: list[int], options: list[str]) -> onnx.NodeProto:
        return helper.make_node(name, [], [f"{name}_out"], domain=fmt.DOMAIN, name=name, kernel_name=name,
                                opencl_source=KERNELS[name], build_options=options, global_size=[size],
                                local_size=local, buffers=buffers, parameters=[""], fx_nodes=[""], graph="g",
                                index_checks=0, extensions=[""])

    copy = helper.make_node(fmt.COPY_OP, [], ["copied"], domain=fmt.DOMAIN, name="copy", destination=2, source=1,
                            nbytes=24)
    functions = [helper.make_function(fmt.DOMAIN, name, [], ["out"], [helper.make_node(
        "Constant", [], ["out"], value=numpy_helper.from_array(np.zeros(1, np.float32)))],
        [helper.make_opsetid("", fmt.OPSET)], attributes=list(attributes))
        for name, attributes in (("k0", fmt.KERNEL_ATTRIBUTES), ("k1", fmt.KERNEL_ATTRIBUTES),
                                 (fmt.COPY_OP, fmt.COPY_ATTRIBUTES))]
    graph = helper.make_graph(
        [kernel("k0", [0, 1], 6, [6], [""]), copy,
         kernel("k1", [2, 3, 4], 1, [1], ["-cl-fast-relaxed-math", "", "-DN=6"])], "step",
        [helper.make_tensor_value_info("batch_0", onnx.TensorProto.FLOAT, [4, 3]),
         helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])],
        initializer=[numpy_helper.from_array(W_VALUE, "w")])
    model = helper.make_model(graph, functions=functions, producer_name=fmt.PRODUCER,
                              opset_imports=[helper.make_opsetid("", fmt.OPSET), helper.make_opsetid(fmt.DOMAIN, 1)])
    plan = {"identities": [
        {"index": 0, "kind": "batch", "nbytes": 24, "position": 0, "view": [[2, 3], [3, 1], 3]},
        {"index": 1, "kind": "internal", "nbytes": 24, "slot": 0},
        {"index": 2, "kind": "internal", "nbytes": 24, "slot": 1},
        {"index": 3, "kind": "persistent", "nbytes": 4, "input": "w", "shape": [1], "output": "w.new"},
        {"index": 4, "kind": "internal", "nbytes": 4, "slot": 2}],
        "slots": [24, 24, 4], "batch": [{"input": "batch_0", "position": 0, "shape": [4, 3], "dtype": "float32"}],
        "loss": {"identity": 4, "dtype": "float32", "shape": []}, fmt.FILLS_KEY: [[2, 4, 0, 4]]}
    helper.set_model_props(model, {fmt.FORMAT_KEY: str(fmt.FORMAT_VERSION), fmt.PLAN_KEY: json.dumps(plan)})
    model = integrity.seal(model)
    integrity.verify(model)
    read_step(model)  # the Python runner reads it
    return model.SerializeToString()


def npz(compressed: bool) -> bytes:
    buffer = io.BytesIO()
    x = np.arange(EXAMPLES * 2, dtype=np.float32).reshape(EXAMPLES, 2)
    x = (x // 2) * 10 + x % 2
    y = np.arange(EXAMPLES, dtype=np.int64)
    (np.savez_compressed if compressed else np.savez)(buffer, x=x, y=y)
    return buffer.getvalue()


def shuffled_rows(seed: int) -> list[list[int]]:
    """The example rows of each of the first batches: the ``y`` values Batches yields."""
    x = np.zeros((EXAMPLES, 2), np.float32)
    y = np.arange(EXAMPLES, dtype=np.int64)
    batches = iter(Batches([x, y], stacked=False, batch_size=BATCH_SIZE, seed=seed))
    return [[int(v) for v in next(batches)[1]] for _ in range(BATCHES_CHECKED)]


def c_bytes(name: str, data: bytes) -> str:
    rows = [", ".join(f"0x{b:02x}" for b in data[i:i + 16]) for i in range(0, len(data), 16)]
    body = ",\n    ".join(rows)
    return (f"const unsigned char {name}[] = {{\n    {body}\n}};\n"
            f"const size_t {name}_size = sizeof {name};\n")


def unique_offset(data: bytes, part: bytes) -> int:
    assert data.count(part) == 1, f"{part!r} occurs {data.count(part)} times"
    return data.index(part)


def main() -> None:
    step = step_file()
    safetensors = safetensors_save({"x": np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5,
                                    "y": np.array([5, -7], np.int64)}, metadata={"format": "pt"})
    stored, compressed = npz(False), npz(True)
    rows = [shuffled_rows(seed) for seed in SEEDS]
    orders = ",\n    ".join("{" + ", ".join("{" + ", ".join(map(str, batch)) + "}" for batch in seed_rows) + "}"
                            for seed_rows in rows)
    text = "\n".join([
        "/* Generated by native/tests/generate_fixtures.py (see there); do not edit. */",
        '#include "fixtures.h"', "",
        c_bytes("fixture_step_file", step),
        f"const size_t fixture_step_w_offset = {unique_offset(step, W_VALUE.tobytes())};",
        f"const size_t fixture_step_source_offset = {unique_offset(step, b'in0[i] * 2.0f')};", "",
        c_bytes("fixture_safetensors_file", safetensors),
        c_bytes("fixture_npz_file", stored),
        f"const size_t fixture_npz_y_offset = {unique_offset(stored, np.arange(EXAMPLES, dtype=np.int64).tobytes())};",
        c_bytes("fixture_npz_compressed_file", compressed),
        f"const long long fixture_shuffle_seeds[{len(SEEDS)}] = {{{', '.join(map(str, SEEDS))}}};",
        f"const size_t fixture_shuffled_rows[{len(SEEDS)}][{BATCHES_CHECKED}][{BATCH_SIZE}] = {{\n    {orders}\n}};", ""])
    OUT.write_text(text)
    print(f"wrote {OUT}: step file {len(step)} bytes, safetensors {len(safetensors)}, npz {len(stored)} and "
          f"{len(compressed)}; rows {rows}")


if __name__ == "__main__":
    main()
