"""Frozen weights under autocast: cast to 16 bits once and kept (not per step), edits seen; and
``torch_adreno.freeze``, which stores them in 16 bits from the start.

The model is a LoRA fine-tuning in miniature: a frozen base (token table, projection, norm, a head
tied to the table) and a trainable low-rank adapter. Device tests on PoCL; the frozen copies are
compared with ``frozen_casts=False`` (the cast made in the kernels that read the weight), which
must give the same bits.
"""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_adreno
from torch_adreno.replay.capture import PERSISTENT
from torch_adreno.runtime.frozen import FROZEN_COPIES

VOCAB, D, RANK, BATCH, SEQ = 64, 48, 4, 2, 8
BF16 = torch.bfloat16


class Adapted(nn.Module):
    """``head(norm(relu(proj(x) + B(A(x)))))`` over ``x = table[tokens]``, the head tied to the table;
    only the adapter (A, B) trains."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(VOCAB, D)
        self.proj = nn.Linear(D, D)
        self.norm = nn.LayerNorm(D)
        self.lora_a = nn.Linear(D, RANK, bias=False)
        self.lora_b = nn.Linear(RANK, D, bias=False)
        self.head = nn.Linear(D, VOCAB, bias=False)
        self.head.weight = self.table.weight
        for name, p in self.named_parameters():
            p.requires_grad_(name.startswith("lora_"))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.table(tokens)
        return self.head(self.norm(torch.relu(self.proj(x) + self.lora_b(self.lora_a(x)))))


def _model(seed: int = 0) -> Adapted:
    torch.manual_seed(seed)
    return Adapted()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g), torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def _loss(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor, dtype: torch.dtype | None = BF16) -> torch.Tensor:
    """Cross-entropy of the next tokens, the model run under autocast of ``dtype`` (None: as it is)."""
    with torch.autocast("cpu", dtype=dtype or BF16, enabled=dtype is not None):
        logits = model(tokens).reshape(-1, VOCAB)
    return F.cross_entropy(logits.float() if dtype is not None else logits, targets.reshape(-1))


def _trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def _steps(model: nn.Module, steps: int, **options: object) -> tuple[list[torch.Tensor], list[torch_adreno.profile],
                                                                    list[int], torch_adreno.TrainingStep]:
    """``steps`` TrainingSteps (SGD) under bfloat16 autocast, each profiled: losses, profiles, and
    the frozen copies made before each step and after the last."""
    step = torch_adreno.TrainingStep(model, _loss, torch.optim.SGD(_trainable(model), lr=0.5), options)
    losses, profiles, made = [], [], [FROZEN_COPIES.copies_made]
    for _ in range(steps):
        with torch_adreno.profile() as prof:
            losses.append(step(*_batch()))
        profiles.append(prof)
        made.append(FROZEN_COPIES.copies_made)
    return losses, profiles, made, step


def test_frozen_casts_are_made_once_and_the_gemms_read_16_bits_with_the_same_results():
    torch._dynamo.reset()
    off_model, on_model = _model(), _model()
    off, off_profiles, _, off_step = _steps(off_model, 4, frozen_casts=False)
    on, on_profiles, made, on_step = _steps(on_model, 4)
    # The copies (proj.weight, proj.bias, the head's view of the table) are made in the first
    # step, then never again: the replayed steps find them current.
    assert made[1] - made[0] == 3 and made[4] == made[1], made
    assert [p.replayed_steps for p in on_profiles] == [0, 0, 1, 1]
    assert [float(x) for x in on] == [float(x) for x in off]
    on_step.synchronize()
    off_step.synchronize()
    assert all(torch.equal(p, q) for p, q in zip(_trainable(on_model), _trainable(off_model), strict=True))
    # A replayed step reads 16-bit weights: 2 bytes an element fewer for proj.weight (the forward)
    # and the table as the head reads it (forward and backward).
    saved = off_profiles[-1].bytes_kernel_read - on_profiles[-1].bytes_kernel_read
    assert saved >= 2 * (D * D + 2 * VOCAB * D), (saved, off_profiles[-1].bytes_kernel_read)
    # The replay binds the copies (bfloat16) and watches their sources.
    identities = on_step.replay.recording.identities
    copies = [i for i in identities if i.kind is PERSISTENT and i.copy_of is not None]
    assert {id(i.copy_of) for i in copies} == {id(on_model.proj.weight), id(on_model.proj.bias),
                                              id(on_model.table.weight)}
    assert all(i.tensor.dtype is BF16 for i in copies)

    # An edit of a frozen weight on the host is seen: in place (one copy made again), then through
    # load_state_dict (which writes every tensor: all three).
    for edit, remade in ((lambda m: m.proj.weight.mul_(-1.5), 1),
                         (lambda m: m.load_state_dict({**m.state_dict(), "proj.bias": torch.full((D,), 0.25)}), 3)):
        with torch.no_grad():
            edit(on_model)
            edit(off_model)
        before = FROZEN_COPIES.copies_made
        with torch_adreno.profile() as prof:
            edited = on_step(*_batch())
        assert float(edited) == float(off_step(*_batch()))
        assert FROZEN_COPIES.copies_made == before + remade
        assert prof.replayed_steps == 0 and prof.replay_fallbacks[0].endswith("was changed on the host"), \
            prof.replay_fallbacks
    assert float(edited) != float(on[-1])


def test_compiled_loop_and_inference_read_the_current_copies():
    """A plain torch.compile training loop and an inference call (no_grad: the inference graph)."""
    torch._dynamo.reset()
    gc.collect()  # (copies other tests' graphs left for the collector)
    before = len(FROZEN_COPIES)
    tokens, targets = _batch()
    results = {}
    for frozen_casts in (False, True):
        model = _model()
        compiled = torch.compile(model, backend="adreno", options={"frozen_casts": frozen_casts})
        opt = torch.optim.SGD(_trainable(model), lr=0.5)
        losses = []
        for edit in (None, 2.0):
            if edit is not None:
                with torch.no_grad():
                    model.proj.weight.mul_(edit)
            opt.zero_grad()
            with torch_adreno.profile() as prof:
                loss = _loss(compiled, tokens, targets)
                loss.backward()
            opt.step()
            losses.append(float(loss))
            with torch.no_grad(), torch.autocast("cpu", dtype=BF16), torch_adreno.profile() as inference:
                logits = compiled(tokens)
            assert any(k.graph.startswith("inference") for k in inference.kernels)
        results[frozen_casts] = losses, logits, prof.bytes_kernel_read
        with torch.no_grad(), torch.autocast("cpu", dtype=BF16):
            eager = model(tokens)
        torch.testing.assert_close(logits.float(), eager.float(), rtol=2e-2, atol=2e-2)
    # The copies live as long as the graphs that read them (the loss's autograd graph holds them too).
    live = len(FROZEN_COPIES)
    del compiled, loss
    torch._dynamo.reset()
    gc.collect()
    assert live == before + 3 and len(FROZEN_COPIES) == before
    assert results[True][0] == results[False][0] and results[True][0][0] != results[True][0][1]
    assert torch.equal(results[True][1], results[False][1])
    assert results[True][2] < results[False][2]


def test_freeze_halves_the_frozen_state_and_trains_as_eager_autocast():
    torch._dynamo.reset()
    reference = _model()
    model = _model()
    float32_bytes = {name: p.numel() * 4 for name, p in model.named_parameters()}
    report = torch_adreno.freeze(model, BF16)
    assert report.converted == ["table.weight", "proj.weight", "proj.bias"]
    assert set(report.kept) == {"norm.weight", "norm.bias"} and "LayerNorm" in report.kept["norm.weight"]
    assert model.head.weight is model.table.weight and model.table.weight.dtype is BF16
    assert report.bytes_after * 2 == report.bytes_before + 2 * D * 4  # the norm's two vectors stay float32
    assert all(p.dtype is torch.float32 for p in _trainable(model))

    # As eager autocast computes on the frozen model, within twice eager's distance from float64.
    step = torch_adreno.TrainingStep(model, _loss, torch.optim.SGD(_trainable(model), lr=0.5), {"zero_copy": False})
    ours = [float(step(*_batch())) for _ in range(3)]
    step.synchronize()
    eager_model, f64_model = _model(), _model()
    for m in (eager_model, f64_model):
        m.load_state_dict(model.state_dict() | {n: p for n, p in reference.state_dict().items() if "lora" in n})
    torch_adreno.freeze(eager_model, BF16)
    f64_model.double()
    for m, dtype in ((eager_model, BF16), (f64_model, None)):
        opt = torch.optim.SGD(_trainable(m), lr=0.5)
        for _ in range(3):
            opt.zero_grad()
            _loss(m, *_batch(), dtype=dtype).backward()
            opt.step()
    for p, q, r in zip(_trainable(model), _trainable(eager_model), _trainable(f64_model), strict=True):
        ours_error, eager_error = float((p.double() - r).abs().max()), float((q.double() - r).abs().max())
        assert ours_error <= 2 * eager_error + 1e-6, (ours_error, eager_error)
    assert ours[-1] < ours[0]

    # On the device (copy mode), the frozen state is half the float32 one: the replay binds the
    # 16-bit parameters themselves, and no copy of them.
    persistent = {id(i.tensor): i.nbytes for i in step.replay.recording.identities if i.kind is PERSISTENT}
    for name in report.converted:
        tensor = model.get_parameter(name)
        assert persistent[id(tensor)] * 2 == float32_bytes[name], name
    assert not any(i.copy_of is not None for i in step.replay.recording.identities)


def test_freeze_refuses_what_it_cannot_store_and_requires_autocast():
    with pytest.raises(ValueError, match=r"dtype must be torch\.float16 or torch\.bfloat16, got torch\.float32"):
        torch_adreno.freeze(_model(), torch.float32)
    with pytest.raises(TypeError, match=r"takes an nn\.Module"):
        torch_adreno.freeze(torch.zeros(3), BF16)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no frozen parameter"):
        torch_adreno.freeze(nn.Linear(4, 4), BF16)
    norm = nn.LayerNorm(4).requires_grad_(False)
    with pytest.raises(ValueError, match=r"none it can store in 16 bits.*LayerNorm"):
        torch_adreno.freeze(norm, BF16)
    model = _model()
    torch_adreno.freeze(model, BF16)
    assert torch_adreno.freeze(model, BF16).converted == []  # again with the same dtype: nothing new
    with pytest.raises(ValueError, match=r"already stored as torch\.bfloat16"):
        torch_adreno.freeze(model, torch.float16)
    with pytest.raises(RuntimeError, match=r"proj holds weights .* torch.autocast\('cpu', dtype=torch.bfloat16\)"):
        model(_batch()[0])
