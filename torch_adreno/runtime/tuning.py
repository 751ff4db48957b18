"""Work-group tuning (``options={"tune": True}`` or ``TORCH_ADRENO_TUNE=1``): time each kernel's
launch candidates on the device, keep the fastest whose output matches the default's, and remember
the choice on disk so that a later process does not tune again.

* **Candidates** come from :func:`torch_adreno.kernels.launch_candidates`, the heuristic's launch
  first: local sizes of pointwise and reduction kernels, group sizes of tree reductions, tilings of
  the GEMM templates. Variants whose build options differ are built as programs of their own, one
  program per round of variants across the graph's kernels.
* **Isolation**: candidates run on scratch buffers, never on the graph's. Each kernel argument gets
  a scratch buffer of its buffer's size, filled with deterministic pseudo-random data (floats in
  [0.5, 1.5): no domain errors in log/sqrt/division and no cancellation in sums, so a relative
  tolerance is meaningful; integers 0, the one index valid in every non-empty dimension, so a
  gather never reads outside its scratch buffer; booleans random). Every argument is restored
  from a pristine device copy before every launch: in-place kernels see the same inputs each time.
* **Verification**: the default launch's output is the reference. A candidate is accepted only if
  every argument buffer afterwards matches it: integers and booleans exactly, floats within
  :data:`RTOL` of the value plus :data:`ATOL_FRACTION` of the buffer's largest magnitude (another
  local size may reassociate a reduction), with NaN where the reference has NaN. A candidate that
  does not match, does not build, exceeds the kernel's work-group limit or fails to launch is
  rejected with the reason: logged (a mismatch as a warning: it is a driver or kernel bug), kept in
  :class:`TuningResult` and in the cache entry. Rejected candidates are never timed.
* **Timing**: OpenCL profiling events (the runtime's queue has profiling on); the best of
  :data:`REPEATS` launches after the verifying one (which also absorbs a JIT compile per local size,
  as on PoCL), in rounds through all verified candidates so that changing load hits them alike. A
  candidate replaces the default only when it is at least :data:`MIN_GAIN` faster.
* **Cache**: one JSON file per kernel under ``tuning/<device>/`` in
  :func:`torch_adreno.config.cache_root`, keyed by device, driver and platform (the directory) and
  by the kernel (sha256 of its content, :meth:`~torch_adreno.kernels.KernelSource.content`, and
  its launch geometry, which fix the shapes): the same kernel in another graph or process shares
  the entry, and kernels of one key in a graph (a model's repeated blocks) are tuned once. A
  cached choice that is no longer among the candidates (the candidate rules changed) is tuned
  again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl
from tqdm import tqdm

from torch_adreno import ir
from torch_adreno.config import cache_root
from torch_adreno.errors import KernelBuildError
from torch_adreno.kernels import KernelChoices, KernelSource, launch_candidates
from torch_adreno.runtime.build import build_kernels
from torch_adreno.runtime.device import DeviceRuntime
from torch_adreno.runtime.images import image_views
from torch_adreno.targets import DeviceProfile

log = logging.getLogger(__name__)

#: Bump when the key's fields or the entry's layout change: older entries then stop matching.
TUNING_VERSION = 2
#: Timed launches per candidate (after the verifying one); the best counts.
REPEATS = 5
#: A candidate whose first timed launch is this many times slower than the best first launch is
#: not launched again: it cannot win, and a slow candidate of a large GEMM costs real time.
GIVE_UP_FACTOR = 4.0
#: Fraction by which a candidate must beat the default to replace it: smaller differences are
#: timing noise and would make the choice flip between processes.
MIN_GAIN = 0.05
#: Float tolerance: |candidate - reference| <= RTOL * |reference| + ATOL_FRACTION * max|reference|.
#: Reassociating a float32 sum of n terms of one sign moves it by about sqrt(n) * 6e-8 relative;
#: a wrong work-group shape drops or repeats whole groups of terms.
RTOL = 1e-4
ATOL_FRACTION = 1e-6

#: 16-bit float results may also differ by one unit in their last place (a reassociated float32
#: sum rounded to 16 bits): relative tolerances per NumPy storage type (bfloat16 as its bits).
HALF_RTOL = {np.dtype(np.float16): 2e-3, np.dtype(np.uint16): 1.6e-2}

_NUMPY_DTYPES = {ir.DType.F32: np.float32, ir.DType.F16: np.float16, ir.DType.BF16: np.uint16,
                 ir.DType.I64: np.int64, ir.DType.I32: np.int32, ir.DType.BOOL: np.uint8, ir.DType.U8: np.uint8}


def _as_float32(array: np.ndarray) -> np.ndarray:
    """Values of a float buffer's host copy as float32 (bfloat16 is held as its 16 bits)."""
    if array.dtype == np.uint16:
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(np.float32)


