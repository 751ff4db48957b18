"""Compiling and running compiled graphs from several threads at once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch
from helpers import assert_ran_on_device
from torch.fx.experimental.proxy_tensor import make_fx

import torch_adreno
import torch_adreno.frontend as backend
from torch_adreno.errors import OptionError, ShapeLimitError
from torch_adreno.frontend import specialization, tracing

pytestmark = pytest.mark.device


@pytest.fixture
def no_compile_cache(monkeypatch):
    # A cache hit skips AOTAutograd's trace, the part of a compile that races with other threads.
    monkeypatch.setenv("TORCH_ADRENO_COMPILE_CACHE", "0")


def test_every_compile_holds_dynamos_compile_lock(monkeypatch, no_compile_cache):
    """Compiles Dynamo starts and those a graph starts at its first call with a new shape (outside
    Dynamo) both hold Dynamo's compile lock, so no two traces run at once."""
    held: list[bool] = []
    upstream = tracing.trace_and_compile

    def spy(*args, **kwargs):
        held.append(tracing.compile_lock._is_owned())
        return upstream(*args, **kwargs)

    monkeypatch.setattr(tracing, "trace_and_compile", spy)
    model = torch.nn.Linear(8, 4)
    compiled = torch.compile(model, backend="adreno")
    with torch_adreno.profile() as prof:
        for batch in (2, 3, 4, 5):
            x = torch.randn(batch, 8)
            torch.testing.assert_close(compiled(x), model(x))
    # 2: Dynamo's static graph; 3: Dynamo's symbolic graph, compiled at its calls with 3, 4 and 5.
    assert len(held) == 4, held
    assert all(held), held
    # Each of the four compiles gave a program that ran on the device (not the traced graph).
    assert_ran_on_device(prof)
    assert len(prof.graph_runs) == 4, [r.graph for r in prof.graph_runs]


def test_compiled_model_runs_while_another_thread_traces(no_compile_cache):
    """FX's "is tracing" flag is process-wide: a compiled model called while another thread traces
    (as AOTAutograd does in a compile) was refused as if traced itself."""
    model = torch.nn.Linear(8, 4)
    compiled = torch.compile(model, backend="adreno")
    x = torch.randn(3, 8)
    compiled(x)  # compiled before the other thread starts tracing
    inside, leave = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def slow_function(t):
        inside.set()
        assert leave.wait(60), "the main thread never let the trace finish"
        return t * 2

    def trace():
        try:
            make_fx(slow_function)(torch.randn(2))
        except BaseException as err:  # reported by the main thread
            failures.append(err)

    tracer = threading.Thread(target=trace)
    tracer.start()
    try:
        assert inside.wait(60)
        assert torch.fx._symbolic_trace._is_fx_tracing_flag, "the other thread is inside an FX trace"
        with torch_adreno.profile() as prof:
            torch.testing.assert_close(compiled(x), model(x))
        # The compiled program ran (on the device), not a traced or eager stand-in.
        assert_ran_on_device(prof)
    finally:
        leave.set()
        tracer.join(60)
    assert not failures, failures
    # The thread that traces still sees its own trace.
    assert not torch.fx._symbolic_trace.is_fx_symbolic_tracing()


def test_shape_limit_is_its_own_error_naming_the_graph_and_the_shapes(monkeypatch, no_compile_cache):
    monkeypatch.setattr(specialization, "MAX_SPECIALIZATIONS", 2)
    compiled = torch.compile(torch.nn.Linear(8, 4), backend="adreno")
    with torch_adreno.profile() as prof:
        compiled(torch.randn(2, 8))
        compiled(torch.randn(3, 8))  # Dynamo's symbolic graph, specialised for 3 ...
        compiled(torch.randn(4, 8))  # ... and for 4
    assert_ran_on_device(prof)
    assert len(prof.graph_runs) == 3
    with pytest.raises(ShapeLimitError) as caught:
        compiled(torch.randn(5, 8))
    message = str(caught.value)
    assert not isinstance(caught.value, OptionError), "nothing is wrong with the options"
    assert "graph 0/1" in message and "reads weight, bias" in message, message
    assert "new input shapes (L['args'][0]: 5x8) after 2 others" in message, message
    assert "Shapes seen: (L['args'][0]: 3x8); (L['args'][0]: 4x8)" in message, message
    assert "Pad inputs" in message


