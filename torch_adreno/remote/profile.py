"""A remote device's properties (``RemoteDevice.properties()``) as the compiler's
:class:`~torch_adreno.targets.DeviceProfile`: the same fields the local runtime reads from its
driver (``torch_adreno.runtime.device.profile_of``), so that fusion, memory planning and code
generation plan kernels for the remote device's real limits."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch_adreno.targets import DeviceProfile


def _missing(properties: Mapping[str, Any], names: tuple[str, ...]) -> list[str]:
    return [name for name in names if name not in properties]


REQUIRED = ("name", "vendor", "driver", "platform", "opencl_version", "is_gpu", "compute_units",
            "max_work_group_size", "max_work_item_sizes", "preferred_work_group_multiple", "local_mem_bytes",
            "global_mem_bytes", "max_alloc_bytes", "base_addr_align_bits", "unified_memory", "fp16", "image_support",
            "max_parameter_bytes", "address_bits", "image2d_max_width", "image2d_max_height",
            "image_pitch_alignment", "image_base_address_alignment", "extensions")


def device_profile(properties: Mapping[str, Any]) -> DeviceProfile:
    """The DeviceProfile of a remote device from its properties: equal to the one the local runtime
    builds for the same device and driver (so caches keyed by :attr:`DeviceProfile.key`, which
    names platform, device and driver, are shared by both). Narrow it to an Adreno target with
    :func:`torch_adreno.targets.profiles.profile_for` as for a local device."""
    missing = _missing(properties, REQUIRED)
    if missing:
        raise ValueError(f"the remote device's properties lack {', '.join(missing)}: the server speaks another "
                         "protocol version? update torch-adreno-step on the device")
    if properties.get("unusable"):
        raise ValueError(f"the remote device {properties['name']} cannot build kernels: {properties['unusable']}")
    extensions = [str(e) for e in properties["extensions"]]
    images = bool(properties["image_support"])
    name, vendor = str(properties["name"]), str(properties["vendor"])
    return DeviceProfile(
        name=name,
        vendor=vendor,
        driver=str(properties["driver"]),
        platform=str(properties["platform"]),
        opencl_version=str(properties["opencl_version"]),
        is_gpu=bool(properties["is_gpu"]),
        compute_units=int(properties["compute_units"]),
        max_work_group_size=int(properties["max_work_group_size"]),
        max_work_item_sizes=tuple(int(s) for s in properties["max_work_item_sizes"]),
        preferred_work_group_multiple=int(properties["preferred_work_group_multiple"]),
        local_mem_bytes=int(properties["local_mem_bytes"]),
        global_mem_bytes=int(properties["global_mem_bytes"]),
        max_alloc_bytes=int(properties["max_alloc_bytes"]),
        # (profile_of's rule: CL_DEVICE_MEM_BASE_ADDR_ALIGN is in bits; at least 4 bytes)
        base_addr_align_bytes=max(int(properties["base_addr_align_bits"]) // 8, 4),
        unified_memory=bool(properties["unified_memory"]),
        fp16="cl_khr_fp16" in extensions,
        images=images,
        max_parameter_bytes=int(properties["max_parameter_bytes"]),
        recordable_queues="cl_qcom_recordable_queues" in extensions,
        command_buffers="cl_khr_command_buffer" in extensions,
        address_bits=int(properties["address_bits"]),
        image2d_max_width=int(properties["image2d_max_width"]) if images else 0,
        image2d_max_height=int(properties["image2d_max_height"]) if images else 0,
        image_from_buffer=images and "cl_khr_image2d_from_buffer" in extensions,
        image_pitch_alignment=int(properties["image_pitch_alignment"]) if images else 0,
        image_base_address_alignment=int(properties["image_base_address_alignment"]) if images else 0,
        prefers_images=images and ("adreno" in name.lower() or "qualcomm" in vendor.lower()),
    )
