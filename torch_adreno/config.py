"""Backend options: one table of what a user may pass, validated into a frozen :class:`Config`.

Precedence for each option: ``torch.compile(..., options={...})``, then its ``TORCH_ADRENO_*``
environment variable, then the default.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from torch_adreno.errors import OptionError
from torch_adreno.targets.profiles import AdrenoTarget, get_target

#: This package's version (the exported ONNX files record it).
VERSION = "0.1.0"
#: The name ``torch.compile`` knows the backend by.
BACKEND_NAME = "adreno"


def _device_value(value: Any) -> str | int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, str) and value.strip():
        return int(value) if value.strip().isdigit() else value.strip()
    if isinstance(value, str):
        raise ValueError("must name a device (an index or a substring of its name), got an empty string; "
                         "leave it unset for the default device")
    raise ValueError(f"must be an int index or a name substring (see `python -m torch_adreno devices`), "
                     f"got {value!r}")


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return value.strip().lower() in ("1", "true", "yes", "on")
    raise ValueError(f"must be True or False, got {value!r}")


def _path(value: Any) -> str | None:
    if value is None or isinstance(value, (str, os.PathLike)):
        return os.fspath(value) if value is not None else None
    raise ValueError(f"must be a directory path, got {value!r}")


def _auto_bool(value: Any) -> str | bool:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return _bool(value)
    except ValueError:
        raise ValueError(f"must be 'auto', True or False, got {value!r}") from None


def _auto_bool_or_count(value: Any) -> str | bool | int:
    """'auto', True, False, or a positive int (a count that also means True)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str) and value.strip().isdigit() and int(value) > 0:
        return int(value)
    try:
        return _auto_bool(value)
    except ValueError:
        raise ValueError(f"must be 'auto', True, False or a positive number of tokens, got {value!r}") from None


def _count(value: Any) -> int:
    """A number of steps: an int >= 0."""
    if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit())):
        raise ValueError(f"must be a whole number of steps (0: off), got {value!r}")
    number = int(value)
    if number < 0:
        raise ValueError(f"must be a whole number of steps (0: off), got {value!r}")
    return number


def _fraction(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"must be a number in (0, 1], got {value!r}") from None
    if not 0 < number <= 1 or isinstance(value, bool):
        raise ValueError(f"must be a number in (0, 1], got {value!r}")
    return number


def _target(value: Any) -> AdrenoTarget | None:
    """The compile target: a profile of :mod:`torch_adreno.targets.profiles` by name, a profile
    itself (a derived one, or a remote device's), or None (the device itself)."""
    if value is None or isinstance(value, AdrenoTarget):
        return value
    if isinstance(value, str) and value.strip().lower() in ("", "none"):
        return None
    name = value.strip().lower() if isinstance(value, str) else value
    return get_target(name)


def _choice(*choices: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(map(repr, choices))}, got {value!r}")
        return str(value)

    check.choices = choices  # type: ignore[attr-defined]
    return check


@dataclass(frozen=True)
class OptionSpec:
    name: str
    parse: Callable[[Any], Any]
    default: Any
    env: str | None
    doc: str


