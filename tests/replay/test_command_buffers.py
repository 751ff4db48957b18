"""A replayed step recorded once into a ``cl_khr_command_buffer`` and enqueued whole each step
(option ``replay_command_buffers``): the same operations in the same order, so the same bits as
the C loop enqueueing them one by one, on the device that offers command buffers (Intel's CPU
runtime here; the suite's PoCL offers none). Qualcomm's recordable queues have no device here: their
entry points are stubs that log calls, which checks our side of the calls only."""

from __future__ import annotations

import ctypes
import gc
import warnings

import numpy as np
import pyopencl as cl
import pytest
import torch
import torch.nn.functional as F

import torch_adreno
from torch_adreno.errors import OptionError
from torch_adreno.models import MODELS
from torch_adreno.replay.batch import BatchMode
from torch_adreno.replay.driver_recording import COMMAND_BUFFER, driver_recording
from torch_adreno.replay.launch_list import Copy, Fill, Flush, Launch, LaunchList
from torch_adreno.runtime.device import list_devices

pytestmark = pytest.mark.device

_SOURCE = "__kernel void affine(__global float* x) { size_t i = get_global_id(0); x[i] = 2.0f * x[i] + 1.0f; }"


def _recording_device():
    """The device that records command buffers, and its entry (a skip where none does)."""
    for entry in list_devices():
        if entry.unusable is None and "cl_khr_command_buffer" in entry.device.extensions.split():
            return entry
    pytest.skip("no device here offers cl_khr_command_buffer (Intel's CPU runtime does)")


def test_each_device_says_how_it_records_and_true_is_refused_where_none_can() -> None:
    for entry in list_devices():
        if entry.unusable is not None:
            continue
        offered = "cl_khr_command_buffer" in entry.device.extensions.split()
        gpu = bool(entry.device.type & cl.device_type.GPU)
        automatic = driver_recording(entry.device, "auto", entry.label)
        assert (automatic.kind == COMMAND_BUFFER) == (offered and gpu), automatic
        if not gpu:
            assert automatic.detail.startswith("auto: launch by launch on a CPU device"), automatic
        recording = driver_recording(entry.device, True, entry.label) if offered else automatic
        if offered:
            assert recording.detail.startswith("cl_khr_command_buffer ") and recording.api is not None
        else:
            assert not gpu or recording.detail == "the device offers no cl_khr_command_buffer", recording
            with pytest.raises(OptionError, match=r"replay_command_buffers=True, but .* cannot record"):
                driver_recording(entry.device, True, entry.label)
        assert driver_recording(entry.device, False).kind is None


def _list_run(context: cl.Context, recording) -> tuple[np.ndarray, np.ndarray, list[int], LaunchList]:
    queue = cl.CommandQueue(context)
    kernel = cl.Kernel(cl.Program(context, _SOURCE).build(), "affine")
    first = cl.Buffer(context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                      hostbuf=np.arange(64, dtype=np.float32))
    second = cl.Buffer(context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=np.zeros(64, np.float32))
    kernel.set_arg(0, first)
    seen: list[int] = []
    listed = LaunchList(queue, [Launch(kernel, (64,), (16,)), Copy(first, second, 0, 64, 128), Flush(),
                                *Fill.of(second, 200, 13), lambda q: seen.append(1), Launch(kernel, (32,), None)],
                        recording=recording)
    listed()
    listed()
    out_first, out_second = np.empty(64, np.float32), np.empty(64, np.float32)
    cl.enqueue_copy(queue, out_first, first)
    cl.enqueue_copy(queue, out_second, second)
    return out_first, out_second, seen, listed


def test_a_recorded_list_does_what_the_c_loop_does_in_two_calls() -> None:
    entry = _recording_device()
    context = cl.Context([entry.device])
    recording = driver_recording(entry.device, True)
    recorded, looped = _list_run(context, recording), _list_run(context, None)
    # (bit patterns: the fills write NaN)
    assert np.array_equal(recorded[0].view(np.uint32), looped[0].view(np.uint32))
    assert np.array_equal(recorded[1].view(np.uint32), looped[1].view(np.uint32))
    assert recorded[2] == looped[2] == [1, 1]
    assert recorded[3].recorded == COMMAND_BUFFER and looped[3].recorded is None
    # A command buffer before the Python operation, one after it.
    assert recorded[3].host_calls == 3 and recorded[3].describe().startswith("command buffer (cl_khr_command_buffer")


def test_a_launch_the_driver_refuses_to_record_runs_through_the_c_loop_with_a_warning() -> None:
    entry = _recording_device()
    context = cl.Context([entry.device])
    queue = cl.CommandQueue(context)
    kernel = cl.Kernel(cl.Program(context, _SOURCE).build(), "affine")  # its argument never bound
    with pytest.warns(RuntimeWarning, match=r"refused to record kernel affine into a command buffer: error -52"):
        listed = LaunchList(queue, [Launch(kernel, (64,), None)], recording=driver_recording(entry.device, True))
    assert listed.recorded is None and "refused to record" in listed.describe()


def _train(name: str, device: str, options: dict, steps: int):
    torch._dynamo.reset()  # each step compiles its own optimizer's step: stay below the recompile limit
    torch.manual_seed(0)
    spec = MODELS[name]
    model = spec.make()
    step = torch_adreno.TrainingStep(model, lambda m, x, y: F.cross_entropy(m(x), y),
                                     torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                     options={"device": device, **options})
    generator = torch.Generator().manual_seed(1)
    losses = torch.stack([step(*spec.batch(generator)) for _ in range(steps)])  # unprofiled: the recorded path
    step.synchronize()
    return losses, {k: v.clone() for k, v in model.state_dict().items()}, step


