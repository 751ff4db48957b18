"""Kernels rewritten to reach their operands through one arena argument (a replayed step's)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from test_kernels import compile_stages, lenet_program

import torch_adreno
from torch_adreno.kernels.arena_params import (
    ARENA_BUFFER,
    ARENA_PARAM,
    MAX_OFFSET,
    OFFSET_ALIGNMENT,
    OFFSET_SUFFIX,
    ArenaRewriteError,
    arena_buffer,
    arena_param,
    copy_ranges,
    offset_values,
    place_in_arena,
)
from torch_adreno.kernels.params import Role
from torch_adreno.kernels.program import assemble
from torch_adreno.replay.launch_list import Copy
from torch_adreno.runtime.heap import placement


def _kernels():
    _, _, _, program = lenet_program(0)
    _, _, _, backward = lenet_program(1)
    _, _, _, softmax = compile_stages(lambda x: torch.softmax(x, -1) * 2, torch.randn(4, 10))
    return program.kernels + backward.kernels + softmax.kernels


def _macro(source: str, macro: str) -> str:
    """The value of ``#define <macro>`` in ``source`` (one line)."""
    (line,) = [ln for ln in source.splitlines() if ln == f"#define {macro}" or ln.startswith(f"#define {macro} ")]
    return line.removeprefix(f"#define {macro}").strip()


