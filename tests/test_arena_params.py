"""Kernels rewritten to reach their operands through one arena argument (a replayed step's)."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from test_kernels import compile_stages, lenet_program

import torch_adreno
from torch_adreno.kernels.arena_params import ARENA_BUFFER, ARENA_PARAM, ArenaRewriteError, place_in_arena
from torch_adreno.kernels.program import assemble
from torch_adreno.runtime import replay as replay_module


def _kernels():
    _, _, _, program = lenet_program(0)
    _, _, _, backward = lenet_program(1)
    _, _, _, softmax = compile_stages(lambda x: torch.softmax(x, -1) * 2, torch.randn(4, 10))
    return program.kernels + backward.kernels + softmax.kernels


def _signature(source: str, name: str) -> str:
    macro = re.search(r"^#define KERNEL_PARAMS (.*)$", source, re.MULTILINE)
    if macro:
        return macro.group(1)
    return re.search(rf"void {re.escape(name)}\((.*?)\)\s*{{", source, re.DOTALL).group(1)


def test_every_kind_of_kernel_takes_the_arena_first_and_declares_its_operands_at_their_offsets():
    kinds = set()
    for kernel in _kernels():
        offsets = {position: 256 * (position + 1) for position in range(0, len(kernel.params), 2)}
        rewritten = place_in_arena(kernel, offsets)
        kinds.add(kernel.kind)
        signature = _signature(rewritten.source, kernel.name)
        assert signature.split(",")[0].strip() == f"__global uchar* {ARENA_PARAM}"
        assert rewritten.params == (ARENA_BUFFER, *(p for i, p in enumerate(kernel.params) if i not in offsets))
        old_declarations = [d.strip() for d in _signature(kernel.source, kernel.name).split(",")]
        for position, declaration in enumerate(old_declarations[:len(kernel.params)]):
            name = declaration.split()[-1]
            if position in offsets:
                assert declaration not in signature
                pointer = declaration.rsplit(" ", 1)[0].replace(" restrict", "")
                assert f"{declaration} = ({pointer})({ARENA_PARAM} + {offsets[position]}UL);" in rewritten.source
            else:
                assert re.search(rf"\b{name}\b", signature), (kernel.name, name)
        # The computation is untouched: the original body follows the inserted declarations.
        body = kernel.source[kernel.source.index("{", kernel.source.index(f"{kernel.name}(")
                                                 if "KERNEL_PARAMS" not in kernel.source
                                                 else kernel.source.index("(KERNEL_PARAMS)")) + 1:]
        assert rewritten.source.endswith(body)
        assert assemble([rewritten])  # one program source, as the replay builds it
    assert {"gemm", "pointwise", "reduction"} <= kinds


def test_nothing_moved_is_the_kernel_itself():
    kernel = _kernels()[0]
    assert place_in_arena(kernel, {}) is kernel


def test_bad_offsets_and_positions_are_refused_with_the_kernel_named():
    kernel = _kernels()[0]
    with pytest.raises(ArenaRewriteError, match=f"kernel {kernel.name}: offset 8 is not a multiple of 16"):
        place_in_arena(kernel, {0: 8})
    with pytest.raises(ArenaRewriteError, match="no buffer argument 99"):
        place_in_arena(kernel, {99: 0})


def _losses_and_state(arena: bool, zero_copy, steps: int = 6):
    replay_module.ARENA_KERNELS = arena
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Dropout(0.25),
                                    torch.nn.Linear(32, 8))
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        step = torch_adreno.TrainingStep(model, lambda m, x, y: F.cross_entropy(m(x), y), opt,
                                         options={"zero_copy": zero_copy})
        generator = torch.Generator().manual_seed(1)
        torch.manual_seed(2)  # the dropout masks
        losses = [step(torch.randn(16, 12, generator=generator), torch.randint(0, 8, (16,), generator=generator))
                  for _ in range(steps)]
        step.synchronize()
        assert step.replayed_steps == steps - 2
        return torch.stack(losses), [p.detach().clone() for p in model.parameters()], step.replay
    finally:
        replay_module.ARENA_KERNELS = True


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
    # Every launch of the arena replay was rewritten (one argument fewer per operand it holds), none
    # of the other's.
    assert all(arena_replay._rewritten) and not any(plain_replay._rewritten)
    assert [k.num_args for _, _, k in plain_replay._launches] == [
        len(s.params) + 2 * s.checks_indices for _, s, _ in plain_replay._launches]
    if zero_copy is False:
        # Parameters and Adam's state are device heap regions in the arena's slab: each launch takes
        # that slab and nothing else (but the index check's record and token).
        assert [k.num_args for _, _, k in arena_replay._launches] == [
            1 + 2 * s.checks_indices for _, s, _ in arena_replay._launches]
        assert len(arena_replay._bases) == 1
