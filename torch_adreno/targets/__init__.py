"""What the compiler needs to know about an OpenCL device, as plain data.

The runtime reads these values from the driver; fusion, memory planning and code generation take
them as input so that none of those stages talks to OpenCL.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceProfile:
    """Capabilities and limits of one OpenCL device (see ``python -m torch_adreno devices``)."""

    name: str
    vendor: str
    driver: str
    platform: str
    opencl_version: str
    is_gpu: bool
    compute_units: int
    max_work_group_size: int
    max_work_item_sizes: tuple[int, ...]
    preferred_work_group_multiple: int
    local_mem_bytes: int
    global_mem_bytes: int
    max_alloc_bytes: int
    base_addr_align_bytes: int
    unified_memory: bool
    fp16: bool
    images: bool
    #: CL_DEVICE_MAX_PARAMETER_SIZE: bytes of one kernel's arguments (at least 1024 on a full-profile
    #: device), and the device's pointer width (CL_DEVICE_ADDRESS_BITS): they bound how many buffers
    #: one launch can take (multi-tensor grouping splits its launches to fit).
    max_parameter_bytes: int = 1024
    address_bits: int = 64
    #: Queue recording/replay in the driver: ``cl_qcom_recordable_queues`` (Qualcomm, which MNN uses)
    #: and ``cl_khr_command_buffer``. Reported only: a replayed TrainingStep enqueues its recorded
    #: launch list itself (:mod:`torch_adreno.replay.launch_list`), the one loop such a queue would replace.
    recordable_queues: bool = False
    command_buffers: bool = False
    #: 2D image limits in texels (CL_DEVICE_IMAGE2D_MAX_WIDTH/HEIGHT; 8192 is OpenCL 1.2's minimum
    #: for a device with images), and ``cl_khr_image2d_from_buffer``: an image may share a buffer's
    #: memory when its row pitch is a multiple of ``image_pitch_alignment`` texels and the buffer's
    #: address of ``image_base_address_alignment`` texels (CL_DEVICE_IMAGE_PITCH_ALIGNMENT and
    #: CL_DEVICE_IMAGE_BASE_ADDRESS_ALIGNMENT; 0 where the driver does not report them).
    image2d_max_width: int = 8192
    image2d_max_height: int = 8192
    image_from_buffer: bool = False
    image_pitch_alignment: int = 0
    image_base_address_alignment: int = 0
    #: Whether GEMM and convolution operands should be read through images (the texture cache) when
    #: the ``images`` option is "auto": Adreno GPUs (MNN, TVM and tinygrad's QCOM backend all read
    #: weights through image2d objects there).
    prefers_images: bool = False
    #: The Adreno target this profile was narrowed to (``torch_adreno.targets.profiles``), or "" for
    #: the present device as its driver reports it.
    target: str = ""

    @property
    def key(self) -> str:
        """Identifies device and driver, for caches of builds and tuning results."""
        return f"{self.platform}|{self.name}|{self.driver}"


#: A modest profile for stage tests that need no device (a small mobile-class GPU).
REFERENCE_PROFILE = DeviceProfile(
    name="reference", vendor="none", driver="0", platform="none", opencl_version="OpenCL 1.2",
    is_gpu=True, compute_units=4, max_work_group_size=256, max_work_item_sizes=(256, 256, 256),
    preferred_work_group_multiple=32, local_mem_bytes=32 * 1024, global_mem_bytes=1 << 30,
    max_alloc_bytes=256 << 20, base_addr_align_bytes=128, unified_memory=True, fp16=True, images=True,
)
