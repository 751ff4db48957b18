"""What checking a step file's integrity record costs (torch_adreno/runner/integrity.py, and
native/src/integrity.c): the SHA-256 of every initializer, of the kernel sources and of the
operations, in the Python runner and in the native runtime, on a LeNet export and on a file of
GPT-2 small's size (that LeNet export plus one initializer of 124,439,808 float32 values, the
parameters of GPT-2 small, sealed again: ~500 MB).

    python benchmarks/step_integrity.py [--repeats 3]

Python: ``integrity.verify`` on the loaded model (the load itself reported apart). Native: the
readers' driver (``fuzz-readers onnx FILE 0``: read, integrity check, plan) timed on the file and
on the same file without its record (the check then stops at once); the difference is the check.
Wall-clock and CPU seconds (medians; the CPU time holds no neighbour's load on a shared machine).
Appends JSON lines to benchmarks/results/host-cpu/step_integrity.jsonl. Not a test: asserts nothing.
"""

from __future__ import annotations

import argparse
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).parent))

from common import RESULTS, append_jsonl

from torch_adreno.cli import main as cli_main
from torch_adreno.cli.native import build_native
from torch_adreno.runner import integrity

GPT2_SMALL_PARAMETERS = 124_439_808


def _median_seconds(action, repeats: int) -> tuple[float, float]:
    """Median wall-clock and CPU seconds of ``action`` (this process's CPU time and its children's:
    on a shared machine the wall clock holds the neighbours' load, the CPU time does not)."""
    walls, cpus = [], []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu, started = time.process_time(), time.perf_counter()
        action()
        walls.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(time.process_time() - cpu + (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime))
    return statistics.median(walls), statistics.median(cpus)


def _without_record(path: Path, out: Path) -> Path:
    model = onnx.load(str(path))
    kept = [p for p in model.metadata_props if p.key != integrity.INTEGRITY_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    onnx.save(model, str(out))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="step_integrity_"))
    lenet = work / "lenet.onnx"
    assert cli_main(["export", str(lenet), "--model", "digits"]) == 0
    model = onnx.load(str(lenet))
    big = np.random.default_rng(0).standard_normal(GPT2_SMALL_PARAMETERS, dtype=np.float32)
    model.graph.initializer.append(numpy_helper.from_array(big, "gpt2_small_sized"))
    del big
    gpt2_sized = work / "gpt2_small_sized.onnx"
    onnx.save(integrity.seal(model), str(gpt2_sized))
    del model
    reader = build_native(build_dir=work / "native").fuzz_driver
    assert reader is not None
    for name, path in (("lenet", lenet), ("gpt2_small_sized", gpt2_sized)):
        started = time.perf_counter()
        loaded = onnx.load(str(path))
        load_s = time.perf_counter() - started
        python_s, python_cpu = _median_seconds(lambda loaded=loaded: integrity.verify(loaded), args.repeats)
        del loaded
        bare = _without_record(path, work / f"{name}.bare.onnx")
        native = {}
        for kind, file in (("sealed", path), ("bare", bare)):
            native[kind] = _median_seconds(lambda file=file: subprocess.run(
                [str(reader), "onnx", str(file), "0"], capture_output=True, check=False), args.repeats)
        record = {"file": name, "bytes": path.stat().st_size, "python_load_s": round(load_s, 4),
                  "python_verify_s": round(python_s, 4), "python_verify_cpu_s": round(python_cpu, 4),
                  "native_read_and_check_s": round(native["sealed"][0], 4), "native_read_s": round(native["bare"][0], 4),
                  "native_check_s": round(native["sealed"][0] - native["bare"][0], 4),
                  "native_check_cpu_s": round(native["sealed"][1] - native["bare"][1], 4),
                  "host": platform.processor() or platform.machine(), "date": time.strftime("%Y-%m-%d"),
                  "repeats": args.repeats}
        print(record)
        append_jsonl(RESULTS / "host-cpu" / "step_integrity.jsonl", [record])
    return 0


if __name__ == "__main__":
    sys.exit(main())
