"""Saved views (``frontend.saved_views``): the forward returns a permuted view's base, not a copy of
the view, and the backward takes the view again; gradients stay eager's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_matches_eager
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils.checkpoint import CheckpointPolicy

import torch_adreno.frontend.partition as partition
import torch_adreno.frontend.saved_views as saved_views
from torch_adreno.frontend.saved_views import recompute_saved_views


def _attention(x: torch.Tensor, w_qkv: torch.Tensor, w_out: torch.Tensor, heads: int = 2) -> torch.Tensor:
    """A GPT-2 LoRA block's attention: one fused projection, split; queries and values get a term of
    their own added (the adapters), keys stay a slice of the projection; heads moved to dimension 1."""
    batch, seq, d = x.shape
    q, k, v = (x @ w_qkv).split(d, dim=2)
    q, v = q * 1.5, v + 0.5
    q, k, v = (t.reshape(batch, seq, heads, d // heads).transpose(1, 2) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.transpose(1, 2).reshape(batch, seq, d) @ w_out


#: Bytes of one of q, k, v.
VIEW_BYTES = 2 * 8 * 16 * 4


def _inputs() -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    return torch.randn(2, 8, 16), torch.randn(16, 48) * 0.2, torch.randn(16, 16) * 0.2


def _with_ratio(monkeypatch, ratio: int) -> None:
    """The backend's pass with another base ratio (the compile cache does not see it: callers
    compile without it)."""
    monkeypatch.setattr(partition, "recompute_saved_views",
                        lambda joint: recompute_saved_views(joint, max_base_ratio=ratio))


def _forward_bytes_written(monkeypatch, ratio: int, options: dict | None = None) -> int:
    _with_ratio(monkeypatch, ratio)
    torch._dynamo.reset()
    prof = assert_matches_eager(_attention, *_inputs(), options={"compile_cache": False, **(options or {})})
    assert prof.kernels and all(k.graph.startswith(("forward", "backward")) for k in prof.kernels)
    return sum(k.bytes_written for k in prof.kernels if k.graph.startswith("forward"))


def test_saved_transposed_views_are_not_copied_unless_their_base_is_larger(monkeypatch):
    """Gradients are eager's whatever is saved. With no view remade (ratio 0), the forward writes
    copies of q, k, v and of the attention's output with its heads moved back (w_out's gradient
    reads it) for the backward; by default (1), only the keys' (a third of the projection); with
    the projection allowed as a base (3), none."""
    assert saved_views.MAX_BASE_ELEMENTS_RATIO == 1
    none_remade = _forward_bytes_written(monkeypatch, 0)
    default = _forward_bytes_written(monkeypatch, 1)
    projection_saved = _forward_bytes_written(monkeypatch, 3)
    assert none_remade - default == 3 * VIEW_BYTES
    assert default - projection_saved == VIEW_BYTES


def test_saved_transposes_of_inputs_are_not_copied(monkeypatch):
    """The weights' and the input's transposes the backward's products read: with no view remade at
    all (the pass off), the forward copies x^T, w_qkv^T and w_out^T; with views of inputs remade
    (ratio 0 remakes nothing else), it copies none of them."""
    inputs_remade = _forward_bytes_written(monkeypatch, 0)
    _with_ratio(monkeypatch, 0)
    monkeypatch.setattr(partition, "recompute_saved_views", lambda joint: 0)
    torch._dynamo.reset()
    prof = assert_matches_eager(_attention, *_inputs(), options={"compile_cache": False})
    nothing_remade = sum(k.bytes_written for k in prof.kernels if k.graph.startswith("forward"))
    assert nothing_remade - inputs_remade == sum(t.numel() * 4 for t in _inputs())


def test_attention_reading_keys_and_values_out_of_the_projection_counts_their_bytes_only(monkeypatch):
    """Keys (and, with the projection saved, values) are read in place out of the projection by
    the attention kernel: it moves q, k and v, not the whole projection."""
    _with_ratio(monkeypatch, 3)
    torch._dynamo.reset()

    def keys_and_values_sliced(x: torch.Tensor, w_qkv: torch.Tensor, w_out: torch.Tensor) -> torch.Tensor:
        batch, seq, d = x.shape
        q, k, v = (x @ w_qkv).split(d, dim=2)
        q, k, v = (t.reshape(batch, seq, 2, d // 2).transpose(1, 2) for t in (q * 1.5, k, v))
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, seq, d) @ w_out

    prof = assert_matches_eager(keys_and_values_sliced, *_inputs(), options={"compile_cache": False})
    (attention,) = [k for k in prof.kernels if k.graph.startswith("forward") and k.kind == "attention"]
    assert attention.bytes_read == 3 * VIEW_BYTES, attention


def _marked(fn, *inputs, ratio: int = saved_views.MAX_BASE_ELEMENTS_RATIO) -> dict[str, bool]:
    gm = make_fx(fn)(*inputs)
    recompute_saved_views(gm, max_base_ratio=ratio)
    return {n.name: n.meta.get("recompute") is CheckpointPolicy.MUST_RECOMPUTE
            for n in gm.graph.nodes if n.op == "call_function"}


def test_only_reordering_views_of_tensors_no_larger_or_of_inputs_are_marked():
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = x * 2
        return (y.transpose(0, 1),           # reordering, same size: marked
                y.reshape(4, 16),            # row-major: returned as its buffer anyway
                y[:, :1],                    # an eighth of its base: saving the base would cost more
                x[:, :1].transpose(0, 1))    # a view of an input: the backward has the input

    marks = _marked(fn, torch.randn(8, 8))
    assert marks.pop("mul") is False
    assert marks.pop("transpose") is True
    assert [marks[name] for name in sorted(marks) if name.startswith("view")] == [False], marks
    # y's slice (traced first) is not marked; x's is, with its transpose.
    assert [marks[name] for name in sorted(n for n in marks if n.startswith("slice"))] == [False, True], marks
    assert marks["transpose_1"] is True, marks


@pytest.mark.parametrize("ratio, marked", [(4, True), (2, False)])
def test_a_slice_of_a_fused_projection_is_marked_within_the_ratio(ratio, marked):
    def fn(x: torch.Tensor) -> torch.Tensor:
        return (x * 2)[:, 4:8].transpose(0, 1)  # a third of its base

    marks = _marked(fn, torch.randn(6, 12), ratio=ratio)
    slices = [name for name in marks if name.startswith("slice")]
    assert slices and marks["transpose"] is marked and all(marks[name] is marked for name in slices), marks
