"""Adreno target profiles: the limits, preferences and peaks of the phone GPUs we compile for.

No Adreno is reachable where this project is developed and tested, so a compile can *target* one
(``options={"target": "adreno740"}`` or ``TORCH_ADRENO_TARGET``) while running on the device at
hand: :func:`compile_profile` narrows the present device's :class:`DeviceProfile` to what both it
and the target accept, and takes the target's preferences (wave size, compute units for the
work-distribution heuristics, GPU code paths), so fusion, memory planning and code generation
produce kernels an Adreno would accept and that still run here. The peaks feed the projection of
step times onto the target's roofline (``python -m torch_adreno project``).

Every value carries its source in :attr:`AdrenoTarget.sources`: a public clinfo dump, a vendor
document or an article (URLs in :data:`SOURCES`), or ``"estimate: ..."`` with the reasoning. None
of these values was measured by this project: it has never run on an Adreno.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from torch_adreno.targets import DeviceProfile

#: Public documents the profiles cite, by short name.
SOURCES = {
    "clinfo-750": "https://github.com/Oblomov/clinfo/issues/92 (clinfo of an Adreno 750, driver E031.45.02.06)",
    "clinfo-750b": "https://github.com/galloty/genefer22/issues/12 (clinfo of an Adreno 750)",
    "clinfo-740": "https://github.com/CodeLinaro/llama.cpp/pull/17 (clinfo of QCS8550, Adreno 740)",
    "clinfo-6xx": "https://github.com/BOINC/boinc/issues/3613 (clinfo of an Adreno on an OpenCL 2.0 driver)",
    "clinfo-3.0": "https://github.com/ggml-org/whisper.cpp/issues/3708 (clinfo of an Adreno on an OpenCL 3.0 driver)",
    "large-buffer": "https://github.com/ggml-org/llama.cpp/pull/20997 (cl_qcom_large_buffer on A7x and A8x GPUs)",
    "alloc-cap": "https://github.com/a-ghorbani/pocketpal-ai/pull/699 (CL_DEVICE_MAX_MEM_ALLOC_SIZE 'typically ~1 GB' "
                 "on Adreno drivers, even on phones with 12-24 GB of RAM)",
    "qcom-guide": "Qualcomm Snapdragon Mobile Platform OpenCL General Programming and Optimization (80-NB295-11), "
                  "https://developer.qualcomm.com/download/adrenosdk/adreno-opencl-programming-guide.pdf: "
                  "waves of 64 or 128 fibers chosen by the compiler, 32 KB local memory per work-group",
    "clpeak-x1": "https://github.com/krrishnarraj/clpeak/issues/202 (Adreno X1-45: max work-group 1024, SIMD 128)",
    "primua-740": "https://primua.com/adreno-740/ (Adreno 740: 3.7 TFLOP/s fp32, 7.4 fp16, LPDDR5X 64 GB/s)",
    "wikipedia": "https://en.wikipedia.org/wiki/Adreno (ALU counts and clocks per model)",
    "public-benchmarks": "figures gathered from public benchmarks of these GPUs (no single URL)",
}


@dataclass(frozen=True)
class AdrenoTarget:
    """One Adreno GPU as a compile target. Limits are the driver's reported values
    (``CL_DEVICE_*``); ``peak_*`` and ``bandwidth_gbs`` are what the projection divides by."""

    name: str
    gpu: str
    soc: str
    generation: int
    opencl_version: str
    compute_units: int
    max_work_group_size: int
    max_work_item_sizes: tuple[int, int, int]
    local_mem_bytes: int
    max_alloc_bytes: int
    global_mem_bytes: int
    base_addr_align_bytes: int
    max_parameter_bytes: int
    image2d_max: tuple[int, int]
    image_from_buffer_max_pixels: int
    #: Wave (sub-group) sizes the compiler may choose; the first is the one fp32 code gets.
    wave_sizes: tuple[int, ...]
    extensions: tuple[str, ...]
    unified_memory: bool
    #: Whether GEMM and convolution operands should be read through image2d objects (the texture
    #: cache) where ``options={"images": "auto"}`` decides.
    prefers_images: bool
    peak_fp32_gflops: float
    peak_fp16_gflops: float
    bandwidth_gbs: float
    #: Whether the device is a GPU: the GPU code paths (local-memory GEMM tiles, GPU work-group
    #: shapes) are planned for it (False: a remote CPU device, planned as one).
    is_gpu: bool = True
    #: Per field name, where its value comes from (a :data:`SOURCES` key plus detail) or
    #: ``"estimate: <reasoning>"``.
    sources: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def preferred_work_group_multiple(self) -> int:
        return self.wave_sizes[0]

    @property
    def fp16(self) -> bool:
        return "cl_khr_fp16" in self.extensions

    def source_of(self, name: str) -> str:
        return self.sources[name]


_EXT_COMMON = ("cl_khr_fp16", "cl_khr_3d_image_writes", "cl_khr_image2d_from_buffer", "cl_khr_subgroups",
               "cl_qcom_recordable_queues", "cl_qcom_reqd_sub_group_size", "cl_qcom_subgroup_shuffle")
_EXT_7XX = (*_EXT_COMMON, "cl_qcom_large_buffer")

# Sources shared by every profile; a profile overrides those it has a better one for.
_COMMON_SOURCES = {
    "is_gpu": "qcom-guide (the Adreno is the Snapdragon's GPU)",
    "max_work_group_size": "clinfo-750 (1024); clpeak-x1 (1024 on Adreno X1); assumed the same on 6xx",
    "max_work_item_sizes": "clinfo-750 (1024x1024x1024); estimate for the others: same family driver",
    "local_mem_bytes": "qcom-guide and clinfo-6xx (32768 bytes)",
    "max_parameter_bytes": "clinfo-6xx ('Max size of kernel argument 1024')",
    "image2d_max": "clinfo-6xx ('Max 2D image size 16384x16384 pixels')",
    "image_from_buffer_max_pixels": "clinfo-6xx and clinfo-3.0 ('Max size for 1D images from buffer 134217728 pixels')",
    "base_addr_align_bytes": "estimate: 1024 bits (128 bytes), the OpenCL minimum for a 64-bit-long device",
    "unified_memory": "clinfo-750 ('Unified memory for Host and Device Yes'); every Snapdragon shares DRAM",
    "extensions": "clinfo-740 (cl_qcom_reqd_sub_group_size, cl_qcom_subgroup_shuffle, cl_qcom_large_buffer, "
                  "cl_khr_fp16); cl_qcom_recordable_queues: Qualcomm's SDK, used by MNN; "
                  "cl_khr_command_buffer absent (public-benchmarks)",
    "prefers_images": "public-benchmarks (MNN picks images by default on Adreno, buffers on Mali; TVM and tinygrad's "
                      "QCOM backend read weights through image2d); qcom-guide recommends images for read-only data",
    "wave_sizes": "qcom-guide (64 or 128 fibers per wave on A6x/A7x; fp16 reaches full rate at 128)",
    "opencl_version": "clinfo-750 ('OpenCL 3.0 Adreno(TM) 750'); clinfo-6xx (OpenCL 2.0 on 6xx drivers)",
    "compute_units": "estimate: shader processor count from wikipedia (CL_DEVICE_MAX_COMPUTE_UNITS not found "
                     "in a public dump for this model)",
    "global_mem_bytes": "estimate: a 6-8 GB phone's share for the GPU; clinfo-750 reports 5.4 GiB",
    "max_alloc_bytes": "clinfo-750 and clinfo-740 (1073741824 bytes); alloc-cap (~1 GB on most Adreno drivers); "
                       "cl_qcom_large_buffer lifts it (large-buffer), which this project does not use",
}


def _target(name: str, gpu: str, soc: str, generation: int, *, compute_units: int, fp32: float, bandwidth: float,
            sources: dict[str, str], max_alloc_mib: int = 1024, global_gib: float = 5.4,
            opencl: str = "OpenCL 3.0", waves: tuple[int, ...] = (64, 128),
            extensions: tuple[str, ...] = _EXT_7XX) -> AdrenoTarget:
    return AdrenoTarget(
        name=name, gpu=gpu, soc=soc, generation=generation, opencl_version=opencl, compute_units=compute_units,
        max_work_group_size=1024, max_work_item_sizes=(1024, 1024, 1024), local_mem_bytes=32 * 1024,
        max_alloc_bytes=max_alloc_mib << 20, global_mem_bytes=int(global_gib * 2**30), base_addr_align_bytes=128,
        max_parameter_bytes=1024, image2d_max=(16384, 16384), image_from_buffer_max_pixels=1 << 27,
        wave_sizes=waves, extensions=extensions, unified_memory=True, prefers_images=True, peak_fp32_gflops=fp32,
        peak_fp16_gflops=2 * fp32, bandwidth_gbs=bandwidth,
        sources={**_COMMON_SOURCES, "peak_fp16_gflops": "estimate: twice fp32 (packed half ALUs, qcom-guide)",
                 "gpu": "wikipedia", "soc": "wikipedia", "generation": "wikipedia", **sources},
    )


#: The profiles, by the name ``options={"target": ...}`` takes.
TARGETS: dict[str, AdrenoTarget] = {t.name: t for t in (
    _target("adreno640", "Adreno 640", "Snapdragon 855", 6, compute_units=2, fp32=899.0, bandwidth=30.0,
            opencl="OpenCL 2.0", extensions=_EXT_COMMON, max_alloc_mib=1024, global_gib=3.7, sources={
                "peak_fp32_gflops": "wikipedia (384 ALUs x 2 x 585 MHz = 899 GFLOP/s)",
                "bandwidth_gbs": "public-benchmarks (~30 GB/s measured); theoretical 34.1 GB/s (LPDDR4X-4266, 64-bit)",
                "max_alloc_bytes": "estimate: 1 GiB as on 7xx drivers; some older 6xx drivers report 256 MiB "
                                   "(public-benchmarks)",
                "extensions": "estimate: the 7xx list without cl_qcom_large_buffer (large-buffer: A7x/A8x only)",
                "global_mem_bytes": "estimate: share of a 6 GB phone"}),
    _target("adreno650", "Adreno 650", "Snapdragon 865", 6, compute_units=3, fp32=1202.0, bandwidth=40.0,
            opencl="OpenCL 2.0", extensions=_EXT_COMMON, global_gib=5.0, sources={
                "peak_fp32_gflops": "wikipedia (512 ALUs x 2 x 587 MHz = 1202 GFLOP/s)",
                "bandwidth_gbs": "estimate: ~90% of 44 GB/s theoretical (LPDDR5-5500, 64-bit)",
                "max_alloc_bytes": "estimate: 1 GiB as on 7xx drivers",
                "extensions": "estimate: the 7xx list without cl_qcom_large_buffer (large-buffer: A7x/A8x only)"}),
    _target("adreno660", "Adreno 660", "Snapdragon 888", 6, compute_units=3, fp32=1720.0, bandwidth=45.0,
            opencl="OpenCL 2.0", extensions=_EXT_COMMON, sources={
                "peak_fp32_gflops": "wikipedia (512 ALUs x 2 x 840 MHz = 1720 GFLOP/s)",
                "bandwidth_gbs": "estimate: ~88% of 51.2 GB/s theoretical (LPDDR5-6400, 64-bit)",
                "max_alloc_bytes": "estimate: 1 GiB as on 7xx drivers",
                "extensions": "estimate: the 7xx list without cl_qcom_large_buffer (large-buffer: A7x/A8x only)"}),
    _target("adreno730", "Adreno 730", "Snapdragon 8 Gen 1", 7, compute_units=4, fp32=2200.0, bandwidth=45.0,
            sources={
                "peak_fp32_gflops": "estimate: 768 ALUs x 2 x ~1.4 GHz-equivalent per wikipedia's 2.2 TFLOP/s "
                                    "class figure",
                "bandwidth_gbs": "estimate: ~88% of 51.2 GB/s theoretical (LPDDR5-6400, 64-bit)"}),
    _target("adreno740", "Adreno 740", "Snapdragon 8 Gen 2", 7, compute_units=6, fp32=3700.0, bandwidth=63.0,
            sources={
                "peak_fp32_gflops": "primua-740 (3.7 TFLOP/s fp32)",
                "peak_fp16_gflops": "primua-740 (7.4 TFLOP/s fp16)",
                "bandwidth_gbs": "public-benchmarks (~63 GB/s); primua-740: 64 GB/s theoretical (LPDDR5X-4200, 128-bit "
                                 "bus as stated there)",
                "max_alloc_bytes": "clinfo-740 (QCS8550 driver); large-buffer",
                "compute_units": "estimate: 6 shader processor slices (wikipedia lists 1536 ALUs)"}),
    _target("adreno750", "Adreno 750", "Snapdragon 8 Gen 3", 7, compute_units=6, fp32=3100.0, bandwidth=77.0,
            sources={
                "peak_fp32_gflops": "public-benchmarks (~3.1 TFLOP/s fp32)",
                "bandwidth_gbs": "public-benchmarks (~77 GB/s); theoretical 76.8 GB/s (LPDDR5X-4800, 64-bit)",
                "max_alloc_bytes": "clinfo-750 ('Max memory allocation 1073741824 (1024MiB)')",
                "global_mem_bytes": "clinfo-750 ('Global memory size 5814714368 (5.415GiB)')",
                "opencl_version": "clinfo-750 and clinfo-750b ('OpenCL 3.0 Adreno(TM) 750')",
                "compute_units": "estimate: 6 shader processor slices (wikipedia)"}),
    _target("adreno830", "Adreno 830", "Snapdragon 8 Elite", 8, compute_units=6, fp32=3400.0, bandwidth=80.0,
            waves=(64,), sources={
                "wave_sizes": "public-benchmarks (64 on 8xx); estimate: not confirmed by a public Qualcomm document",
                "peak_fp32_gflops": "estimate: ~10% above the Adreno 750 (wikipedia lists up to 4.6 TFLOP/s for "
                                    "the newest Adreno; no figure for the 830 found)",
                "bandwidth_gbs": "estimate: ~95% of 84.8 GB/s theoretical (LPDDR5X-5300, 64-bit)",
                "compute_units": "estimate: 3 slices of 2 shader processors (wikipedia)"}),
)}


def derive_target(base: str, name: str, source: str, **changes: Any) -> AdrenoTarget:
    """A profile like ``base``'s, named ``name``, with ``changes`` (field values: a phone whose driver
    reports ``max_alloc_bytes=256 << 20``, say), each changed field's source ``source``. Make it
    known to ``options={"target": name}`` with :func:`register_target`."""
    target = get_target(base)
    changeable = {f.name for f in dataclasses.fields(AdrenoTarget)} - {"name", "sources"}
    unknown = sorted(set(changes) - changeable)
    if unknown:
        raise ValueError(f"derive_target: {', '.join(unknown)} are not fields a derived profile may change")
    return dataclasses.replace(target, name=name, **changes,
                               sources={**target.sources, **dict.fromkeys(changes, source)})


def _three(sizes: Any) -> tuple[int, int, int]:
    padded = [*(int(s) for s in sizes), 1, 1, 1]
    return padded[0], padded[1], padded[2]


def target_of_device(name: str, device: DeviceProfile) -> AdrenoTarget:
    """A compile target named ``name`` with the limits ``device`` reports (a remote device's, from
    its driver through the step server): the compiler plans for it as for a named Adreno. Its
    performance figures are unknown (0: projections need a named profile)."""
    reported = "reported by the device's driver (the step server's device properties)"
    waves = (device.preferred_work_group_multiple,) if device.preferred_work_group_multiple else (1,)
    extensions = tuple(["cl_khr_fp16"] if device.fp16 else [])
    return AdrenoTarget(
        name=name, gpu=device.name, soc=device.vendor, generation=0, opencl_version=device.opencl_version,
        compute_units=device.compute_units, max_work_group_size=device.max_work_group_size,
        max_work_item_sizes=_three(device.max_work_item_sizes),
        local_mem_bytes=device.local_mem_bytes, max_alloc_bytes=device.max_alloc_bytes,
        global_mem_bytes=device.global_mem_bytes, base_addr_align_bytes=device.base_addr_align_bytes,
        max_parameter_bytes=device.max_parameter_bytes,
        image2d_max=(device.image2d_max_width, device.image2d_max_height),
        image_from_buffer_max_pixels=0, wave_sizes=waves, extensions=extensions,
        unified_memory=device.unified_memory, prefers_images=device.prefers_images,
        peak_fp32_gflops=0.0, peak_fp16_gflops=0.0, bandwidth_gbs=0.0, is_gpu=device.is_gpu,
        sources=dict.fromkeys(("is_gpu", "compute_units", "max_work_group_size", "max_work_item_sizes", "local_mem_bytes",
                               "max_alloc_bytes", "global_mem_bytes", "base_addr_align_bytes",
                               "max_parameter_bytes", "image2d_max", "wave_sizes", "extensions",
                               "unified_memory"), reported)
        | {"peak_fp32_gflops": "unknown (a remote device of no named profile)"},
    )


def register_target(target: AdrenoTarget) -> None:
    """Make ``target`` a valid ``options={"target": target.name}``; a name already taken by another
    profile is a ValueError."""
    known = TARGETS.get(target.name)
    if known is not None and known != target:
        raise ValueError(f"a target named {target.name!r} exists already; derive yours under another name")
    TARGETS[target.name] = target


def target_names() -> list[str]:
    return sorted(TARGETS)


def get_target(name: str) -> AdrenoTarget:
    """The profile named ``name``; a ValueError listing the valid names otherwise."""
    try:
        return TARGETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown Adreno target {name!r}; valid targets: {', '.join(target_names())}") from None


_ADRENO_NUMBER = re.compile(r"adreno\s*(?:\(tm\)\s*)?(\d{3})", re.IGNORECASE)


def match_device(*descriptions: str) -> AdrenoTarget | None:
    """The profile of a real device, from its name and version strings (``CL_DEVICE_NAME`` is
    ``QUALCOMM Adreno(TM) 750`` on recent drivers and plain ``QUALCOMM Adreno(TM)`` on older ones,
    whose ``CL_DEVICE_VERSION`` carries the number: ``OpenCL 2.0 Adreno(TM) 640``). None for a
    non-Adreno device or an Adreno without a profile here."""
    for text in descriptions:
        found = _ADRENO_NUMBER.search(text or "")
        if found:
            return TARGETS.get(f"adreno{found.group(1)}")
    return None


def compile_profile(device: DeviceProfile, target: AdrenoTarget | None) -> DeviceProfile:
    """What the compiler plans with when compiling for ``target`` on ``device``.

    Limits are the tighter of the two (a kernel must launch on both: here to be checked against
    eager, there to be used); preferences are the target's (its wave size as the work-group multiple,
    its compute units for how work is spread, the GPU code paths such as local-memory GEMM tiles).
    Runtime facts that only the present device decides (its name and driver for caches, unified
    memory for zero-copy) stay the device's; so does the compute-unit count when ``device`` is the
    target's GPU itself. ``target=None`` returns ``device`` unchanged.
    """
    if target is None:
        return device
    # On the target GPU itself the driver's compute-unit count beats the profile's estimate.
    on_target = match_device(device.name, device.opencl_version) is target
    return dataclasses.replace(
        device,
        is_gpu=target.is_gpu,
        compute_units=device.compute_units if on_target else target.compute_units,
        max_work_group_size=min(device.max_work_group_size, target.max_work_group_size),
        max_work_item_sizes=tuple(min(a, b) for a, b in zip(device.max_work_item_sizes, target.max_work_item_sizes,
                                                             strict=False)),
        preferred_work_group_multiple=target.preferred_work_group_multiple,
        local_mem_bytes=min(device.local_mem_bytes, target.local_mem_bytes),
        global_mem_bytes=min(device.global_mem_bytes, target.global_mem_bytes),
        max_alloc_bytes=min(device.max_alloc_bytes, target.max_alloc_bytes),
        base_addr_align_bytes=max(device.base_addr_align_bytes, target.base_addr_align_bytes),
        max_parameter_bytes=min(device.max_parameter_bytes, target.max_parameter_bytes),
        address_bits=max(device.address_bits, 64),
        fp16=device.fp16 and target.fp16,
        images=device.images,
        # Image sizes within both; sharing a buffer's memory stays the present device's decision.
        image2d_max_width=min(device.image2d_max_width, target.image2d_max[0]),
        image2d_max_height=min(device.image2d_max_height, target.image2d_max[1]),
        prefers_images=target.prefers_images,
        target=target.name,
    )


def profile_for(device: DeviceProfile, target: AdrenoTarget | None) -> DeviceProfile:
    """:func:`compile_profile` for ``Config.target`` (None: the device itself)."""
    return compile_profile(device, target)