OPTIONS: dict[str, OptionSpec] = {
    spec.name: spec
    for spec in (
        OptionSpec(
            "device", _device_value, None, "TORCH_ADRENO_DEVICE",
            "OpenCL device: index into `python -m torch_adreno devices`, or a substring of its name "
            "or platform; default: the first GPU, else the first device",
        ),
        OptionSpec(
            "fallback", _choice("error", "host"), "error", "TORCH_ADRENO_FALLBACK",
            "what to do with an op the backend cannot lower: 'error' (default) raises naming the op; "
            "'host' runs it with PyTorch on the host, warns once and counts it in the profile",
        ),
        OptionSpec(
            "debug_dir", _path, None, "TORCH_ADRENO_DEBUG",
            "a directory: per compiled graph, write the FX graph, the IR before and after fusion with "
            "every fusion decision and its reason, the memory plan, and each kernel's OpenCL source",
        ),
        OptionSpec(
            "fusion", _bool, True, "TORCH_ADRENO_FUSION",
            "fuse IR nodes into fewer kernels (default True); False gives one kernel per node, the "
            "baseline fusion is measured against",
        ),
        OptionSpec(
            "memory_reuse", _bool, True, "TORCH_ADRENO_MEMORY_REUSE",
            "let intermediates whose lifetimes do not overlap share device memory, and update in place "
            "where legal (default True); False gives every intermediate its own bytes",
        ),
        OptionSpec(
            "zero_copy", _auto_bool, "auto", "TORCH_ADRENO_ZERO_COPY",
            "use host tensors' memory in place on the device instead of copying ('auto', the default: "
            "on unified-memory devices such as phones and PoCL; True requires such a device; False "
            "always copies)",
        ),
        OptionSpec(
            "activation_memory_budget", _fraction, 1.0, "TORCH_ADRENO_ACTIVATION_MEMORY_BUDGET",
            "share of the saved activations' bytes the forward may keep for the backward; below 1 the "
            "partitioner recomputes cheap ops (normalisations, activations) in the backward instead "
            "(default 1.0: save everything the backward reads, fewest bytes moved)",
        ),
        OptionSpec(
            "tune", _bool, False, "TORCH_ADRENO_TUNE",
            "time alternative work-group sizes and GEMM tilings of each kernel with OpenCL profiling "
            "events when it is compiled, keep the fastest whose output matches the default's, and cache "
            "the choice on disk per device, driver, kernel and shape (default False: the heuristic)",
        ),
        OptionSpec(
            "images", _auto_bool, "auto", "TORCH_ADRENO_IMAGES",
            "read GEMM and convolution operands (weights, and activations whose layout fits) through "
            "2D images, the texture cache path ('auto', the default: where the device prefers it, "
            "Adreno GPUs; True requires a device with image support; False always reads buffers)",
        ),
        OptionSpec(
            "native_half", _bool, False, "TORCH_ADRENO_NATIVE_HALF",
            "compute float16 pointwise kernels in half registers (cl_khr_fp16; refused on devices "
            "without it) instead of float32 registers rounded to float16 where eager rounds (default "
            "False; unmeasured)",
        ),
        OptionSpec(
            "compile_cache", _bool, True, "TORCH_ADRENO_COMPILE_CACHE",
            "keep each compiled graph (AOTAutograd's forward and backward with our kernel programs) in "
            "PyTorch's AOTAutograd disk cache, so a later process compiling the same graph with the same "
            "options, device and torch_adreno source skips tracing, partitioning and our stages "
            "(default True; off while debug_dir is set, so that every compile writes its files)",
        ),
        OptionSpec(
            "verify_memory", _bool, False, "TORCH_ADRENO_VERIFY_MEMORY",
            "check every memory plan against what runs: each compiled graph's launches (when compiled, "
            "and at its first call with each pattern of inputs sharing memory) and each captured "
            "training step's whole-step plan; a value overwritten while still to be read raises "
            "MemoryPlanError naming the kernel, the storage and both values (default False; the test "
            "suite turns it on)",
        ),
        OptionSpec(
            "verify_replay", _count, 0, "TORCH_ADRENO_VERIFY_REPLAY",
            "a TrainingStep also runs each of its first N replayed steps through the compiled graphs (as "
            "captured) from the same state, batch and random numbers, and compares loss and updated state "
            "bit for bit; a mismatch raises ReplayMismatchError naming the first kernel whose output "
            "differs from its reference (default 0: off; for when a replayed step's results are in doubt)",
        ),
        OptionSpec(
            "fill_uninitialized_memory", _bool, False, "TORCH_ADRENO_FILL_UNINITIALIZED_MEMORY",
            "fill every device buffer a compiled graph or a replayed step makes (arena slots, per-call "
            "blocks, donated bytes, the replay's arena) before its first write: 0x7FFF repeated, NaN as "
            "float32, float16 and bfloat16 and an out-of-range index as int32 and int64, so that a read "
            "of memory nothing wrote shows as NaN or an index error instead of stale or zero values "
            "(default False; results of a correct step are bit-identical either way)",
        ),
        OptionSpec(
            "replay_arena_kernels", _auto_bool, "auto", "TORCH_ADRENO_REPLAY_ARENA_KERNELS",
            "a replayed TrainingStep rebuilds its kernels to reach the step's memory and the persistent "
            "tensors at offsets of a few slabs, each one argument (fewer arguments per enqueue: "
            "faster steps on a desktop GPU), at the cost of a second build of every kernel when a batch "
            "geometry is captured; False binds them as compiled, to sub-buffers (results are "
            "bit-identical). 'auto', the default: rebuild on GPUs (and for a GPU target), bind as compiled "
            "on CPU devices, whose enqueues cost little per argument and whose compilers take seconds "
            "per build",
        ),
        OptionSpec(
            "replay_merge_copies", _bool, True, "TORCH_ADRENO_REPLAY_MERGE_COPIES",
            "a replayed TrainingStep does each run of copies between heap regions (batch norm's running "
            "statistics written back) with one kernel instead of one enqueue per copy (default True; "
            "needs replay_arena_kernels)",
        ),
        OptionSpec(
            "replay_command_buffers", _auto_bool, "auto", "TORCH_ADRENO_REPLAY_COMMAND_BUFFERS",
            "a replayed TrainingStep records its launch list once into the OpenCL driver and enqueues "
            "the recording with one call per step instead of one per launch ('auto', the default: where "
            "a GPU offers cl_khr_command_buffer; True: that on any device, that, else Qualcomm's cl_qcom_recordable_queues, "
            "written from Qualcomm's header and not run on a device yet, and an error where the device "
            "offers neither; False: launch by launch). A recording keeps kernel arguments as recorded, so "
            "a recorded step copies its batch into its own memory instead of binding it in place; results "
            "are bit-identical. Profiled steps (torch_adreno.profile()) enqueue launch by launch",
        ),
        OptionSpec(
            "replay_overlap", _bool, True, "TORCH_ADRENO_REPLAY_OVERLAP",
            "where a replayed TrainingStep copies its batch to the device (zero_copy off), it reads the "
            "loss as soon as the step has computed it and returns while the device runs the backward and "
            "the optimizer; the next step uploads its batch meanwhile, on a second queue into a second "
            "device buffer (default True; results are bit-identical; not under torch_adreno.profile()). "
            "An index out of range met after the loss (in the backward) is then raised by the next step "
            "or synchronize(); one met up to the loss, by its own step",
        ),
        OptionSpec(
            "heap_copies", _bool, True, "TORCH_ADRENO_HEAP_COPIES",
            "a TrainingStep's device copies of parameters and optimizer state are regions of a few large "
            "device buffers (slabs) that its replay addresses through one argument each (default True); "
            "False gives each its own buffer",
        ),
        OptionSpec(
            "fused_attention", _bool, True, "TORCH_ADRENO_FUSED_ATTENTION",
            "scaled_dot_product_attention runs as the fused attention kernels where they take it (default "
            "True); False decomposes every attention into matrix products and a softmax (the fusion gain "
            "benchmarks/attention.py measures)",
        ),
        OptionSpec(
            "frozen_casts", _bool, True, "TORCH_ADRENO_FROZEN_CASTS",
            "under autocast, cast each frozen tensor (a parameter that requires no grad, a buffer the "
            "graph does not update) to 16 bits once and keep the copy, made again only when the tensor "
            "changes, instead of casting it in every forward and backward (default True; False casts "
            "in the kernels that read it, as for trainable weights)",
        ),
        OptionSpec(
            "chunked_cross_entropy", _auto_bool_or_count, "auto", "TORCH_ADRENO_CHUNKED_CROSS_ENTROPY",
            "fuse a language-model head (linear or matmul, no bias) with the cross-entropy of its logits, "
            "computed in chunks of tokens in the forward and the backward, so that the tokens x vocabulary "
            "logits are never in memory ('auto', the default: where the float32 logits would take 32 MB or "
            "more; True: every such head, an error where one cannot be fused; a number: True with that "
            "many tokens per chunk; False: never)",
        ),
        OptionSpec(
            "target", _target, None, "TORCH_ADRENO_TARGET",
            "compile for an Adreno GPU's limits and preferences while running on the present device: "
            "a profile name such as 'adreno740' (`python -m torch_adreno devices` lists them) or an AdrenoTarget "
            "(`torch_adreno.targets.profiles.derive_target`); work-group "
            "sizes, local memory, GEMM tiles and the largest allocation obey both devices (default None: "
            "the present device only)",
        ),
    )
}