@dataclass(frozen=True)
class Rejection:
    """A candidate not used, and why. ``wrong_result``: it ran but its output did not match the
    default launch's (the others did not build, exceeded a limit or failed to launch)."""

    candidate: str
    reason: str
    wrong_result: bool = False


@dataclass
class TuningResult:
    """The outcome of tuning one kernel. ``chosen`` is the launch to use (the default unless a
    verified candidate was :data:`MIN_GAIN` faster). Times are seconds of one launch; with
    ``cached`` true they are those measured by the process that tuned, and nothing was timed now."""

    kernel: str
    key: str
    chosen: KernelSource
    label: str
    cached: bool
    default_s: float
    chosen_s: float
    timings: dict[str, float] = field(default_factory=dict)
    rejected: list[Rejection] = field(default_factory=list)


def describe(candidate: KernelSource, default: KernelSource) -> str:
    """A short label that tells launches apart: global and local size, and the build options that
    differ from the default's."""
    changed = [o[2:] for o in candidate.build_options if o not in default.build_options]
    return " ".join([f"global={list(candidate.global_size)}", f"local={list(candidate.local_size)}", *changed])


def kernel_key(kernel: KernelSource, target: str = "") -> str:
    """Identity of a kernel for the cache, the same for the same code and shapes in any graph.
    ``target``: the Adreno target the launches were limited to (its candidates differ)."""
    # Its content: rendered under one symbol for every kernel and without the header (which names
    # the FX nodes).
    source, options = kernel.content()
    payload = json.dumps([TUNING_VERSION, kernel.kind, source, options, kernel.global_size,
                          kernel.local_size] + ([target] if target else []))
    return hashlib.sha256(payload.encode()).hexdigest()


def device_cache_dir(runtime: DeviceRuntime) -> Path:
    """Tuning entries of one device and driver (``DeviceProfile.key``)."""
    slug = re.sub(r"[^0-9A-Za-z]+", "_", runtime.profile.name)[:40].strip("_")
    digest = hashlib.sha256(runtime.profile.key.encode()).hexdigest()[:16]
    return cache_root() / "tuning" / f"{slug}-{digest}"


def _launch_id(k: KernelSource) -> list[Any]:
    return [list(k.build_options), list(k.global_size), list(k.local_size)]


def _load(runtime: DeviceRuntime, key: str, candidates: Sequence[KernelSource]) -> TuningResult | None:
    path = device_cache_dir(runtime) / f"{key}.json"
    try:
        entry = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        log.warning("tuning cache entry %s is unreadable (%s): tuning again", path, err)
        return None
    by_id = {json.dumps(_launch_id(c)): c for c in candidates}
    try:
        chosen = by_id.get(json.dumps(entry["choice"]))
        if entry["device"] != runtime.profile.key or chosen is None:
            log.info("tuning cache entry %s no longer matches the candidates of %s: tuning again", path,
                     candidates[0].name)
            return None
        return TuningResult(candidates[0].name, key, chosen, describe(chosen, candidates[0]), True,
                            float(entry["default_s"]), float(entry["chosen_s"]), dict(entry["timings"]),
                            [Rejection(**r) for r in entry["rejected"]])
    except (KeyError, TypeError, ValueError) as err:
        log.warning("tuning cache entry %s is malformed (%r): tuning again", path, err)
        return None


def _store(runtime: DeviceRuntime, result: TuningResult) -> None:
    """Write the entry atomically (a temporary file renamed over it): concurrent processes tuning
    the same kernel each leave a whole, valid entry."""
    directory = device_cache_dir(runtime)
    entry = {
        "version": TUNING_VERSION, "device": runtime.profile.key, "kernel": result.kernel,
        "choice": _launch_id(result.chosen), "label": result.label, "default_s": result.default_s,
        "chosen_s": result.chosen_s, "timings": result.timings,
        "rejected": [asdict(r) for r in result.rejected],
    }
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f, indent=1)
        os.replace(tmp, directory / f"{result.key}.json")
    except OSError as err:
        log.warning("could not cache the tuning of %s in %s (%s): a later process tunes it again",
                    result.kernel, directory, err)


