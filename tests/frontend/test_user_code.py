"""What users' traced code holds besides tensor ops: tensor constants and logger calls.

Tensor constants (``torch.tensor([...])`` in a loss or a model: class weights, lookup tables, the
``torch.tensor([])`` every Hugging Face key-value cache starts from) are data the graph carries:
one element is a literal in the kernels, none an empty buffer, more an input buffer the runtime
binds itself, uploaded once (``ir.Graph.constants``), which a replayed step and an ONNX export
bind like any other tensor the step reads. A logger call inside code compiled for this backend is
a no-op instead of a graph break (an error under ``fullgraph=True``, which ``TrainingStep`` uses),
while other backends keep Dynamo's rule.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import capture_graphs
from onnx import numpy_helper

import torch_adreno
from torch_adreno.config import Config
from torch_adreno.errors import LoweringError
from torch_adreno.lowering import lower_graph

pytestmark = pytest.mark.device

CLASS_WEIGHTS = [0.5, 2.0, 1.0, 4.0, 0.25]
_log = logging.getLogger("tests.user_code")


def _weighted_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y, weight=torch.tensor(CLASS_WEIGHTS))


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 5))


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(2)
    return [(torch.randn(8, 6, generator=generator), torch.randint(0, 5, (8,), generator=generator)) for _ in range(n)]


def test_a_tensor_constant_is_a_buffer_the_graph_carries():
    def fn(x):
        return x * torch.tensor([1.0, -2.0, 3.0]) + torch.tensor(0.5)

    gm, = capture_graphs(fn, torch.randn(4, 3))
    graph = lower_graph(gm, Config.from_options({}), "forward_0")
    assert len(graph.constants) == 1  # the scalar is a literal in the kernel
    (name, value), = graph.constants.items()
    assert torch.equal(value, torch.tensor([1.0, -2.0, 3.0])) and name in graph.inputs
    assert graph.inputs[-1] == name and "constant" in str(graph)


def test_constants_through_torch_compile_like_eager():
    def fn(x, i):
        lookup = torch.tensor([[0.5, 1.0, 2.0, 4.0], [1.0, 1.0, 1.0, 1.0], [-1.0, 0.0, 1.0, 2.0]])
        mask = torch.tensor([True, False, True, True])
        empty = torch.tensor([])  # the Hugging Face key-value cache's start: torch.cat skips it
        return torch.cat([empty, (x * lookup[i]).where(mask, x).flatten()]), torch.tensor([7, 8, 9])

    x, i = torch.randn(2, 4), torch.tensor([2, 0])
    compiled = torch.compile(fn, backend="adreno", fullgraph=True, dynamic=False)
    with torch_adreno.profile() as prof:
        for _ in range(2):
            out, ints = compiled(x, i)
            torch.testing.assert_close(out, fn(x, i)[0], rtol=0, atol=0)
            assert torch.equal(ints, torch.tensor([7, 8, 9])) and ints.dtype == torch.int64
            ints += 100  # the caller's copy: the next call still returns the constant
    assert prof.kernel_launches > 0 and prof.host_fallback_ops == []


def test_a_float64_constant_is_refused_naming_it():
    compiled = torch.compile(lambda x: x * torch.tensor([1.0, 2.0], dtype=torch.float64), backend="adreno",
                             fullgraph=True, dynamic=False)
    with pytest.raises(LoweringError, match=r"tensor constant _tensor_constant0 has dtype torch\.float64"):
        compiled(torch.randn(2))


@pytest.mark.parametrize("options", [pytest.param({}, id="default"), pytest.param({"zero_copy": False}, id="copy")])
def test_a_loss_with_class_weights_trains_and_replays_like_eager(options):
    batches = _batches(4)
    eager_model = _model()
    opt = torch.optim.SGD(eager_model.parameters(), lr=0.1, momentum=0.9)
    eager = []
    for x, y in batches:
        opt.zero_grad()
        loss = _weighted_loss(eager_model, x, y)
        loss.backward()
        opt.step()
        eager.append(loss.detach())
    model = _model()
    step = torch_adreno.TrainingStep(model, _weighted_loss, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                     options)
    with torch_adreno.profile() as prof:
        ours = [step(x, y) for x, y in batches]
    step.synchronize()
    assert step.replayed_steps == 2 and prof.replayed_steps == 2
    torch.testing.assert_close(torch.stack(ours), torch.stack(eager), rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), eager_model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    # Copied once into each graph that reads them (the forward and the backward), in the first
    # step; zero-copy (PoCL's default) reads them in place.
    uploads = [(t.graph.split("_")[0], t.nbytes) for t in prof.transfers
               if t.direction == "h2d" and t.copied and "constant" in t.buffer]
    assert sorted(uploads) == ([("backward", 20), ("forward", 20)] if options else [])


def test_an_exported_step_carries_its_constants(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    batches = _batches(4)
    model = _model()
    step = torch_adreno.TrainingStep(model, _weighted_loss, torch.optim.SGD(model.parameters(), lr=0.1))
    step(*batches[0])
    step(*batches[1])
    exported = step.export(tmp_path / "step.onnx")
    constants = [t for t in exported.graph.initializer if t.name.startswith("captured.") and "constant" in t.name]
    # One per graph reading them (the forward's and the backward's), each an input with its value.
    assert [numpy_helper.to_array(t).tolist() for t in constants] == [CLASS_WEIGHTS, CLASS_WEIGHTS]
    session = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {t.name: numpy_helper.to_array(t) for t in exported.graph.initializer}
    x, y = batches[2]
    feeds.update(batch_0=x.numpy(), batch_1=y.numpy())
    loss = session.run(["loss"], feeds)[0]
    np.testing.assert_allclose(loss, step(x, y).numpy(), rtol=1e-5, atol=1e-6)


class _Chatty(torch.nn.Module):
    """Logs in its forward, as Hugging Face models do (``logger.warning_once`` in the loss)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _log.warning("forward of a batch of %d", x.shape[0])
        _log.info("and a second call")
        return self.fc(x)


def test_a_logger_call_does_not_stop_a_training_step():
    model = _Chatty()
    step = torch_adreno.TrainingStep(model, lambda m, x, y: F.cross_entropy(m(x), y),
                                     torch.optim.SGD(model.parameters(), lr=0.1))
    batches = _batches(3)
    losses = [step(x, y) for x, y in batches]
    assert step.replayed_steps == 1 and all(torch.isfinite(loss) for loss in losses)


def test_logger_calls_are_skipped_only_in_this_backends_traces():
    def fn(x):
        _log.warning("inside")
        return x + 1

    x = torch.randn(3)
    assert torch.equal(torch.compile(fn, backend="adreno", fullgraph=True, dynamic=False)(x), x + 1)
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match=r"[Ll]ogg"):
        torch.compile(fn, backend="eager", fullgraph=True)(x)
    # The user's own entries still count, for every backend.
    torch._dynamo.reset()
    ignored = torch._dynamo.config.ignore_logging_functions
    ignored.add(logging.Logger.warning)
    try:
        assert torch.equal(torch.compile(fn, backend="eager", fullgraph=True)(x), x + 1)
    finally:
        ignored.discard(logging.Logger.warning)