def unknown_options_message(unknown: list[str]) -> str:
    """The error for options the backend does not have: each with the nearest valid names, then
    every valid name (``python -m torch_adreno devices --options`` and the docs describe them)."""
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(str(name), list(OPTIONS), n=2, cutoff=0.6)
        parts.append(f"{name!r}" + (f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""))
    return (f"unknown adreno backend option(s) {', '.join(parts)}; valid options: {', '.join(map(repr, OPTIONS))} "
            "(each is described in the documentation's Options page and in torch_adreno.OPTIONS[name].doc)")


@dataclass(frozen=True)
class Config:
    """Validated backend options. Construct with :meth:`from_options`."""

    device: str | int | None = None
    fallback: str = "error"
    fusion: bool = True
    memory_reuse: bool = True
    zero_copy: str | bool = "auto"
    debug_dir: str | None = None
    activation_memory_budget: float = 1.0
    tune: bool = False
    images: str | bool = "auto"
    native_half: bool = False
    compile_cache: bool = True
    verify_memory: bool = False
    verify_replay: int = 0
    fill_uninitialized_memory: bool = False
    replay_arena_kernels: str | bool = "auto"
    replay_merge_copies: bool = True
    replay_command_buffers: str | bool = "auto"
    replay_overlap: bool = True
    heap_copies: bool = True
    fused_attention: bool = True
    frozen_casts: bool = True
    chunked_cross_entropy: str | bool | int = "auto"
    target: AdrenoTarget | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None = None,
                     environ: Mapping[str, str] | None = None) -> Config:
        options = dict(options or {})
        environ = os.environ if environ is None else environ
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise OptionError(unknown_options_message(unknown))
        values: dict[str, Any] = {}
        for spec in OPTIONS.values():
            if spec.name in options:
                raw, source = options[spec.name], f"option {spec.name!r}"
            elif spec.env and environ.get(spec.env, "") != "":
                raw, source = environ[spec.env], f"environment variable {spec.env}"
            else:
                values[spec.name] = spec.default
                continue
            try:
                values[spec.name] = spec.parse(raw)
            except ValueError as err:
                raise OptionError(f"{source}: {err}") from None
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """The base directory of every on-disk cache of torch_adreno: ``$TORCH_ADRENO_CACHE`` if set,
    else ``~/.cache/torch_adreno``. Each cache keeps its own file or subdirectory under it, so that
    one variable moves (or one ``rm -r`` clears) them all. The directory may not exist yet."""
    environ = os.environ if environ is None else environ
    override = environ.get("TORCH_ADRENO_CACHE", "")
    return Path(override) if override else Path.home() / ".cache" / "torch_adreno"