def test_every_kind_of_kernel_takes_the_arena_first_and_declares_its_operands_at_their_offsets():
    kinds = set()
    for kernel in _kernels():
        offsets = {position: 256 * (position + 1) for position in range(0, len(kernel.params), 2)}
        rewritten = place_in_arena(kernel, offsets)
        kinds.add(kernel.kind)
        # Records replaced: the arena first, an offset argument per placed buffer, the placed
        # buffers located in the arena, in place.
        arena, *rest = rewritten.arguments
        assert (arena.key, arena.c_name, arena.role, arena.is_argument) == (ARENA_BUFFER, ARENA_PARAM, Role.ARENA, True)
        offset_records, rest = rest[:len(offsets)], rest[len(offsets):]
        assert {r.role for r in offset_records} == {Role.ARENA_OFFSET}
        assert [dataclasses.replace(r, located=None) for r in rest] == list(kernel.arguments)
        assert rewritten.params == (ARENA_BUFFER, *(p for i, p in enumerate(kernel.params) if i not in offsets))
        assert offset_values(kernel, offsets) == tuple(offsets[p] // OFFSET_ALIGNMENT for p in sorted(offsets))
        # The text is the kernel's own; the macros are rendered from the new records.
        assert rewritten.text == kernel.text
        signature = _macro(rewritten.source, "KERNEL_PARAMS").split(", ")
        locals_ = _macro(rewritten.source, "KERNEL_LOCALS")
        buffers = [r for r in kernel.arguments if r.role is Role.BUFFER]
        assert signature[0] == f"__global uchar* {ARENA_PARAM}"
        assert signature[1:1 + len(offsets)] == [f"const int {buffers[p].c_name}{OFFSET_SUFFIX}" for p in sorted(offsets)]
        for position, record in enumerate(buffers):
            declaration = record.declaration()
            if position in offsets:
                assert declaration not in signature
                pointer = record.pointer_type()
                assert (f"{declaration} = ({pointer})({ARENA_PARAM} + (size_t){record.c_name}{OFFSET_SUFFIX} * "
                        f"{OFFSET_ALIGNMENT}UL);") in locals_
            else:
                assert declaration in signature and declaration not in locals_, (kernel.name, declaration)
        assert _macro(kernel.source, "KERNEL_LOCALS") == ""
        assert assemble([rewritten])  # one program source, as the replay builds it
        # Other offsets of the same operands: the same function (a repeated block's kernel).
        elsewhere = place_in_arena(kernel, {p: at + 4096 for p, at in offsets.items()})
        assert elsewhere.content() == rewritten.content()
        assert offset_values(kernel, {p: at + 4096 for p, at in offsets.items()}) != offset_values(kernel, offsets)
    assert {"gemm", "pointwise", "reduction"} <= kinds


def test_operands_in_several_arenas_take_one_argument_per_arena_first():
    kernel = next(k for k in _kernels() if len(k.params) >= 3)
    rewritten = place_in_arena(kernel, {0: 512, 1: 0, 2: 256}, {0: 1, 1: 0, 2: 1})
    signature = _macro(rewritten.source, "KERNEL_PARAMS")
    assert signature.split(", ")[:2] == [f"__global uchar* {arena_param(0)}", f"__global uchar* {arena_param(1)}"]
    assert rewritten.params[:2] == (arena_buffer(0), arena_buffer(1))
    assert rewritten.params[2:] == kernel.params[3:]
    names = [r.c_name for r in kernel.arguments if r.role is Role.BUFFER]
    locals_ = _macro(rewritten.source, "KERNEL_LOCALS")
    for position, base in ((0, 1), (1, 0), (2, 1)):
        assert f"({arena_param(base)} + (size_t){names[position]}{OFFSET_SUFFIX} * 16UL)" in locals_
    assert offset_values(kernel, {0: 512, 1: 0, 2: 256}) == (32, 0, 16)
    # Which arena an operand is in is part of the function; its offset is not.
    assert place_in_arena(kernel, {0: 0, 1: 0, 2: 0}, {0: 1, 1: 0, 2: 1}).content() == rewritten.content()
    assert place_in_arena(kernel, {0: 512, 1: 0, 2: 256}, {0: 0, 1: 1, 2: 1}).content() != rewritten.content()
    with pytest.raises(ArenaRewriteError, match=r"arenas \[1\] are not numbered 0\.\.n-1"):
        place_in_arena(kernel, {0: 0}, {0: 1})


def test_copy_ranges_copies_each_range_in_its_widest_unit_and_names_it():
    source = copy_ranges("replay_copies_0", [(0, 256, 1, 0, 64), (1, 512, 0, 1024, 12), (0, 4096, 0, 8192, 3)],
                         ["f.primals_5 <- f.buf1", "f.primals_6 <- f.buf2", "f.primals_7 <- f.buf3"])
    text = source.source
    assert [(r.key, r.c_name, r.role) for r in source.arguments] == [
        (arena_buffer(0), arena_param(0), Role.ARENA), (arena_buffer(1), arena_param(1), Role.ARENA)]
    assert f"#define KERNEL_PARAMS __global uchar* {arena_param(0)}, __global uchar* {arena_param(1)}" in text
    assert "__kernel void KERNEL_NAME(KERNEL_PARAMS)" in text and source.symbol == "replay_copies_0"
    assert f"if (i < 4UL) ((__global uint4*)({arena_param(0)} + 256UL))[i] = " \
           f"((__global const uint4*)({arena_param(1)} + 0UL))[i];" in text
    assert "if (i < 3UL) ((__global uint*)" in text and "if (i < 3UL) ((__global uchar*)" in text
    assert "// f.primals_6 <- f.buf2 (12 bytes)" in text
    assert source.params == (arena_buffer(0), arena_buffer(1)) and source.global_size == (64,)
    assert source.bytes_read == source.bytes_written == 79
    with pytest.raises(ArenaRewriteError, match="not at offsets that are multiples of 16"):
        copy_ranges("c", [(0, 8, 0, 256, 4)], ["x"])
    with pytest.raises(ArenaRewriteError, match="not numbered"):
        copy_ranges("c", [(1, 0, 1, 256, 4)], ["x"])


def test_nothing_moved_is_the_kernel_itself():
    kernel = _kernels()[0]
    assert place_in_arena(kernel, {}) is kernel


def test_bad_offsets_and_positions_are_refused_with_the_kernel_named():
    kernel = _kernels()[0]
    with pytest.raises(ArenaRewriteError, match=f"kernel {kernel.name}: offset 8 is not a multiple of 16"):
        place_in_arena(kernel, {0: 8})
    assert offset_values(kernel, {0: MAX_OFFSET}) == (2**31 - 1,)  # an int's largest
    with pytest.raises(ArenaRewriteError, match=f"kernel {kernel.name}: offset {MAX_OFFSET + 16} is outside"):
        place_in_arena(kernel, {0: MAX_OFFSET + 16})
    with pytest.raises(ArenaRewriteError, match="no buffer argument 99"):
        place_in_arena(kernel, {99: 0})


def _losses_and_state(arena: bool, zero_copy, steps: int = 6):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Dropout(0.25),
                                torch.nn.Linear(32, 8))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    step = torch_adreno.TrainingStep(model, lambda m, x, y: F.cross_entropy(m(x), y), opt,
                                     options={"zero_copy": zero_copy, "replay_arena_kernels": arena})
    generator = torch.Generator().manual_seed(1)
    torch.manual_seed(2)  # the dropout masks
    losses = [step(torch.randn(16, 12, generator=generator), torch.randint(0, 8, (16,), generator=generator))
              for _ in range(steps)]
    step.synchronize()
    assert step.replayed_steps == steps - 2
    return torch.stack(losses), [p.detach().clone() for p in model.parameters()], step.replay


