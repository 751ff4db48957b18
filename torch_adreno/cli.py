"""The command line, ``python -m torch_adreno <command>``: devices, ops, train (the digits demo),
bench (the fusion-gain suite), export (a training step as ONNX) and opinfo (PyTorch's OpInfo samples through the backend).

Every argument is checked when it is parsed (argparse types below), and a device named on the
command line is looked up before any work starts, so bad input ends in one line saying what was
wrong, with exit status 2, never in a traceback or in a result computed from nothing."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from torch_adreno.data import digits_split

DESCRIPTION = "torch_adreno, a torch.compile backend for OpenCL GPUs: its devices, ops, demo and benchmarks."
EPILOG = "Run `python -m torch_adreno <command> --help` for a command's options and their defaults."


def _bounded(kind: Callable[[str], int | float], name: str, low: float, inclusive: bool = True
             ) -> Callable[[str], int | float]:
    """An argparse type: ``kind`` (int or float) of ``text`` that is finite and >= ``low``
    (> ``low`` unless ``inclusive``); anything else is refused with what was expected."""
    bound = f">= {low:g}" if inclusive else f"> {low:g}"

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {name} {bound}, got {text!r}") from None
        if not math.isfinite(value) or value < low or (value == low and not inclusive):
            raise argparse.ArgumentTypeError(f"expected {name} {bound}, got {text!r}")
        return value

    parse.__name__ = name  # argparse names the type in its own messages
    return parse


positive_int = _bounded(int, "an integer", 1)
seed_int = _bounded(int, "an integer", 0)
positive_float = _bounded(float, "a number", 0.0, inclusive=False)


def device_spec(text: str) -> str | int:
    """A device index (digits) or a non-empty name substring, as the ``device`` option takes it."""
    text = text.strip()
    if not text:
        raise argparse.ArgumentTypeError(
            "expected a device index or a name substring; `python -m torch_adreno devices` lists them")
    return int(text) if text.isdigit() else text


def output_dir(text: str) -> Path:
    """A directory to write into: it may not exist yet, but it may not be a file."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a directory")
    return path


def _refuse_bad_device(spec: str | int | None) -> bool:
    """Whether ``spec`` names no OpenCL device (None: the default rule); if so the reason is printed.
    Checked before anything starts: a bad device would otherwise surface inside Dynamo's first compile."""
    from torch_adreno.errors import AdrenoError
    from torch_adreno.runtime.device import select_device

    try:
        select_device(spec)
    except AdrenoError as e:
        print(f"error: {e}", file=sys.stderr)
        return True
    return False