def test_mkldnn_switch_is_left_alone_by_graphs_without_lstm(monkeypatch, no_compile_cache):
    """The process-wide MKL-DNN switch (which decides how an LSTM is traced) is touched only for
    graphs that call an LSTM: eager work in other threads keeps its kernels meanwhile."""
    switched: list[bool] = []
    upstream = torch._C._set_mkldnn_enabled
    monkeypatch.setattr(torch._C, "_set_mkldnn_enabled", lambda flag: (switched.append(flag), upstream(flag))[1])
    compiled = torch.compile(torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh()), backend="adreno")
    with torch_adreno.profile() as prof:
        compiled(torch.randn(2, 8)).sum().backward()
        compiled(torch.randn(3, 8)).sum().backward()
    assert switched == []
    assert_ran_on_device(prof, graphs=("forward", "backward"))  # compiles that ran, not eager's graphs
    # What Dynamo records for an nn.LSTM (RNN tracing on) is recognised.
    graph = torch.fx.Graph()
    graph.output(graph.call_function(torch.lstm, (graph.placeholder("x"),)))
    assert tracing._calls_lstm(torch.fx.GraphModule(torch.nn.Module(), graph))


_THREADS_SCRIPT = textwrap.dedent("""
    import threading
    import torch
    import torch_adreno

    errors = []

    def guarded(fn):
        def run():
            # Every torch.compile'd module shares one code object (Dynamo's wrapper), so the
            # models below exceed the default recompile limit of 8, past which Dynamo runs calls
            # eagerly, silently (the graph-run counts printed below would miss them). Dynamo's
            # config is per thread.
            torch._dynamo.config.recompile_limit = 64
            try:
                fn()
            except BaseException as err:
                errors.append(f"{threading.current_thread().name}: {type(err).__name__}: {err}")
        return run

    def train():
        torch.manual_seed(1)
        model = torch.nn.Linear(8, 4)
        compiled = torch.compile(model, backend="adreno")
        for i in range(40):
            x = torch.randn(2 + i % 12, 8)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
            compiled(x).sum().backward()

    def others():
        for k in range(8):
            model = torch.nn.Sequential(torch.nn.Linear(8, 16 + k), torch.nn.Tanh())
            x = torch.randn(3, 8)
            out = torch.compile(model, backend="adreno")(x)
            torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
            out.sum().backward()

    threads = [threading.Thread(target=guarded(train), name="train"),
               threading.Thread(target=guarded(others), name="others")]
    with torch_adreno.profile() as prof:  # the launch records of both threads
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        # The process still compiles afterwards.
        guarded(lambda: torch.compile(torch.nn.Linear(3, 2), backend="adreno")(torch.randn(2, 3)).sum().backward())()
    runs = [r.graph.split("_")[0] for r in prof.graph_runs]
    print("RUNS", runs.count("forward"), runs.count("backward"), "LAUNCHES", prof.kernel_launches,
          "HOST", len(prof.host_fallback_ops))
    print("ERRORS", len(errors))
    for error in errors:
        print(error[:2000])
""")


@pytest.mark.slow
def test_compiling_in_one_thread_while_another_trains_with_changing_batch_sizes():
    """One thread trains a compiled model over 12 batch sizes (a compile at each
    new one's first call) while another compiles 8 models; every result matches eager and the
    process compiles afterwards. Without the compile cache, so that every compile traces."""
    tree = str(Path(backend.__file__).parents[1])  # this tree's torch_adreno, not an installed one
    env = {**os.environ, "TORCH_ADRENO_COMPILE_CACHE": "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [tree, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-c", _THREADS_SCRIPT], capture_output=True, text=True, env=env,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "ERRORS 0" in result.stdout, result.stdout[-4000:]
    # Every call ran a compiled graph on the device: train's 80 forwards and 40 backwards, the
    # others' 8 of each, and the last compile's one of each.
    runs = re.search(r"RUNS (\d+) (\d+) LAUNCHES (\d+) HOST (\d+)", result.stdout)
    assert runs, result.stdout[-4000:]
    forwards, backwards, launches, host = map(int, runs.groups())
    assert forwards >= 89 and backwards >= 49 and launches >= forwards + backwards and host == 0, runs.group(0)