@pytest.mark.parametrize("mode", [{}, {"zero_copy": False}], ids=["default", "copy"])
@pytest.mark.parametrize("name", ["lenet", pytest.param("resnet_mini", marks=pytest.mark.slow),
                                  pytest.param("mobilenet_mini", marks=pytest.mark.slow)])
def test_reference_models_replay_recorded_bit_identically_to_the_c_loop(name, mode) -> None:
    entry = _recording_device()
    looped = _train(name, entry.label, {**mode, "replay_command_buffers": False}, 5)
    recorded = _train(name, entry.label, {**mode, "replay_command_buffers": True}, 5)
    assert looped[2].replayed_steps == recorded[2].replayed_steps == 3
    assert recorded[2].replay.enqueue_path.startswith("command buffer (cl_khr_command_buffer")
    assert looped[2].replay.enqueue_path.startswith("C loop")
    # A recording keeps the kernels' arguments: the batch is copied, not bound in place.
    assert recorded[2].replay.batch_mode is BatchMode.UPLOADED
    # One call per step; where the step returns at its loss read, one before it and one after.
    assert recorded[2].replay._operations.host_calls == (1 if recorded[2].replay.overlap_refused else 3)
    assert torch.equal(looped[0], recorded[0]), (looped[0], recorded[0])
    for key, value in looped[1].items():
        assert torch.equal(value, recorded[1][key]), key


def test_profiled_replays_enqueue_launch_by_launch_and_say_so() -> None:
    entry = _recording_device()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # (no recording refused)
        *_, step = _train("mlp", entry.label, {"replay_command_buffers": True}, 3)
    with torch_adreno.profile() as prof:
        step(*MODELS["mlp"].batch(torch.Generator().manual_seed(2)))
    assert prof.replayed_steps == 1 and prof.kernel_launches == step.replay.kernel_launches
    assert prof.replay_enqueue == step.replay.enqueue_path
    assert f"enqueued launch by launch here (each launch timed); unprofiled: {step.replay.enqueue_path}" in prof.table()


def test_recordable_queue_runs_are_split_and_enqueued_through_a_stub_of_qualcomms_entry_points(monkeypatch) -> None:
    """No Adreno here: Qualcomm's four entry points are stubs that log their calls, and launches are
    "recorded" on an ordinary queue (they run there). What this checks is ours: launches grouped
    into recordings of at most CL_DEVICE_RECORDABLE_QUEUE_MAX_SIZE, copies, fills and flushes
    between them through the C loop, every call's arguments (the structure launch_list.c reads),
    each recording enqueued with no updates, and each released."""
    from torch_adreno.replay.driver_recording import (
        RECORDABLE_QUEUE,
        DriverRecording,
        RecordedRuns,
        _RecordableQueueApi,
    )
    from torch_adreno.replay.native_loop import native_loop

    loop = native_loop()
    if loop is None:
        pytest.fail("the C loop is not available here")
    calls: list[tuple] = []
    recordings = iter(range(0x1000, 0x2000))

    @ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32))
    def new_recording(queue, status):
        status[0] = 0
        handle = next(recordings)
        calls.append(("new", handle))
        return handle

    @ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p)
    def end_recording(handle):
        calls.append(("end", handle))
        return 0

    @ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p)
    def release_recording(handle):
        calls.append(("release", handle))
        return 0

    @ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                      ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                      ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_void_p)
    def enqueue_recording(queue, handle, *updates):
        calls.append(("enqueue", handle, tuple(u or 0 for u in updates)))
        return 0

    stubs = [new_recording, end_recording, release_recording, enqueue_recording]
    api = _RecordableQueueApi(*(ctypes.cast(f, ctypes.c_void_p).value for f in stubs))
    recording = DriverRecording(RECORDABLE_QUEUE, "stub entry points", api, loop, max_launches=2)
    context = cl.create_some_context(interactive=False)
    queue, recorded_on = cl.CommandQueue(context), cl.CommandQueue(context)
    monkeypatch.setattr(RecordedRuns, "_recordable", lambda self: recorded_on.int_ptr)
    kernel = cl.Kernel(cl.Program(context, _SOURCE).build(), "affine")
    first = cl.Buffer(context, cl.mem_flags.READ_WRITE, 256)
    second = cl.Buffer(context, cl.mem_flags.READ_WRITE, 256)
    kernel.set_arg(0, first)
    launch = Launch(kernel, (64,), None)
    seen: list[int] = []
    listed = LaunchList(queue, [launch, launch, launch, Copy(first, second, 0, 0, 64), Flush(), launch,
                                lambda q: seen.append(1), launch], recording=recording)
    assert listed.recorded == RECORDABLE_QUEUE
    # Recorded: launches 0-1, launch 2 (at most 2 a recording), launch 5, launch 7.
    assert [c[0] for c in calls] == ["new", "end"] * 4
    del calls[:]
    listed()
    no_updates = (0,) * 11
    assert calls == [("enqueue", 0x1000, no_updates), ("enqueue", 0x1001, no_updates),
                     ("enqueue", 0x1002, no_updates), ("enqueue", 0x1003, no_updates)]
    assert seen == [1] and listed.host_calls == 6  # 4 recordings, the copy and flush's run, the Python call
    queue.finish()
    del listed
    gc.collect()
    assert sorted(c[1] for c in calls if c[0] == "release") == [0x1000, 0x1001, 0x1002, 0x1003]