def cmd_devices(args: argparse.Namespace) -> int:
    from torch_adreno.opencl_drivers import load_failures
    from torch_adreno.runtime.device import ENV_DEVICE, INSTALL_HINT, get_runtime, list_devices, select_device
    from torch_adreno.target_profiles import TARGETS, match_device
    from torch_adreno.training.replay.launch_list import native_loop_status

    entries = list_devices()
    for distribution, error in load_failures().items():
        print(f"Installed OpenCL driver {distribution} cannot load, so the ICD loader skips it: {error}")
    if not entries:
        print(f"No OpenCL device found. {INSTALL_HINT}")
        return 1
    working = [e for e in entries if e.unusable is None]
    default = select_device(None) if working else None
    for e in entries:
        mark = "*" if default is not None and e.index == default.index else " "
        print(f"{mark}[{e.index}] {e.label}")
        if e.unusable is not None:
            print(f"      unusable: {e.unusable}")
            continue
        p = get_runtime(e.index).profile
        print(f"      {p.opencl_version}, driver {p.driver}, {'GPU' if p.is_gpu else 'CPU'}, "
              f"{p.compute_units} compute units")
        print(f"      work-group <= {p.max_work_group_size} (preferred multiple {p.preferred_work_group_multiple}), "
              f"local memory {p.local_mem_bytes // 1024} KiB")
        print(f"      global memory {p.global_mem_bytes / 2**30:.1f} GiB, largest allocation "
              f"{p.max_alloc_bytes / 2**20:.0f} MiB, base alignment {p.base_addr_align_bytes} B")
        print(f"      fp16 {'yes' if p.fp16 else 'no'}, images {'yes' if p.images else 'no'}, "
              f"unified memory {'yes' if p.unified_memory else 'no'}")
        print(f"      recordable queues (cl_qcom_recordable_queues) {'yes' if p.recordable_queues else 'no'}, "
              f"command buffers (cl_khr_command_buffer) {'yes' if p.command_buffers else 'no'}")
        matched = match_device(p.name, p.opencl_version)
        print(f"      Adreno profile: {matched.name + ' (' + matched.gpu + ', ' + matched.soc + ')' if matched else 'none'}")
    if default is None:
        print(f"No device here can build a kernel. {INSTALL_HINT}")
        return 1
    print(f"* = default device (select another with options={{'device': ...}} or {ENV_DEVICE})")
    # Built on first use (once per machine): the line says whether replays get the C loop.
    print(f"Replayed TrainingStep launch loop: {native_loop_status()}")
    print("Adreno targets (compile for one on any device: options={'target': ...} or TORCH_ADRENO_TARGET; "
          "`python -m torch_adreno project` projects step times):")
    for t in TARGETS.values():
        print(f"  {t.name}: {t.gpu} ({t.soc}), work-group <= {t.max_work_group_size}, waves {t.wave_sizes}, "
              f"local {t.local_mem_bytes // 1024} KiB, largest allocation {t.max_alloc_bytes >> 20} MiB, "
              f"{t.peak_fp32_gflops / 1e3:.1f} TFLOP/s fp32, {t.bandwidth_gbs:.0f} GB/s")
    return 0