class _Scratch:
    """Device buffers for one kernel's arguments, with pristine copies to restore them from."""

    def __init__(self, runtime: DeviceRuntime, graph: ir.Graph, kernel: KernelSource, seed: int) -> None:
        self.runtime = runtime
        rng = np.random.default_rng(seed)
        self.arrays: list[np.ndarray] = []
        for name in kernel.params:
            buf = graph.buffers[name]
            dtype = _NUMPY_DTYPES[buf.dtype]
            if buf.dtype is ir.DType.BF16:
                data = (rng.uniform(0.5, 1.5, buf.numel).astype(np.float32).view(np.uint32) >> 16).astype(dtype)
            elif buf.dtype.is_float:
                data = rng.uniform(0.5, 1.5, buf.numel).astype(dtype)
            elif buf.dtype is ir.DType.BOOL:
                data = rng.integers(0, 2, buf.numel).astype(dtype)
            else:
                data = np.zeros(buf.numel, dtype)
            self.arrays.append(data)
        flags = cl.mem_flags
        ctx = runtime.context
        self.pristine = [cl.Buffer(ctx, flags.READ_ONLY | flags.COPY_HOST_PTR, hostbuf=a) if a.nbytes
                         else cl.Buffer(ctx, flags.READ_ONLY, 1) for a in self.arrays]
        self.buffers = [cl.Buffer(ctx, flags.READ_WRITE, max(a.nbytes, 1)) for a in self.arrays]
        # A kernel that checks indices gets an error record of its own (the scratch integer inputs
        # are zeros, valid indices; the device's record is never touched by a candidate).
        self.index_record = (cl.Buffer(ctx, flags.READ_WRITE | flags.COPY_HOST_PTR, hostbuf=np.zeros(4, np.int32))
                             if kernel.checks_indices else None)
        self.source = kernel
        self._images: list[Any] = []

    def bind(self, kernel: cl.Kernel) -> None:
        for i, buf in enumerate(self.buffers):
            kernel.set_arg(i, buf)
        if self.index_record is not None:
            kernel.set_arg(len(self.buffers), self.index_record)
            kernel.set_arg(len(self.buffers) + 1, np.int32(1))
        if self.source.images:  # (every candidate reads the same operands through images)
            by_param = dict(zip(self.source.params, self.buffers, strict=True))
            self._images = image_views(self.runtime).bind(kernel, self.source, by_param.__getitem__)

    def restore(self) -> None:
        for src, dst, a in zip(self.pristine, self.buffers, self.arrays, strict=True):
            if a.nbytes:
                cl.enqueue_copy(self.runtime.queue, dst, src, byte_count=a.nbytes)
        for image in self._images:
            image.refresh(self.runtime.queue)

    def read(self) -> list[np.ndarray]:
        out = [np.empty_like(a) for a in self.arrays]
        for buf, host in zip(self.buffers, out, strict=True):
            if host.nbytes:
                cl.enqueue_copy(self.runtime.queue, host, buf, is_blocking=False)
        self.runtime.queue.finish()
        return out


def _launch(runtime: DeviceRuntime, kernel: cl.Kernel, candidate: KernelSource) -> cl.Event:
    return cl.enqueue_nd_range_kernel(runtime.queue, kernel, candidate.global_size, candidate.local_size)


def _seconds(event: cl.Event) -> float:
    event.wait()
    return float(event.profile.end - event.profile.start) * 1e-9


def time_candidates(runtime: DeviceRuntime, scratch: _Scratch, launches: Sequence[tuple[KernelSource, cl.Kernel]]
                    ) -> list[float]:
    """Best seconds of one launch of each of ``launches`` over :data:`REPEATS` rounds, each launch on
    freshly restored arguments. Rounds go through all candidates in turn, so that a change of load
    on a shared device (or a clock that ramps up) affects them alike; after the first round, a
    candidate :data:`GIVE_UP_FACTOR` times slower than the best is not launched again."""
    times: list[list[float]] = [[] for _ in launches]
    alive = list(range(len(launches)))
    for round_ in range(REPEATS):
        for i in alive:
            candidate, kernel = launches[i]
            scratch.bind(kernel)
            scratch.restore()
            times[i].append(_seconds(_launch(runtime, kernel, candidate)))
        if round_ == 0:
            best = min(times[i][0] for i in alive)
            alive = [i for i in alive if times[i][0] <= GIVE_UP_FACTOR * best]
    return [min(t) for t in times]


