"""Cold compile time of GPT-2 LoRA through ``TrainingStep`` against its number of blocks, by stage.

    python benchmarks/compile_blocks.py                        # 1, 2, 4 and 12 blocks, default device
    python benchmarks/compile_blocks.py --device Portable --layers 1 12 --zero-copy off

The model is :mod:`gpt2_lora`'s (pre-LN blocks, fused ``c_attn`` with LoRA r=8 on q and v,
``scaled_dot_product_attention(is_causal=True)``, tanh-GELU MLP, tied head), at reduced sizes that
keep its structure (defaults: d 64, 4 heads, vocab 512, 64 positions, seq 32, batch 2), trained by
SGD with momentum. Repeated identical blocks should cost about one block's compile (issue 28
item 6: 12 blocks within twice 1 block): the table shows where each added block's time goes.

Each block count runs in a fresh process whose caches start empty (cold): the program binaries
(``TORCH_ADRENO_CACHE_DIR``), the tuning choices (``TORCH_ADRENO_CACHE``), PyTorch's compile cache
(``TORCHINDUCTOR_CACHE_DIR``) and the drivers' (``POCL_CACHE_DIR``, ``CUDA_CACHE_PATH``). It makes the
step, runs the calls up to and including the first replayed one (``until_replay_s``: compiling
the loss and optimizer graphs, running them, the capture and the first replay; ``until_replay_cpu_s``
the process's CPU time in them, which the load of a shared host moves less), then times three
replayed steps (``step_s``, their median). Seconds by stage, each the time spent inside the
function named (wrapped where its caller looks it up, so a renamed function fails loudly here;
``stage_cpu_s`` the CPU seconds of each):

* ``backend_s``: our backend as Dynamo calls it per graph (``trace_and_compile``): AOTAutograd's
  joint trace and partition plus everything below; ``aot_s`` is its part outside ``compile_graph``;
* ``lowering_s``, ``fusion_s``, ``memory_plan_s``, ``rendering_s``: the stages of each graph;
* ``bind_s``: the Executables made (program build, tuning, arguments bound);
* ``opencl_build_s``: every program build of the process (``BuildStats``), the compiled graphs'
  (``graph_build_s``) and the replay's kernels rebuilt for its arena (``replay_build_s``);
* ``tuning_s``: ``tune_kernels`` (only with ``--tune``);
* ``graph_calls_s``: the compiled graphs' calls before the replay (their first launches: PoCL
  generates a kernel's machine code at its first launch with a work-group size, not at build);
* ``replay_setup_s``: the replay made from the capture (its memory plan, arena kernels, bindings),
  ``arena_kernels_s`` of it the kernels placed in the arena and built; ``first_replay_s``;
* ``dynamo_and_host_s``: the rest of those calls: Dynamo's bytecode tracing and guards, AOTAutograd's
  runtime wrappers, eager Python of the step.

Kernel counts: ``kernels_requested`` (kernel objects the process asked builds for),
``kernels_unique`` (distinct kernel contents among each build's), ``kernels_from_source`` (kernels in
the programs compiled from source), ``programs_from_source``, ``replay_launches``,
``replay_functions`` (the functions of the programs the replay's setup built: its arena kernels,
those of equal content one), ``replay_kernel_arguments`` (the buffer and index check arguments of
a replayed step's launches) and ``replay_offset_arguments`` (their arena offsets, an ``int`` each).

``--cprofile DIR`` also writes each child's cProfile (``blocks_<n>.prof``). Appends JSON lines to
``--out`` (default benchmarks/results/<device>/compile_blocks.jsonl) and prints a table. Not a test.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import functools
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import gpt2_lora
import torch
from common import DEVICE, RESULTS, append_jsonl, device_arg, run_context

import torch_adreno
from torch_adreno.runtime.binary_cache import build_stats

_MARK = "COMPILE_BLOCKS_RESULT "
#: (label, module, attribute): the functions whose inclusive time is a stage. ``Class.method``
#: attributes wrap a method.
STAGES = (
    ("backend", "torch_adreno.frontend.tracing", "trace_and_compile"),
    ("compile_graph", "torch_adreno.frontend.pipeline", "compile_graph"),
    ("lowering", "torch_adreno.frontend.pipeline", "lower_graph"),
    ("fusion", "torch_adreno.frontend.pipeline", "fuse"),
    ("memory_plan", "torch_adreno.frontend.pipeline", "plan_memory"),
    ("rendering", "torch_adreno.frontend.pipeline", "render_program"),
    ("bind", "torch_adreno.runtime.executable", "Executable.__init__"),
    ("tuning", "torch_adreno.runtime.executable", "tune_kernels"),
    ("graph_calls", "torch_adreno.runtime.executable", "Executable.__call__"),
    ("replay_setup", "torch_adreno.training.step", "build_replay"),
    ("arena_kernels", "torch_adreno.replay.bound_step", "arena_kernels"),
    ("arena_kernels", "torch_adreno.replay.bound_step", "merged_copies"),
    ("replays", "torch_adreno.replay.step", "ReplayedStep.__call__"),
)


class StageTimers:
    """Seconds spent inside each stage's function (wall clock, and this process's CPU time: the
    host is shared, and CPU time moves less with the load of others), and the OpenCL build seconds
    within the replay's setup (the rest of the builds are the compiled graphs')."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.cpu_seconds: dict[str, float] = defaultdict(float)
        self.replay_build_s = 0.0
        #: Program functions the replay's setup built (its arena kernels; kernels of equal content one).
        self.replay_functions = 0

    def install(self) -> None:
        for label, module_name, attribute in STAGES:
            module = importlib.import_module(module_name)
            owner_name, _, name = attribute.rpartition(".")
            owner = getattr(module, owner_name) if owner_name else module
            if not hasattr(owner, name):
                raise AttributeError(f"stage {label}: {module_name} has no {attribute} any more; update "
                                     "STAGES in benchmarks/compile_blocks.py")
            setattr(owner, name, self._wrap(label, getattr(owner, name)))

    def _wrap(self, label: str, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start, cpu, built = time.perf_counter(), time.process_time(), build_stats().build_seconds
            functions = getattr(build_stats(), "kernels_unique", 0)
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - start
                self.cpu_seconds[label] += time.process_time() - cpu
                if label == "replay_setup":
                    self.replay_build_s += build_stats().build_seconds - built
                    self.replay_functions += getattr(build_stats(), "kernels_unique", 0) - functions
        return timed


def _config(args: argparse.Namespace, layers: int) -> gpt2_lora.GPT2Config:
    return gpt2_lora.GPT2Config(layers=layers, d=args.d, heads=args.heads, vocab=args.vocab, positions=args.positions,
                                seq=args.seq, batch=args.batch, rank=args.rank)


def _options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {} if args.device is None else {"device": device_arg(args.device)}
    if args.zero_copy != "auto":
        options["zero_copy"] = args.zero_copy == "on"
    if args.tune:
        options["tune"] = True
    return options


def child(args: argparse.Namespace, layers: int) -> dict[str, Any]:
    """One cold compile in this (fresh) process: the record without the run context."""
    torch_adreno.runtime.get_runtime(device_arg(args.device))  # opening the device is not compile time
    cfg = _config(args, layers)
    timers = StageTimers()
    timers.install()
    torch.manual_seed(0)
    model = gpt2_lora.gpt2_lora(cfg).train()
    tokens, targets = gpt2_lora.token_batch(cfg, torch.Generator().manual_seed(1))
    opt = torch.optim.SGD(gpt2_lora.trainable_parameters(model), lr=1e-3, momentum=0.9)
    step = torch_adreno.TrainingStep(model, gpt2_lora.lm_loss, opt, options=_options(args))
    profiler = cProfile.Profile() if args.cprofile else None
    calls: list[float] = []
    cpu_start = time.process_time()
    if profiler is not None:
        profiler.enable()
    while step.replayed_steps == 0:
        if len(calls) == 5:
            raise RuntimeError(f"{layers} blocks: no replay after 5 calls ({step.unreplayable_reasons})")
        start = time.perf_counter()
        float(step(tokens, targets))
        calls.append(time.perf_counter() - start)
    until_replay_cpu = time.process_time() - cpu_start
    if profiler is not None:
        profiler.disable()
        args.cprofile.mkdir(parents=True, exist_ok=True)
        profiler.dump_stats(args.cprofile / f"blocks_{layers}.prof")
    stages = dict(timers.seconds)
    first_replay = stages.pop("replays")
    steady = []
    for _ in range(3):
        start = time.perf_counter()
        float(step(tokens, targets))
        steady.append(time.perf_counter() - start)
    stats = build_stats()
    until_replay = sum(calls)
    s = {name: stages.get(name, 0.0) for name, _, _ in STAGES if name != "replays"}
    record = {
        "layers": layers, "config": dataclasses.asdict(cfg), "options": {k: str(v) for k, v in _options(args).items()},
        "calls_s": calls, "until_replay_s": until_replay, "until_replay_cpu_s": until_replay_cpu,
        "stage_cpu_s": {name: timers.cpu_seconds.get(name, 0.0) for name, _, _ in STAGES},
        "step_s": statistics.median(steady),
        **{f"{name}_s": value for name, value in s.items() if name != "compile_graph"},
        "aot_s": s["backend"] - s["compile_graph"],
        "opencl_build_s": stats.build_seconds, "replay_build_s": timers.replay_build_s,
        "graph_build_s": stats.build_seconds - timers.replay_build_s, "first_replay_s": first_replay,
        "dynamo_and_host_s": until_replay - s["backend"] - s["graph_calls"] - s["replay_setup"] - first_replay,
        "programs_from_source": stats.programs_from_source, "programs_reused": stats.programs_reused,
        "replay_launches": step.replay.kernel_launches if step.replay is not None else 0,
        "replay_functions": timers.replay_functions,
        "replay_kernel_arguments": step.replay.kernel_arguments if step.replay is not None else 0,
        # (Absent before the offsets were arguments: 0.)
        "replay_offset_arguments": getattr(step.replay, "offset_arguments", 0),
    }
    # Absent before issue 28 item 6 (kept optional so that the tree before it can be measured too).
    record.update({name: getattr(stats, name) for name in ("kernels_requested", "kernels_unique", "kernels_from_source")
                   if hasattr(stats, name)})
    return record


def run_child(args: argparse.Namespace, layers: int) -> dict[str, Any]:
    """``layers`` blocks compiled in a fresh interpreter whose caches are fresh temporary directories."""
    package_root = str(Path(torch_adreno.__file__).resolve().parents[1])
    with tempfile.TemporaryDirectory(prefix="torch_adreno_compile_blocks_") as tmp:
        caches = Path(tmp)
        env = {**os.environ,
               "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p),
               "TORCH_ADRENO_CACHE": str(caches / "torch_adreno"), "TORCH_ADRENO_CACHE_DIR": str(caches / "programs"),
               "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"), "POCL_CACHE_DIR": str(caches / "pocl"),
               "CUDA_CACHE_PATH": str(caches / "cuda")}
        command = [sys.executable, __file__, "--child", str(layers), *_forwarded(args)]
        start = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout, check=False)
        wall = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.startswith(_MARK)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{layers} blocks: child exited {done.returncode}\n{done.stderr[-4000:]}")
    return {**json.loads(lines[-1][len(_MARK):]), "process_s": wall}


