"""Kernels carry parameter records; their source is rendered from the records (no device)."""

from __future__ import annotations

import dataclasses

import torch
from test_kernels import compile_stages, lenet_program

from torch_adreno import ir
from torch_adreno.kernels import render_program
from torch_adreno.kernels.arena_params import (
    ARENA_PARAM,
    OFFSET_ALIGNMENT,
    OFFSET_SUFFIX,
    arena_buffer,
    place_in_arena,
)
from torch_adreno.kernels.choices import KernelChoices
from torch_adreno.kernels.params import ArenaLocation, Role
from torch_adreno.kernels.program import RECORD_MACROS, assemble
from torch_adreno.runtime.tuning import kernel_key
from torch_adreno.targets import REFERENCE_PROFILE


def _kernels():
    """Kernels of every kind, their graphs renamed as numbered ones (names change, text does not)."""
    _, _, _, forward = lenet_program(0)
    _, _, _, backward = lenet_program(1)
    _, _, _, gather = compile_stages(lambda x, i: x[i] * 2, torch.randn(6, 3), torch.tensor([0, 5, 2]))
    _, _, _, softmax = compile_stages(lambda x: torch.softmax(x, -1) * 2, torch.randn(4, 10))
    programs = [forward.renamed("forward_12"), backward.renamed("backward_12"), gather.renamed("forward_13"),
                softmax.renamed("forward_14")]
    assert [k.source for k in programs[0].kernels] == [k.source for k in forward.kernels]
    return [k for program in programs for k in program.kernels]


def _define(source: str, macro: str) -> str:
    (line,) = [ln for ln in source.splitlines() if ln == f"#define {macro}" or ln.startswith(f"#define {macro} ")]
    return line.removeprefix(f"#define {macro}").strip()


def test_the_signature_and_symbol_are_rendered_from_the_records():
    kinds = set()
    for kernel in _kernels():
        kinds.add(kernel.kind)
        source = kernel.source
        assert source == kernel.render()
        assert _define(source, "KERNEL_NAME") == kernel.symbol
        assert _define(source, "KERNEL_PARAMS") == ", ".join(r.declaration() for r in kernel.arguments)
        assert _define(source, "KERNEL_LOCALS") == ""
        # The text takes its signature and name through the macros only: the symbol is in one
        # #define line (and the header comment), no parameter is declared in it.
        assert kernel.symbol not in kernel.text and kernel.name not in source
        assert [ln for ln in source.splitlines() if kernel.symbol in ln and not ln.startswith("//")] == [
            f"#define KERNEL_NAME {kernel.symbol}"]
        assert "KERNEL_NAME(KERNEL_PARAMS)" in kernel.text and "KERNEL_LOCALS" in kernel.text
        # params: the IR buffer of each buffer argument, in order, then index checks and images.
        assert kernel.params == tuple(r.key for r in kernel.arguments if r.role is Role.BUFFER)
        roles = [r.role for r in kernel.arguments]
        assert roles == sorted(roles, key=[Role.BUFFER, Role.INDEX_ERROR, Role.INDEX_TOKEN, Role.IMAGE].index)
        assert kernel.checks_indices == (Role.INDEX_ERROR in roles)
        # What it writes is declared writable (a split GEMM's launches share the group's list).
        assert set(kernel.writes) <= set(kernel.writable) <= set(kernel.params)
        assert all(r.dtype in ir.DType for r in kernel.arguments)
    assert {"gemm", "pointwise", "reduction"} <= kinds
    assert any(k.checks_indices for k in _kernels())


def test_changing_a_record_changes_the_signature_and_nothing_else():
    kernel = next(k for k in _kernels() if k.kind == "gemm")
    first = kernel.arguments[0]
    aliased = dataclasses.replace(kernel, arguments=(dataclasses.replace(first, aliased=not first.aliased),
                                                     *kernel.arguments[1:]))
    before, after = kernel.source.splitlines(), aliased.source.splitlines()
    changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert len(changed) == 1 and changed[0][0].startswith("#define KERNEL_PARAMS ")
    assert ("restrict" in changed[0][0].split(",")[0]) != ("restrict" in changed[0][1].split(",")[0])
    # Renaming is a record change too: the symbol is in the #define line and the header only.
    renamed = dataclasses.replace(kernel, name="x_1_gemm", symbol="x_1_gemm")
    assert renamed.source.replace("x_1_gemm", kernel.symbol) == kernel.source
    assert renamed.text == kernel.text


def test_place_in_arena_replaces_records_and_keeps_the_text():
    for kernel in _kernels():
        offsets = {0: 0, len(kernel.params) - 1: 256} if len(kernel.params) > 1 else {0: 0}
        placed = place_in_arena(kernel, offsets)
        assert placed.text == kernel.text
        assert placed.arguments[0].role is Role.ARENA and placed.params[0] == arena_buffer(0)
        located = [r for r in placed.arguments if not r.is_argument]
        buffers = [r for r in kernel.arguments if r.is_argument and r.role is Role.BUFFER]
        assert [(r.key, r.located) for r in located] == [
            (kernel.params[p], ArenaLocation(ARENA_PARAM, buffers[p].c_name + OFFSET_SUFFIX, OFFSET_ALIGNMENT))
            for p in sorted(offsets)]
        assert _define(placed.source, "KERNEL_LOCALS") == " ".join(r.local_declaration() for r in located)
        assert _define(placed.source, "KERNEL_PARAMS") == ", ".join(
            r.declaration() for r in placed.arguments if r.is_argument)
        assert placed.checks_indices == kernel.checks_indices
        source, _ = assemble([placed])
        assert all(f"#undef {macro}" in source for macro in RECORD_MACROS)


def test_the_tuning_key_ignores_name_symbol_and_header_not_the_records():
    kernel = next(k for k in _kernels() if k.kind == "pointwise")
    key = kernel_key(kernel)
    assert kernel_key(dataclasses.replace(kernel, name="other_7_pw", symbol="other_7_pw", origins=())) == key
    first = kernel.arguments[0]
    changed = dataclasses.replace(kernel, arguments=(dataclasses.replace(first, aliased=not first.aliased),
                                                     *kernel.arguments[1:]))
    assert kernel_key(changed) != key


def test_an_image_operand_is_a_record_after_the_buffers():
    _, fused, plan, _ = compile_stages(torch.mm, torch.randn(32, 16), torch.randn(16, 24))
    (kernel,) = render_program(fused, plan, REFERENCE_PROFILE,
                                 dataclasses.replace(KernelChoices.for_device(REFERENCE_PROFILE), images=True)).kernels
    assert kernel.images, "the operands fit images"
    images = [r for r in kernel.arguments if r.role is Role.IMAGE]
    assert [r.key for r in images] == [i.buffer for i in kernel.images]
    assert kernel.arguments[-len(images):] == tuple(images) and len(kernel.params) == len(kernel.arguments) - len(images)
    assert _define(kernel.source, "KERNEL_PARAMS").endswith(", ".join(f"__read_only image2d_t {r.c_name}" for r in images))
