"""Out-of-range index values (gather, scatter, embedding, advanced indexing, ...) are checked on
the device and raised at the host's next wait as eager's exception type, naming the op.

Each case compiles one op (fullgraph), checks a valid call against eager, then calls it with index
values past either end: eager raises, so must we (same type, a message naming the ATen op, the FX
node and the dimension's size), and the next valid call must give eager's result again (the error
record is cleared after raising). Every case asserts that the kernel that ran is a checking one.
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest
import torch
import torch.nn.functional as F
from helpers import cross_entropy_loss as _loss
from helpers import eager_training_step as _eager_step

import torch_adreno
from torch_adreno.kernels.expressions import INDEX_CHECK_CALL
from torch_adreno.kernels.writer import INDEX_CHECK_PARAMS
from torch_adreno.runtime.index_check import DeviceIndexOutOfRange

pytestmark = pytest.mark.device

X = torch.arange(12, dtype=torch.float32).reshape(3, 4)


def _ix(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


# name, function of (index), valid index, bad indices (past the end, past the start) each with the
# value the message names, eager's type,
# the ATen op named, the dimension's size in the message
CASES = [
    ("gather", lambda i: torch.gather(X, 0, i.reshape(1, -1).expand(2, -1)), _ix(0, 2, 1, 0),
     [(_ix(0, 3, 1, 0), 3), (_ix(0, -1, 1, 0), -1)], RuntimeError, "aten.gather", 3),
    ("scatter_src", lambda i: torch.zeros(3, 4).scatter(0, i.reshape(1, 4), torch.ones(1, 4)), _ix(2, 0, 1, 2),
     [(_ix(2, 0, 3, 2), 3), (_ix(-1, 0, 1, 2), -1)], RuntimeError, "aten.scatter", 3),
    ("scatter_value", lambda i: torch.zeros(3, 4).scatter(1, i.reshape(3, 1), 5.0), _ix(3, 0, 1),
     [(_ix(4, 0, 1), 4), (_ix(0, -2, 1), -2)], RuntimeError, "aten.scatter", 4),
    ("scatter_add", lambda i: torch.zeros(3, 4).scatter_add(0, i.reshape(2, 2), torch.ones(2, 2)), _ix(1, 2, 2, 0),
     [(_ix(1, 2, 3, 0), 3), (_ix(1, -3, 2, 0), -3)], RuntimeError, "aten.scatter_add", 3),
    ("index_select", lambda i: torch.index_select(X, 1, i) * 2, _ix(3, 0),
     [(_ix(4, 0), 4), (_ix(0, -1), -1)], RuntimeError, "aten.index_select", 4),  # eager's dim-1 path
    ("index_select_dim0", lambda i: torch.index_select(X, 0, i[:2]) * 2, _ix(2, 0, 0, 0),
     [(_ix(3, 0, 0, 0), 3), (_ix(0, -1, 0, 0), -1)], IndexError, "aten.index_select", 3),
    ("embedding", lambda i: F.embedding(i.reshape(2, 2), X) + 1, _ix(2, 0, 1, 1),
     [(_ix(2, 0, 3, 1), 3), (_ix(2, 0, -1, 1), -1)], IndexError, "aten.embedding", 3),
    ("index", lambda i: X[i] * 3, _ix(-1, 0, -3),
     [(_ix(-1, 3, 0), 3), (_ix(0, -4, 1), -4)], IndexError, "aten.index", 3),
    ("index_two_tensors", lambda i: X[i, i], _ix(2, -2),
     [(_ix(2, 3), 3), (_ix(-4, 0), -4)], IndexError, "aten.index", 3),
    ("index_put", lambda i: X.index_put((i,), torch.full((4,), 7.0)), _ix(-1),
     [(_ix(3), 3), (_ix(-4), -4)], IndexError, "aten.index_put", 3),
    ("index_put_accumulate", lambda i: X.index_put((i,), torch.ones(2, 4), accumulate=True), _ix(-1, 0),
     [(_ix(1, 3), 3), (_ix(-4, 1), -4)], IndexError, "aten.index_put", 3),
    # Decomposed into index_put, but eager refuses negative indices here (and index_add raises
    # RuntimeError): the rule follows the op the node came from.
    ("index_add", lambda i: torch.zeros(3, 4).index_add(0, i, torch.ones(2, 4)), _ix(2, 0),
     [(_ix(3, 0), 3), (_ix(-1, 0), -1)], RuntimeError, "aten.index_put", 3),
    ("index_copy", lambda i: torch.zeros(3, 4).index_copy(0, i, torch.ones(2, 4)), _ix(2, 0),
     [(_ix(3, 0), 3), (_ix(0, -1), -1)], IndexError, "aten.index_put", 3),
]


@pytest.mark.parametrize("name,fn,good,bad,error,op,size", CASES, ids=[c[0] for c in CASES])
def test_out_of_range_index_raises_like_eager(name, fn, good, bad, error, op, size):
    compiled = torch.compile(fn, backend="adreno", fullgraph=True, dynamic=False)
    with torch_adreno.profile() as prof:
        torch.testing.assert_close(compiled(good), fn(good))
    for index, bad_value in bad:
        with pytest.raises(error) as eager:
            fn(index)
        with pytest.raises(error) as ours:
            compiled(index)
        assert isinstance(ours.value, DeviceIndexOutOfRange), ours.value
        message = str(ours.value)
        assert op in message and f"with size {size}" in message and f"index {bad_value} " in message, message
        assert "FX node" in message and "invalid" in message, message
        del eager
    # The record was cleared: a valid call is right again, and raises nothing.
    torch.testing.assert_close(compiled(good), fn(good))
    record = torch_adreno.runtime.get_runtime().index_errors
    checking = [k for k in prof.kernels if k.name in {r.source.name for r in record._registered}]
    assert checking, "no kernel that checks indices ran"


def test_kernel_text_checks_each_data_dependent_index():
    """The check is in the kernel source (one helper call per index read), which takes the two
    extra arguments; a kernel without data-dependent indices takes neither."""
    compiled = torch.compile(lambda x, i: F.embedding(i, x) * 2, backend="adreno", fullgraph=True)
    plain = torch.compile(lambda x: x * 2, backend="adreno", fullgraph=True)
    with torch_adreno.profile() as prof:
        compiled(X, _ix(0, 2))
        plain(X)
    record = torch_adreno.runtime.get_runtime().index_errors
    sources = {r.source.name: r.source for r in record._registered}
    ran = [sources[k.name] for k in prof.kernels if k.name in sources]
    assert len(ran) == 1 and ran[0].checks_indices and ran[0].source.count(INDEX_CHECK_CALL) == 1
    assert "__global volatile int* index_error" in ran[0].source and not set(INDEX_CHECK_PARAMS) & set(ran[0].params)
    assert len(prof.kernels) == 2, "x * 2 runs in a kernel of its own, without checks"


def test_values_past_32_bits_are_not_truncated_into_range():
    compiled = torch.compile(lambda i: F.embedding(i, X), backend="adreno", fullgraph=True, dynamic=False)
    compiled(_ix(1, 2))
    with pytest.raises(IndexError, match="index 4294967297 is out of bounds"):
        compiled(_ix(1, 2**32 + 1))


def _token_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.Flatten(), torch.nn.Linear(24, 3))


def _token_batches():
    g = torch.Generator().manual_seed(3)
    return [(torch.randint(0, 10, (4, 3), generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(5)]


@pytest.mark.parametrize("replay", [False, True], ids=["compiled", "replayed"])
def test_training_step_with_a_bad_token_raises_and_the_next_step_works(replay):
    model = _token_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = torch_adreno.TrainingStep(model, _loss, opt, replay=replay)
    reference = _token_model()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    batches = _token_batches()
    bad_tokens = batches[0][0].clone()
    bad_tokens[1, 2] = 10  # == vocab
    with torch_adreno.profile() as prof:
        for x, y in batches[:3]:
            torch.testing.assert_close(step(x, y), _eager_step(reference, ref_opt, x, y))
        with pytest.raises(IndexError, match=r"index 10 is out of bounds.*with size 10.*aten\.embedding"):
            step(bad_tokens, batches[0][1])
        with pytest.raises(IndexError):
            _eager_step(reference, ref_opt, bad_tokens, batches[0][1])
        losses = [step(x, y) for x, y in batches[3:]]
    assert prof.replayed_steps == (3 if replay else 0)  # steps 3, the bad one, 4 and 5
    assert all(torch.isfinite(loss) for loss in losses)
    if not replay:
        # The compiled path stops at the forward's loss read: nothing was updated, like eager.
        for (x, y), loss in zip(batches[3:], losses, strict=True):
            torch.testing.assert_close(loss, _eager_step(reference, ref_opt, x, y))
        step.synchronize()
        for ours, theirs in zip(model.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(ours, theirs)
    step.close()


def test_an_unread_error_is_raised_at_the_next_sync_point():
    """An error in a call that returns nothing to the host (its outputs stay on the device) is not
    lost: the next wait (here the TrainingStep's synchronize) raises it."""
    record = torch_adreno.runtime.get_runtime().index_errors
    model = _token_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = torch_adreno.TrainingStep(model, _loss, opt, replay=False)
    x, y = _token_batches()[0]
    step(x, y)
    # A checking launch that wrote the record without a wait after it (as the backward's would).
    queue = torch_adreno.runtime.get_runtime().queue
    token = 1 + next(k for k, r in enumerate(record._registered) if r.checks and r.checks[0].origin.op.startswith(
        "aten.embedding") and r.graph.startswith("forward"))
    cl.enqueue_copy(queue, record.buffer, np.array([token, 0, 12, 0], dtype=np.int32), is_blocking=True)
    record.launches += 1
    with pytest.raises(IndexError, match="index 12 is out of bounds"):
        step.synchronize()
    step.synchronize()  # cleared after raising
    step.close()


EMPTY = torch.zeros(0, 3)
EMPTY_SOURCE_CASES = [
    ("gather", lambda i: torch.gather(EMPTY, 0, i.reshape(1, 1).expand(1, 3)), RuntimeError),
    ("embedding", lambda i: F.embedding(i, EMPTY), RuntimeError),
    ("index", lambda i: EMPTY[i], IndexError),
    ("index_select_0dim", lambda i: torch.index_select(torch.tensor(5.0), 0, i), IndexError),
]


@pytest.mark.parametrize("name,fn,error", EMPTY_SOURCE_CASES, ids=[c[0] for c in EMPTY_SOURCE_CASES])
def test_indexing_a_dimension_without_elements_raises_and_reads_nothing(name, fn, error):
    """Every index into an empty dimension is out of range (and a 0-dim source takes only 0): eager
    raises; so do we, without reading from the empty buffer."""
    compiled = torch.compile(fn, backend="adreno", fullgraph=True, dynamic=False)
    with pytest.raises(error):
        fn(_ix(1))
    with pytest.raises(error) as ours:
        compiled(_ix(1))
    assert isinstance(ours.value, DeviceIndexOutOfRange), ours.value
