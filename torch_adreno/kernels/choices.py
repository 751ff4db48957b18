"""The code choices made for one compile: which kernels a device gets, decided in one place.

:meth:`KernelChoices.for_device` derives every choice that depends on the device (and on the
options) once per compiled region; the stages that choose read them from the object they are
handed (fusion its :class:`~torch_adreno.fusion.split_k.SplitPolicy`, the kernels stage the rest)
instead of each asking the device profile, and the compile cache keys on the object
(:func:`torch_adreno.frontend.compile_cache.cache_salt`). To compile with other choices than the
device's (a test running the tiled GEMM template on a CPU, a benchmark without the 128-wide
tiles), hand the backend a function of the choices: ``adreno_backend(..., kernel_choices=f)``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch_adreno.config import Config
from torch_adreno.errors import OptionError
from torch_adreno.fusion.split_k import SplitPolicy
from torch_adreno.targets import DeviceProfile

#: Devices with at least this many compute units get the 128-wide GEMM tiles by default.
DESKTOP_COMPUTE_UNITS = 16
#: 128 x 128 tiles numbering fewer than this many per compute unit become 128 x 64
#: (:func:`torch_adreno.kernels.gemm.choose_tiling`).
HALF_FILLED_UNITS = 1.5
#: A reduction takes one work-group per output where each output folds at least this many
#: elements and the outputs number fewer than this many per compute unit.
WORKGROUP_REDUCTION_LENGTH = 128
WORKGROUP_REDUCTION_OUTPUTS_PER_UNIT = 256

#: The GEMM templates: ``gemm.cl`` (operand tiles in local memory) and ``gemm_direct.cl``.
GEMM_TEMPLATES = ("tiled", "direct")


def images_enabled(setting: str | bool, profile: DeviceProfile) -> bool:
    """Whether kernels read GEMM and convolution operands through images, for the ``images``
    option's ``setting`` on the device described by ``profile``."""
    if setting == "auto":
        return profile.images and profile.prefers_images
    if setting and not profile.images:
        raise OptionError(
            f"option 'images'=True, but the OpenCL device {profile.name!r} ({profile.platform}) has no image "
            "support (CL_DEVICE_IMAGE_SUPPORT is false); pass images='auto' or False, or pick another device")
    return bool(setting)


@dataclass(frozen=True)
class KernelChoices:
    """Every choice of kernel code the compiler makes for a device (frozen: made once per compile).

    - ``gemm_template``: ``"tiled"`` (local-memory tiles: GPUs) or ``"direct"`` (CPU devices,
      whose "local memory" is plain cache and whose barriers are emulated);
    - ``large_tiles``: GEMMs are multiplied in 128 x 128 tiles where their extents allow (a
      desktop-class GPU; only with the tiled template);
    - ``tile_fill_units``: the compute units the large tiles must still give a work-group each
      (the device's); ``half_filled_units``: fewer 128 x 128 tiles than this many per such unit
      become 128 x 64 (:func:`torch_adreno.kernels.gemm.choose_tiling`);
    - ``split``: how far the fusion stage splits long GEMMs and reductions;
    - ``workgroup_reduction_length`` / ``workgroup_reduction_outputs``: a reduction of at least
      that many elements per output into fewer than that many outputs takes a work-group per output;
    - ``images``: GEMM and convolution operands are read through images where their buffers allow;
    - ``native_half``: float16 pointwise kernels compute in ``half`` registers.
    """

    gemm_template: str
    large_tiles: bool
    tile_fill_units: int
    split: SplitPolicy
    workgroup_reduction_outputs: int
    half_filled_units: float = HALF_FILLED_UNITS
    workgroup_reduction_length: int = WORKGROUP_REDUCTION_LENGTH
    images: bool = False
    native_half: bool = False

    def __post_init__(self) -> None:
        if self.gemm_template not in GEMM_TEMPLATES:
            raise ValueError(f"gemm_template must be one of {GEMM_TEMPLATES}, got {self.gemm_template!r}")
        if self.large_tiles and self.gemm_template != "tiled":
            raise ValueError("large_tiles needs gemm_template='tiled' (the direct template has no tiles)")

    @classmethod
    def for_device(cls, profile: DeviceProfile, config: Config | None = None) -> KernelChoices:
        """The choices for ``profile``'s device (with a target, the profile narrowed to it) under
        ``config``'s options (default: every option's default)."""
        config = config if config is not None else Config()
        units = profile.compute_units
        tiled = profile.is_gpu
        large = tiled and units >= DESKTOP_COMPUTE_UNITS
        return cls(gemm_template="tiled" if tiled else "direct", large_tiles=large, tile_fill_units=units,
                   split=SplitPolicy(units, units if large else None),
                   workgroup_reduction_outputs=units * WORKGROUP_REDUCTION_OUTPUTS_PER_UNIT,
                   images=images_enabled(config.images, profile), native_half=config.native_half)

    @property
    def tiled(self) -> bool:
        return self.gemm_template == "tiled"

    def with_gemm_template(self, template: str, large_tiles: bool | None = None) -> KernelChoices:
        """These choices with GEMMs from ``template``; ``large_tiles`` None: as :meth:`for_device`
        decides them for ``tile_fill_units`` compute units. The split policy's fill rules follow the
        large tiles, as :meth:`for_device` makes them."""
        large = (template == "tiled" and self.tile_fill_units >= DESKTOP_COMPUTE_UNITS
                 if large_tiles is None else large_tiles)
        split = dataclasses.replace(self.split, fill_units=self.tile_fill_units if large else None)
        return dataclasses.replace(self, gemm_template=template, large_tiles=large, split=split)

    def cache_key(self) -> dict[str, object]:
        """Every choice, for the compile cache's key."""
        return dataclasses.asdict(self)