def mismatch(names: Sequence[str], reference: Sequence[np.ndarray], output: Sequence[np.ndarray]) -> str | None:
    """Why ``output`` does not match ``reference`` (argument by argument), or None if it does."""
    for name, ref, out in zip(names, reference, output, strict=True):
        if ref.dtype in (np.float32, np.float16, np.uint16):
            rtol = HALF_RTOL.get(ref.dtype, RTOL)
            ref, out = _as_float32(ref), _as_float32(out)
            finite = np.abs(ref[np.isfinite(ref)])
            atol = ATOL_FRACTION * float(finite.max()) if finite.size else 0.0
            close = np.isclose(out, ref, rtol=rtol, atol=atol, equal_nan=True)
        else:
            close = out == ref
        if not close.all():
            bad = np.flatnonzero(~close)
            with np.errstate(invalid="ignore", over="ignore"):
                diff = np.abs(out[bad].astype(np.float64) - ref[bad].astype(np.float64))
            return (f"buffer {name} differs from the default launch's at {bad.size} of {ref.size} elements "
                    f"(first at {int(bad[0])}: {out[bad[0]].item()!r} instead of {ref[bad[0]].item()!r}; largest difference "
                    f"{float(np.nanmax(diff)) if np.isfinite(diff).any() else float('nan'):.3g})")
    return None


def _build_rounds(runtime: DeviceRuntime, program: Sequence[KernelSource], todo: dict[str, list[KernelSource]],
                  report: Callable[[str], None]) -> dict[tuple[str, tuple[str, ...]], cl.Kernel | str]:
    """A kernel object (or the build error) per (kernel name, build options) among the candidates.

    Round 0 is the graph's own program (``program``, every kernel with its default options): when
    the choices change no build options, the program built afterwards is this one, found in the
    process's program cache. A failure there is a real error and is raised. Round r > 0 builds the
    r-th distinct set of build options of every kernel that has one, as one program (names are
    unique within a round); a round that fails is built kernel by kernel, so that one candidate's
    failure rejects only that candidate.
    """
    variants: dict[str, list[KernelSource]] = {}
    for name, candidates in todo.items():
        first: dict[tuple[str, ...], KernelSource] = {}
        for c in candidates:
            first.setdefault(c.build_options, c)
        variants[name] = list(first.values())
    built: dict[tuple[str, tuple[str, ...]], cl.Kernel | str] = {}
    rounds = max((len(v) for v in variants.values()), default=0)
    for r in range(rounds):
        report(f"building variants {r + 1}/{rounds}")
        batch = list(program) if r == 0 else [v[r] for v in variants.values() if len(v) > r]
        try:
            objects = build_kernels(runtime, batch)
        except KernelBuildError:
            if r == 0:
                raise
            objects = {}
            for k in batch:
                try:
                    objects.update(build_kernels(runtime, [k]))
                except KernelBuildError as err:
                    built[(k.name, k.build_options)] = f"does not build: {str(err).splitlines()[0]}"
        for k in batch:
            if k.name in objects:
                built[(k.name, k.build_options)] = objects[k.name]
    return built


def _tune_one(runtime: DeviceRuntime, graph: ir.Graph, key: str, candidates: list[KernelSource],
              built: dict[tuple[str, tuple[str, ...]], cl.Kernel | str], advance: Callable[[], None]) -> TuningResult:
    """Verify every candidate against the default's output, then time the ones that match."""
    default = candidates[0]
    scratch = _Scratch(runtime, graph, default, seed=int(key[:8], 16))
    default_kernel = built[(default.name, default.build_options)]
    assert isinstance(default_kernel, cl.Kernel), "the defaults are built or raised"
    scratch.bind(default_kernel)
    scratch.restore()
    _launch(runtime, default_kernel, default).wait()
    reference = scratch.read()
    advance()
    accepted: list[tuple[KernelSource, cl.Kernel]] = [(default, default_kernel)]
    rejected: list[Rejection] = []
    for candidate in candidates[1:]:
        label = describe(candidate, default)
        obj = built[(candidate.name, candidate.build_options)]
        rejection = _verify(runtime, label, candidate, obj, scratch, reference)
        if rejection is not None:
            rejected.append(rejection)
            # A wrong result is a driver (or kernel) bug worth seeing; a limit is routine.
            (log.warning if rejection.wrong_result else log.info)(
                "tuning %s: rejected %s: %s", default.name, label, rejection.reason)
        else:
            assert isinstance(obj, cl.Kernel)
            accepted.append((candidate, obj))
        advance()
    seconds = time_candidates(runtime, scratch, accepted)
    timings = {describe(c, default): t for (c, _), t in zip(accepted, seconds, strict=True)}
    at = min(range(len(accepted)), key=seconds.__getitem__)
    if seconds[at] > (1 - MIN_GAIN) * seconds[0]:
        at = 0
    best = accepted[at][0]
    return TuningResult(default.name, key, best, describe(best, default), False, seconds[0], seconds[at], timings,
                        rejected)