@pytest.mark.device
@pytest.mark.parametrize("zero_copy", [False, "auto"], ids=["uploaded-batch", "batch-in-place"])
def test_replay_addressing_its_arena_is_bit_identical_to_the_kernels_as_compiled(zero_copy) -> None:
    """Seeds (dropout), the index check record (cross entropy), the batch (copied into the arena,
    or bound in place) and Adam's segmented update: the same bits whether the replay's kernels take
    the arena or each operand as an argument, with far fewer arguments."""
    arena_losses, arena_state, arena_replay = _losses_and_state(True, zero_copy)
    plain_losses, plain_state, plain_replay = _losses_and_state(False, zero_copy)
    assert torch.equal(arena_losses, plain_losses)
    assert all(torch.equal(a, b) for a, b in zip(arena_state, plain_state, strict=True))
    assert arena_replay.kernel_arguments < plain_replay.kernel_arguments * 0.75
    assert arena_replay.offset_arguments > 0 and plain_replay.offset_arguments == 0
    # Every launch of the arena replay was rewritten (one argument fewer per operand it holds), none
    # of the other's.
    assert all(arena_replay._bound.rewritten) and not any(plain_replay._bound.rewritten)
    assert [k.num_args for _, _, k in plain_replay._launches] == [
        len(s.params) + 2 * s.checks_indices for _, s, _ in plain_replay._launches]
    # A heap region where the parameters are device copies in the heap; with zero-copy (host memory
    # shared in place) a buffer of its own: a slab would only reserve memory.
    assert (placement(arena_replay._buffers.arenas[0]) is None) == arena_replay.residency.zero_copy
    if zero_copy is False:
        # Parameters and Adam's state are device heap regions in the arena's slab: each launch takes
        # that slab and nothing else (but the index check's record and token), except the one
        # reading the loss's tangent (an input of the backward graph, a buffer of its own) and the
        # two update kernels reading the step's scalar inputs (Adam's learning rate, betas and eps:
        # 0-dim tensors of their own, :mod:`torch_adreno.training.hyperparameters`).
        offset_arguments = arena_replay._bound.operations.offset_arguments
        extra = [k.num_args - offsets - 1 - 2 * s.checks_indices
                 for (_, s, k), offsets in zip(arena_replay._launches, offset_arguments, strict=True)]
        assert sorted(e for e in extra if e) == [1, 2, 3], sorted(extra)
        assert len(arena_replay._bound.slabs) == 1


@pytest.mark.device
def test_batch_norm_write_backs_are_one_launch_and_bit_identical() -> None:
    """Copy mode: each batch norm's running statistics are written back by a copy the forward graph
    makes; a replay does the run of them in one kernel between heap regions, with the same bits
    (losses, parameters and running statistics) as the kernels and copies as compiled."""
    results = []
    for arena in (True, False):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 8))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        step = torch_adreno.TrainingStep(model, lambda m, x, y: F.cross_entropy(m(x), y), opt,
                                         options={"zero_copy": False, "replay_arena_kernels": arena})
        generator = torch.Generator().manual_seed(1)
        losses = [step(torch.randn(16, 12, generator=generator), torch.randint(0, 8, (16,), generator=generator))
                  for _ in range(6)]
        step.synchronize()
        assert step.replayed_steps == 4
        results.append((torch.stack(losses), [t.clone() for t in model.state_dict().values()], step.replay))
    (arena_losses, arena_state, arena_replay), (plain_losses, plain_state, plain_replay) = results
    assert torch.equal(arena_losses, plain_losses)
    assert all(torch.equal(a, b) for a, b in zip(arena_state, plain_state, strict=True))
    copies = [s for _, s, _ in arena_replay._launches if s.kind == "copies"]
    assert len(copies) == 1 and copies[0].source.count("// ") == 2  # one write-back per norm
    assert arena_replay.kernel_launches == plain_replay.kernel_launches + 1

    def is_copy(operation):
        return isinstance(operation, Copy)

    # Copies but the overlapped step's landing copy of the batch (its first operation, where it applies).
    landing = [len(r._overlap.head) if r._overlap is not None else 0 for r in (arena_replay, plain_replay)]
    assert landing[0] == landing[1]
    assert sum(map(is_copy, arena_replay._operations.operations)) == landing[0]
    assert sum(map(is_copy, plain_replay._operations.operations)) == 2 + landing[1]