def cmd_project(args: argparse.Namespace) -> int:
    from torch_adreno.profiler.roofline import SEED_DATA_MOVEMENT_SHARE, SEED_GEMM_GFLOPS
    from torch_adreno.projection import SEED_MLP, format_table, kernel_table, project_model, summary_row
    from torch_adreno.target_profiles import get_target

    if _refuse_bad_device(args.device):
        return 2
    targets = [get_target(name) for name in args.target]
    models = args.model or ["mlp", "lenet", "resnet_mini", "transformer", SEED_MLP]
    rows = []
    for model in models:
        for projected in project_model(model, targets, args.launch_us, args.device):
            rows.append(summary_row(projected))
            if args.kernels:
                print(f"== {model} on {projected.projection.target}: kernels by projected time")
                print(kernel_table(projected))
    print(format_table(rows))
    low, high = SEED_GEMM_GFLOPS
    print(f"Assumed: each launch costs {args.launch_us:g} us; kernels reach the target's roofline (bytes / "
          f"bandwidth, FLOPs / fp32 peak); a copy reads and writes DRAM. Seed's figures: GPU GEMM {low:.0f}-"
          f"{high:.0f} GFLOP/s on Snapdragon 8-series; data movement {SEED_DATA_MOVEMENT_SHARE:.0%} of an MNN "
          "training step. Nothing here was measured on an Adreno.")
    if args.jsonl:
        args.jsonl.parent.mkdir(parents=True, exist_ok=True)
        with args.jsonl.open("a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return 0


def cmd_ops(args: argparse.Namespace) -> int:
    from torch_adreno.lowering import supported_ops

    ops = supported_ops()
    print("\n".join(ops))
    print(f"{len(ops)} ATen ops lowered (after decomposition to the core ATen op set)")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    import torch_adreno
    from torch_adreno.models import LeNet

    if _refuse_bad_device(args.device):
        return 2
    torch.manual_seed(args.seed)
    x_train, y_train, x_test, y_test = digits_split(args.seed)
    if args.batch_size > len(y_train):
        print(f"error: --batch-size {args.batch_size} is larger than the {len(y_train)} training digits; "
              f"pass at most {len(y_train)}", file=sys.stderr)
        return 2
    model = LeNet()
    options = {"device": args.device} if args.device is not None else {}

    def loss_fn(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(m(x), y)

    if args.optimizer == "adam":
        opt: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    # The whole step on the device; from its third call on, replayed (unless --no-replay).
    step = torch_adreno.TrainingStep(model, loss_fn, opt, options, replay=not args.no_replay)
    predict = torch.compile(model, backend="adreno", options=options, dynamic=False)

    steps_per_epoch = len(y_train) // args.batch_size  # full batches only: shapes stay static
    step_times: list[float] = []
    profiled: torch_adreno.profile | None = None
    bar = tqdm(total=args.epochs * steps_per_epoch, desc="training", unit="step")
    for epoch in range(args.epochs):
        order = torch.randperm(len(y_train))
        for s in range(steps_per_epoch):
            idx = order[s * args.batch_size:(s + 1) * args.batch_size]
            x, y = x_train[idx], y_train[idx]
            measure = epoch == args.epochs - 1 and s == steps_per_epoch - 1
            prof_ctx = torch_adreno.profile() if measure else None
            start = time.perf_counter()
            if prof_ctx is not None:
                prof_ctx.__enter__()
            loss = step(x, y)
            if prof_ctx is not None:
                prof_ctx.__exit__(None, None, None)
                profiled = prof_ctx
            elif epoch > 0 or s > 1:  # the first step compiles, the second captures the replay
                step_times.append(time.perf_counter() - start)
            bar.set_postfix(epoch=epoch + 1, loss=f"{loss.item():.3f}")
            bar.update(1)
    bar.close()
    step.close()  # host copies of the trained weights current for the evaluation
    replayed = step.replayed_steps

    correct = 0
    with torch.no_grad():
        for s in range(0, len(y_test), args.batch_size):
            xb, yb = x_test[s:s + args.batch_size], y_test[s:s + args.batch_size]
            correct += int((predict(xb).argmax(1) == yb).sum())
    accuracy = correct / len(y_test)
    print(f"test accuracy: {accuracy:.2%} ({correct}/{len(y_test)} digits)")
    if step_times:
        how = ("replayed: one recorded launch list per step" if replayed else
               "through the compiled graphs" + (" (--no-replay)" if args.no_replay else ""))
        print(f"step time: median {statistics.median(step_times) * 1e3:.1f} ms over {len(step_times)} steps "
              f"(TrainingStep: forward, backward and optimizer step on the device; {replayed} of "
              f"{args.epochs * steps_per_epoch} steps {how})")
    if profiled is not None:
        print(f"per training step: {profiled.kernel_launches} kernel launches, "
              f"{profiled.bytes_host_to_device} B host->device, {profiled.bytes_device_to_host} B device->host, "
              f"{len(profiled.host_fallback_ops)} host fallback ops")
        if args.table:
            print(profiled.table())
    return 0 if accuracy > 0.9 else 2


def cmd_bench(args: argparse.Namespace) -> int:
    from torch_adreno.suite import run_suite, summary_table

    if _refuse_bad_device(args.device):
        return 2
    records = run_suite(args.models, args.steps, args.out, args.device, args.variants)
    print(summary_table(records))
    print(f"JSON lines: {args.out / 'suite.jsonl'}; plot: {args.out / 'suite.png'}")
    return 0


def cmd_opinfo(args: argparse.Namespace) -> int:
    from torch_adreno.opinfo import (
        INTERNAL_ERROR,
        SWEEP_DTYPES,
        WRONG_RESULT,
        OpReport,
        format_reports,
        sweep,
    )

    index, _, count = args.shard.partition("/")
    if args.error_inputs:
        from torch_adreno.opinfo_errors import ErrorOutcome, error_sweep, format_error_reports

        def write_case(outcome: ErrorOutcome) -> None:
            if args.jsonl:
                with open(args.jsonl, "a") as f:
                    f.write(json.dumps(dataclasses.asdict(outcome)) + "\n")

        error_reports = error_sweep(args.ops, shard=(int(index), int(count or 1)), on_case=write_case)
        print(format_error_reports(error_reports, failures=args.failures))
        return 1 if any(not o.agrees and not o.known for r in error_reports for o in r) else 0

    def write_jsonl(report: OpReport) -> None:
        with open(args.jsonl, "a") as f:
            for o in report.outcomes:
                f.write(json.dumps(dataclasses.asdict(o)) + "\n")

    reports = sweep(args.ops, args.samples, shard=(int(index), int(count or 1)),
                    on_report=write_jsonl if args.jsonl else None, all_samples=args.all_samples,
                    database=args.database, dtype=SWEEP_DTYPES[args.dtype])
    print(format_reports(reports))
    if args.failures:
        for r in reports:
            for o in r.counted:
                if not o.passed and (not args.database or o.kind in (INTERNAL_ERROR, WRONG_RESULT)):
                    print(f"{o.op}[{o.index}] {o.kind}: {o.reason}")
    if args.database:
        # Over the whole database unclaimed ops end in clear errors; only bugs fail the command.
        return 1 if any(o.kind in (INTERNAL_ERROR, WRONG_RESULT) for r in reports for o in r.outcomes) else 0
    # Unexpected failures make the command fail, so that it can gate a change.
    return 1 if any(r.unexpected for r in reports) else 0


def cmd_export(args: argparse.Namespace) -> int:
    """Export a reference model's (or the digits demo's) training step as ONNX."""
    import numpy as np

    from torch_adreno.export import ExportError, export_reference_model
    from torch_adreno.models import MODELS, LeNet

    if _refuse_bad_device(args.device):
        return 2
    torch.manual_seed(args.seed)
    if args.model == "digits":
        x_train, y_train, x_test, y_test = digits_split(args.seed)
        batch: tuple[torch.Tensor, ...] = (x_train[:args.batch_size].contiguous(), y_train[:args.batch_size].contiguous())
        make: Callable[[], torch.nn.Module] = LeNet
        if args.data is not None:
            np.savez(args.data, x=x_train.numpy(), y=y_train.numpy(), x_test=x_test.numpy(), y_test=y_test.numpy())
    else:
        spec = MODELS[args.model]
        batch, make = spec.batch(torch.Generator().manual_seed(args.seed)), spec.make
        if args.data is not None:
            print("error: --data writes the digits data set; it goes with --model digits", file=sys.stderr)
            return 2
    options = {"device": args.device} if args.device is not None else {}
    try:
        model = export_reference_model(args.model, args.output, batch, make, args.lr, args.optimizer, options)
    except ExportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    kernels = sum(1 for n in model.graph.node if n.domain == "torch_adreno" and n.op_type != "copy")
    plan = json.loads({p.key: p.value for p in model.metadata_props}["torch_adreno.step"])
    predict = plan["predict"]["operations"]
    print(f"{args.output}: the training step of {args.model}: {kernels - predict} kernel launches (and {predict} "
          f"of the eval-mode forward, output logits), {len(model.graph.input)} inputs, {len(model.graph.output)} outputs")
    if args.data is not None:
        print(f"{args.data}: the digits (x, y for training; x_test, y_test held out)")
    return 0


# -- federated (issue 18): a Flower federation on the digits -----------------------------------


def address(text: str) -> str:
    """``host:port`` (``[v6]:port`` for IPv6) with a port in 1..65535."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (e.g. 127.0.0.1:8080), got {text!r}")
    return text.strip()


def share(text: str) -> float:
    """A number in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return value


def cmd_federated(args: argparse.Namespace) -> int:
    import os

    # Flower reports usage to its developers unless told not to; our runs have no business calling
    # out (the variable is read when flwr is imported; a setting of the user's own wins).
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    try:
        import flwr  # noqa: F401
    except ImportError:
        print("error: the federated command needs Flower: pip install 'torch-adreno[federated]'", file=sys.stderr)
        return 2
    import logging

    from tqdm import tqdm

    # Flower logs every step of every round at INFO; the rounds' summaries below say what matters.
    logging.getLogger("flwr").setLevel(logging.WARNING)
    from torch_adreno.federated import (
        FederationSettings,
        RoundReport,
        format_round,
        free_port,
        run_client,
        run_federation,
    )

    if args.role != "server" and _refuse_bad_device(args.device):
        return 2
    fail_at = {}
    for spec in args.fail_client:
        index, _, round_ = spec.partition(":")
        if not (index.isdigit() and round_.isdigit() and int(index) < args.clients and int(round_) >= 1):
            print(f"error: --fail-client expects CLIENT:ROUND with CLIENT < {args.clients} and ROUND >= 1, "
                  f"got {spec!r}", file=sys.stderr)
            return 2
        fail_at[int(index)] = int(round_)
    if args.fail_at_round is not None and args.client_index is not None:
        fail_at[args.client_index] = args.fail_at_round
    settings = FederationSettings(
        clients=args.clients, rounds=args.rounds, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
        skew=args.skew, seed=args.seed, optimizer_state=args.optimizer_state, device=args.device,
        zero_copy=False if args.no_zero_copy else None, round_timeout=args.round_timeout, timeout=args.timeout,
        fail_at=fail_at)
    if args.role == "client":
        if args.server is None or args.client_index is None:
            print("error: --role client needs --server HOST:PORT and --client-index", file=sys.stderr)
            return 2
        if args.client_index >= args.clients:
            print(f"error: --client-index {args.client_index} is not below --clients {args.clients}", file=sys.stderr)
            return 2
        run_client(settings, args.client_index, args.server, connect_timeout=args.connect_timeout,
                   exit_with_parent=args.exit_with_parent)
        return 0

    from torch_adreno.federated.data import digits_partitions

    partitions, _, y_test = digits_partitions(args.clients, args.skew, args.seed)
    for i, p in enumerate(partitions):
        print(f"client {i}: {len(p.y_train)} training digits, per digit 0-9: {p.label_counts()}")
    listen = args.address or f"127.0.0.1:{free_port()}"
    bar = tqdm(total=args.rounds, desc="federated rounds", unit="round")

    def on_round(report: RoundReport) -> None:
        bar.write(format_round(report, args.clients))
        bar.update(1)

    def terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # a kill stops the clients and the server as a Ctrl-C does

    import signal

    signal.signal(signal.SIGTERM, terminate)
    try:
        result = run_federation(settings, listen, spawn_clients=args.role == "local", on_round=on_round,
                                on_event=bar.write)
    except KeyboardInterrupt:
        bar.close()
        print("interrupted: the server and every client process were stopped", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        # Everything this command started is stopped; what is left are gRPC's C++ threads, which
        # an interrupted server leaves in a state where the interpreter's exit aborts the process
        # ("terminate called without an active exception", status -6) one time in a few. Exit
        # without that teardown, with the status of an interrupt.
        os._exit(130)
    bar.close()
    accuracy = result.final_accuracy
    print(f"final global test accuracy: {'n/a' if accuracy is None else f'{accuracy:.2%}'} on {len(y_test)} "
          f"held-out digits after {len(result.rounds)} rounds"
          + (f"; {len(result.client_exits)} client(s) failed" if result.client_exits else "")
          + ("; stopped at the time limit" if result.timed_out else ""))
    return 0 if accuracy is not None and not result.timed_out else 1


def main(argv: Sequence[str] | None = None) -> int:
    from torch_adreno.benchmark import SUITE_VARIANTS
    from torch_adreno.models import MODELS

    parser = argparse.ArgumentParser(prog="python -m torch_adreno", description=DESCRIPTION, epilog=EPILOG)
    sub = parser.add_subparsers(dest="command", required=True, metavar="<command>")
    sub.add_parser("devices", help="list OpenCL devices and their capabilities").set_defaults(fn=cmd_devices)
    sub.add_parser("ops", help="list the ATen ops the backend lowers").set_defaults(fn=cmd_ops)
    device_help = "device index or name substring (`devices` lists them; default: the first GPU)"
    train = sub.add_parser("train", help="train LeNet on the bundled UCI digits and report accuracy and costs")
    train.add_argument("--device", type=device_spec, default=None, help=device_help)
    train.add_argument("--epochs", type=positive_int, default=8, help="passes over the training digits (default: %(default)s)")
    train.add_argument("--batch-size", type=positive_int, default=64,
                       help="digits per step; full batches only, so that shapes stay static (default: %(default)s)")
    train.add_argument("--lr", type=positive_float, default=2e-3, help="learning rate (default: %(default)s)")
    train.add_argument("--optimizer", choices=("adam", "sgd"), default="adam",
                       help="Adam, or SGD with momentum 0.9 (default: %(default)s)")
    train.add_argument("--seed", type=seed_int, default=0,
                       help="seeds the initial weights, the train/test split and the batch order (default: %(default)s)")
    train.add_argument("--table", action="store_true", help="print the per-kernel profile of the last step")
    train.add_argument("--no-replay", action="store_true",
                       help="run every step through the compiled graphs instead of replaying the recorded step")
    train.set_defaults(fn=cmd_train)
    bench = sub.add_parser("bench", help="the fusion-gain suite: reference models x configurations -> JSON + plots")
    bench.add_argument("--models", nargs="+", choices=sorted(MODELS),
                       default=["mlp", "lenet", "resnet_mini", "transformer"], metavar="MODEL",
                       help=f"reference models to measure, of: {', '.join(sorted(MODELS))} "
                       "(default: %(default)s)")
    bench.add_argument("--variants", nargs="+", choices=list(SUITE_VARIANTS), default=None, metavar="VARIANT",
                       help=f"configurations to measure, of: {', '.join(SUITE_VARIANTS)} (default: all)")
    bench.add_argument("--steps", type=positive_int, default=20, help="timed training steps per model and variant (default: %(default)s)")
    bench.add_argument("--device", type=device_spec, default=None, help=device_help)
    bench.add_argument("--out", type=output_dir, default=Path("benchmarks/results"),
                       help="directory for suite.jsonl (appended to) and suite.png (default: %(default)s)")
    bench.set_defaults(fn=cmd_bench)
    from torch_adreno.projection import SEED_MLP, workloads
    from torch_adreno.target_profiles import target_names

    project = sub.add_parser("project", help="project training-step times onto Adreno targets' rooflines")
    project.add_argument("--target", nargs="+", choices=target_names(), default=["adreno740"], metavar="TARGET",
                         help=f"Adreno profiles, of: {', '.join(target_names())} (default: %(default)s)")
    project.add_argument("--model", nargs="+", choices=sorted(workloads()), default=None, metavar="MODEL",
                         help=f"models, of: {', '.join(sorted(workloads()))} (default: mlp lenet resnet_mini "
                              f"transformer {SEED_MLP}; {SEED_MLP} is the seed's MLP 784-256-128-16, batch 32)")
    project.add_argument("--launch-us", type=_bounded(float, "a number", 0.0), default=10.0,
                         help="assumed cost of one kernel launch on the target, microseconds (default: %(default)s)")
    project.add_argument("--kernels", action="store_true", help="also print each model's kernels by projected time")
    project.add_argument("--device", type=device_spec, default=None, help=device_help)
    project.add_argument("--jsonl", type=Path, default=None, help="append one JSON line per model and target")
    project.set_defaults(fn=cmd_project)

    export = sub.add_parser("export", help="export a model's compiled training step as one ONNX file "
                            "(run it with onnxruntime, view it in Netron, train it with `python -m torch_adreno.runner`)")
    export.add_argument("output", type=Path, help="the .onnx file to write")
    export.add_argument("--model", choices=[*sorted(MODELS), "digits"], default="digits",
                        help="a reference model, or digits: the `train` demo's LeNet on the bundled digits (default: %(default)s)")
    export.add_argument("--batch-size", type=positive_int, default=64, help="digits per step (--model digits; default: %(default)s)")
    export.add_argument("--lr", type=positive_float, default=0.01, help="initial learning rate, an input of the step (default: %(default)s)")
    export.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd",
                        help="SGD with momentum 0.9, or Adam (default: %(default)s)")
    export.add_argument("--seed", type=seed_int, default=0, help="seeds the initial weights and the batch (default: %(default)s)")
    export.add_argument("--data", type=Path, default=None,
                        help="also write the digits as .npz (x, y, x_test, y_test) for the runner's --data")
    export.add_argument("--device", type=device_spec, default=None, help=device_help)
    export.set_defaults(fn=cmd_export)
    opinfo = sub.add_parser("opinfo", help="PyTorch's OpInfo samples for every claimed op: pass/fail per op")
    opinfo.add_argument("--ops", nargs="+", default=None, help="OpInfo names (default: every claimed op)")
    opinfo.add_argument("--samples", type=int, default=None, help="samples per op (default: all)")
    opinfo.add_argument("--failures", action="store_true", help="list every failing sample with its reason")
    opinfo.add_argument("--all-samples", action="store_true",
                        help="every sample, also of entries whose grid the sweep strides over (max pooling)")
    opinfo.add_argument("--shard", default="0/1", help="i/n: run every n-th op from the i-th (parallel sweeps)")
    opinfo.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32",
                        help="dtype of the samples (default: %(default)s); float16/bfloat16 take the claimed ops "
                             "whose OpInfo lists that dtype on the CPU, judged against eager in that dtype")
    opinfo.add_argument("--jsonl", default=None, help="append one JSON line per sample to this file")
    opinfo.add_argument("--database", action="store_true",
                        help="every OpInfo entry, claimed or not: counts pass / clear error / not traceable / "
                             "internal error / wrong result apart; fails on internal errors and wrong results")
    opinfo.add_argument("--error-inputs", action="store_true",
                        help="OpInfo's error inputs and mixed-dtype operands of every claimed op: the compiled "
                             "call must raise what eager raises (same exception type)")
    opinfo.set_defaults(fn=cmd_opinfo)
    federated = sub.add_parser(
        "federated", help="federated learning with Flower: a local federation on the digits, or a server or client")
    federated.add_argument("--role", choices=("local", "server", "client"), default="local",
                           help="local: a server and --clients client processes on this machine over loopback; "
                                "server: the server alone, for clients elsewhere; client: one client "
                                "(default: %(default)s)")
    federated.add_argument("--clients", type=positive_int, default=3, help="clients in the federation (default: %(default)s)")
    federated.add_argument("--rounds", type=positive_int, default=5, help="FedAvg rounds (default: %(default)s)")
    federated.add_argument("--epochs", type=positive_int, default=2, help="local epochs per round (default: %(default)s)")
    federated.add_argument("--batch-size", type=positive_int, default=32, help="digits per step (default: %(default)s)")
    federated.add_argument("--lr", type=positive_float, default=2e-3, help="Adam's learning rate (default: %(default)s)")
    federated.add_argument("--skew", type=share, default=0.9,
                           help="share of each digit's examples held by the client that owns it; 1/clients is "
                                "IID, 1 gives each client only its own digits (default: %(default)s)")
    federated.add_argument("--seed", type=seed_int, default=0, help="initial weights and data split (default: %(default)s)")
    federated.add_argument("--optimizer-state", choices=("reset", "keep"), default="reset",
                           help="Adam's state at the start of a round: zeroed, or kept from the last round "
                                "(default: %(default)s)")
    federated.add_argument("--device", type=device_spec, default=None, help=device_help)
    federated.add_argument("--no-zero-copy", action="store_true",
                           help="copy parameters to the device even on unified memory (shows the bytes moved)")
    federated.add_argument("--address", type=address, default=None,
                           help="where the server listens (default: 127.0.0.1 and a free port; a server for "
                                "other machines: 0.0.0.0:PORT)")
    federated.add_argument("--server", type=address, default=None, help="the server a client connects to, HOST:PORT")
    federated.add_argument("--client-index", type=seed_int, default=None,
                           help="which share of the digits a client trains on, 0..clients-1")
    federated.add_argument("--round-timeout", type=positive_float, default=300.0,
                           help="seconds a round waits for its clients (default: %(default)s)")
    federated.add_argument("--timeout", type=positive_float, default=1800.0,
                           help="seconds the whole federation may take (default: %(default)s)")
    federated.add_argument("--connect-timeout", type=positive_float, default=60.0,
                           help="seconds a client keeps trying to reach the server (default: %(default)s)")
    federated.add_argument("--fail-client", action="append", default=[], metavar="CLIENT:ROUND",
                           help="fault injection: that client's process exits halfway through that round")
    federated.add_argument("--fail-at-round", type=positive_int, default=None, help=argparse.SUPPRESS)
    federated.add_argument("--exit-with-parent", action="store_true", help=argparse.SUPPRESS)
    federated.set_defaults(fn=cmd_federated)
    args = parser.parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