def _verify(runtime: DeviceRuntime, label: str, candidate: KernelSource, obj: cl.Kernel | str, scratch: _Scratch,
            reference: Sequence[np.ndarray]) -> Rejection | None:
    """Why ``candidate`` cannot be used (it does not build, launch, or match), or None."""
    if isinstance(obj, str):
        return Rejection(label, obj)
    limit = int(obj.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, runtime.device))
    if math.prod(candidate.local_size) > limit:
        return Rejection(label, f"local size {list(candidate.local_size)} exceeds this kernel's limit of {limit} "
                         "work-items")
    scratch.bind(obj)
    scratch.restore()
    try:
        _launch(runtime, obj, candidate).wait()
        output = scratch.read()
    except cl.Error as err:
        return Rejection(label, f"launch failed: {err}")
    reason = mismatch(candidate.params, reference, output)
    return Rejection(label, reason, wrong_result=True) if reason is not None else None


def tune_kernels(runtime: DeviceRuntime, graph: ir.Graph, kernels: Sequence[KernelSource],
                 progress: bool = True, profile: DeviceProfile | None = None,
                 choices: KernelChoices | None = None) -> dict[str, TuningResult]:
    """Tuning results of ``kernels`` (of ``graph``, whose buffers give the arguments' shapes and
    types), from the cache or measured now behind a progress bar; kernels that launch nothing are
    left out. ``profile``: the limits the kernels were compiled within (a target's, narrower than
    the device's); candidates stay inside them. Default: the device's own. ``choices``: the code
    choices the kernels were rendered with (default: the device's own)."""
    profile = profile or runtime.profile
    results: dict[str, TuningResult] = {}
    todo: dict[str, list[KernelSource]] = {}
    keys: dict[str, str] = {}
    # Kernels of one key (the same code on the same shapes) are tuned once, as the first of them.
    first_of: dict[str, KernelSource] = {}
    repeats: list[tuple[KernelSource, KernelSource]] = []
    for kernel in kernels:
        if 0 in kernel.global_size:
            continue
        key = kernel_key(kernel, profile.target)
        if key in first_of:
            repeats.append((kernel, first_of[key]))
            continue
        first_of[key] = kernel
        candidates = launch_candidates(kernel, profile, choices)
        keys[kernel.name] = key
        cached = _load(runtime, key, candidates)
        if cached is not None:
            results[kernel.name] = cached
        elif len(candidates) > 1:
            todo[kernel.name] = candidates
        else:
            results[kernel.name] = TuningResult(kernel.name, key, kernel, describe(kernel, kernel), False, 0.0, 0.0)
    if todo:
        total = sum(len(c) for c in todo.values())
        with tqdm(total=total, desc=f"tuning {graph.name}", unit="launch", disable=not progress) as bar:
            built = _build_rounds(runtime, kernels, todo, bar.set_postfix_str)
            for name, candidates in todo.items():
                bar.set_postfix_str(name)
                result = _tune_one(runtime, graph, keys[name], candidates, built, lambda: bar.update(1))
                _store(runtime, result)
                results[name] = result
    for kernel, first in repeats:
        results[kernel.name] = _as_tuned_for(results[first.name], kernel)
    return results


def _as_tuned_for(result: TuningResult, kernel: KernelSource) -> TuningResult:
    """``result`` (of a kernel of the same key) for ``kernel``: its chosen build options and launch
    geometry on ``kernel`` itself (its name, parameters and FX nodes)."""
    chosen = replace(kernel, build_options=result.chosen.build_options, global_size=result.chosen.global_size,
                     local_size=result.chosen.local_size)
    return replace(result, kernel=kernel.name, chosen=chosen)
