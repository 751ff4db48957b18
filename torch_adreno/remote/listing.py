"""``python -m torch_adreno devices`` with ``TORCH_ADRENO_DEVICE=remote:HOST:PORT``: the remote device
and the limits compilation plans for (its properties as a DeviceProfile)."""

from __future__ import annotations

from torch_adreno.remote.client import RemoteDevice, RemoteError
from torch_adreno.remote.profile import device_profile


def print_remote_device(spec: str) -> int:
    """Print the remote device ``spec`` names with its capabilities; 1 (with the reason) when it
    cannot be reached or described, else 0."""
    try:
        with RemoteDevice.from_spec(spec) as device:
            properties = device.properties()
            server = device.hello.get("server", "?")
        p = device_profile(properties)
    except (RemoteError, ValueError) as error:
        print(f"Remote device {spec}: {error}")
        return 1
    print(f"R {spec}: {p.platform}: {p.name} (served by {server}; TORCH_ADRENO_DEVICE selects it)")
    print(f"      {p.opencl_version}, {properties['opencl_c_version']}, driver {p.driver}, "
          f"{'GPU' if p.is_gpu else 'CPU'}, {p.compute_units} compute units")
    print(f"      work-group <= {p.max_work_group_size} (preferred multiple {p.preferred_work_group_multiple}), "
          f"local memory {p.local_mem_bytes // 1024} KiB")
    print(f"      global memory {p.global_mem_bytes / 2**30:.1f} GiB, largest allocation "
          f"{p.max_alloc_bytes / 2**20:.0f} MiB, base alignment {p.base_addr_align_bytes} B")
    print(f"      fp16 {'yes' if p.fp16 else 'no'}, images {'yes' if p.images else 'no'}, "
          f"unified memory {'yes' if p.unified_memory else 'no'}, {len(properties['extensions'])} extensions")
    return 0
