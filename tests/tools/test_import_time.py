"""``import torch_adreno`` stays light: it adds under half a second to ``import torch``, and leaves
Dynamo, OpenCL, ONNX and transformers for their first use; the backend's name still works with
``torch.compile`` from a source checkout (no entry point), its options checked at the call.

Each measurement runs in fresh interpreters (a module once imported costs nothing again), with
this tree's torch_adreno first on the path. No device is needed.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch_adreno

TREE = str(Path(torch_adreno.__file__).resolve().parents[1])

#: Modules whose import takes a large part of a second or more; none may load with the package.
HEAVY = ("torch._dynamo", "pyopencl", "transformers", "onnx", "torch_adreno.api", "torch_adreno.frontend")
#: The most ``import torch_adreno`` may add to ``import torch`` (wall time, medians of fresh runs).
BUDGET_S = 0.5
RUNS = 5


def _python(code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TREE, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{code}\nfailed:\n{result.stderr[-3000:]}"
    return result


def _wall_s(code: str) -> float:
    start = time.perf_counter()
    _python(code)
    return time.perf_counter() - start


def test_import_loads_no_heavy_module():
    code = ("import sys, json, torch, torch_adreno; "
            f"print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))")
    loaded = json.loads(_python(code).stdout)
    assert loaded == [], f"import torch_adreno imported {loaded}: import them where they are first used"


def test_import_adds_under_half_a_second_to_import_torch():
    # Interleaved, so that a burst of load on the machine falls on both.
    torch_alone, with_package = [], []
    for _ in range(RUNS):
        torch_alone.append(_wall_s("import torch"))
        with_package.append(_wall_s("import torch, torch_adreno"))
    added = statistics.median(with_package) - statistics.median(torch_alone)
    assert added < BUDGET_S, (f"import torch_adreno adds {added:.2f} s to import torch (medians of {RUNS}: "
                              f"{statistics.median(with_package):.2f} s vs {statistics.median(torch_alone):.2f} s)")


def test_public_names_load_at_first_use():
    code = ("import sys, torch_adreno; assert 'torch_adreno.api' not in sys.modules; "
            "from torch_adreno import *; "
            "import torch._dynamo.exc as exc; "
            "assert TrainingStep is sys.modules['torch_adreno.training.step'].TrainingStep; "
            "assert profile is torch_adreno.profile and torch_adreno.errors.OptionError is OptionError; "
            "assert sorted(torch_adreno.__all__) == sorted(sys.modules['torch_adreno.api'].__all__); "
            "assert issubclass(OptionError, exc.ShortenTraceback) and issubclass(OptionError, ValueError); "
            "assert sys.modules['torch_adreno.torch_patches']._installed")
    _python(code)


def test_backend_name_works_from_a_source_checkout():
    """Without the installed entry point, ``import torch_adreno`` makes the name known to Dynamo
    (without importing it); the first ``torch.compile`` naming it loads the backend and its patches,
    so an unknown option fails there, as the user's error (a ShortenTraceback that Dynamo lets through)."""
    code = ("import importlib.metadata as md, sys\n"
            "every = md.entry_points\n"
            "md.entry_points = lambda **kw: md.EntryPoints(e for e in every(**kw) if e.name != 'adreno')\n"
            "import torch, torch_adreno\n"
            "assert 'torch._dynamo' not in sys.modules\n"
            "try:\n"
            "    torch.compile(torch.nn.Linear(2, 2), backend='adreno', options={'colour': 'blue'})\n"
            "except torch_adreno.OptionError as err:\n"
            "    import torch._dynamo.exc as exc\n"
            "    assert isinstance(err, exc.ShortenTraceback), type(err).__mro__\n"
            "    print('refused:', err)\n"
            "from torch._dynamo.backends import registry\n"
            "assert registry.lookup_backend('adreno') is torch_adreno.adreno_backend\n")
    result = _python(code, timeout=300)
    assert "refused:" in result.stdout and "colour" in result.stdout, result.stdout + result.stderr