def _forwarded(args: argparse.Namespace) -> list[str]:
    out = [f"--{name}={getattr(args, name)}" for name in ("d", "heads", "vocab", "positions", "seq", "batch", "rank")]
    out += [f"--zero-copy={args.zero_copy}"]
    out += [f"--device={args.device}"] if args.device is not None else []
    out += ["--tune"] if args.tune else []
    out += [f"--cprofile={args.cprofile}"] if args.cprofile else []
    return out


COLUMNS = (("until_replay_s", "total"), ("until_replay_cpu_s", "cpu"), ("dynamo_and_host_s", "dynamo+"), ("aot_s", "aot"), ("lowering_s", "lower"),
           ("fusion_s", "fuse"), ("memory_plan_s", "plan"), ("rendering_s", "render"), ("graph_build_s", "build"),
           ("tuning_s", "tune"), ("graph_calls_s", "calls"), ("replay_setup_s", "replay"),
           ("replay_build_s", "r.build"), ("first_replay_s", "1st rep"))


def table_row(record: dict[str, Any]) -> str:
    counts = (f"{record.get('kernels_requested', '-'):>6} {record.get('kernels_from_source', '-'):>6} "
              f"{record.get('replay_functions', '-'):>6}")
    return (f"{record['layers']:>6} " + " ".join(f"{record[key]:>7.2f}" for key, _ in COLUMNS)
            + f" {counts} {record['programs_from_source']:>5}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2, 4, 12])
    defaults = gpt2_lora.GPT2Config(d=64, heads=4, vocab=512, positions=64, seq=32, batch=2)
    for name in ("d", "heads", "vocab", "positions", "seq", "batch", "rank"):
        parser.add_argument(f"--{name}", type=int, default=getattr(defaults, name))
    parser.add_argument("--device", default=None, help="index or name substring (default: the default device)")
    parser.add_argument("--zero-copy", choices=["auto", "on", "off"], default="auto",
                        help="off: the path of a device with memory of its own (the replay's arena kernels)")
    parser.add_argument("--tune", action="store_true", help="compile with tune=True (tuning_s)")
    parser.add_argument("--cprofile", type=Path, default=None, help="a directory for each child's cProfile")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per child process")
    parser.add_argument("--out", type=Path, default=RESULTS / DEVICE / "compile_blocks.jsonl")
    parser.add_argument("--note", default="", help="a remark stored with each record (the tree measured)")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(_MARK + json.dumps(child(args, args.child)), flush=True)
        return
    context = run_context(device_arg(args.device))
    print(f"{context['device']} ({context['platform']}, driver {context['driver']}), torch {context['torch']}, "
          f"zero_copy {args.zero_copy}, d {args.d}, heads {args.heads}, vocab {args.vocab}, seq {args.seq}, "
          f"batch {args.batch}")
    print(f"{'blocks':>6} " + " ".join(f"{title:>7}" for _, title in COLUMNS) + f" {'k.req':>6} {'k.src':>6} {'r.func':>6} {'progs':>5}")
    for layers in args.layers:
        record = run_child(args, layers)
        append_jsonl(args.out, [{**record, **context, "note": args.note, "benchmark": "compile_blocks"}])
        print(table_row(record), flush=True)


if __name__ == "__main__":
    main()
