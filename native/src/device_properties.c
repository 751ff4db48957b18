/* tas_describe_device: a device's limits and features as torch_adreno's DeviceProfile holds them
 * (torch_adreno/runtime/device.py, profile_of), so that a desktop can plan kernels for a device it
 * reaches only through the step server. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"

/* OpenCL 2.0 / cl_khr_image2d_from_buffer queries the 1.2 headers do not name. */
#define DEVICE_IMAGE_PITCH_ALIGNMENT 0x104A
#define DEVICE_IMAGE_BASE_ADDRESS_ALIGNMENT 0x104B

static const char PROBE_SOURCE[] = "__kernel void probe(__global float* x) { x[get_global_id(0)] = 0.0f; }";

static void text_info(const opencl_api *api, cl_device_id id, cl_device_info what, char *out, size_t size) {
    char text[1024] = "";
    if (api->GetDeviceInfo(id, what, sizeof text - 1, text, NULL) != CL_SUCCESS) text[0] = '\0';
    text[sizeof text - 1] = '\0';
    const char *start = text;
    while (*start && isspace((unsigned char)*start)) start++;
    snprintf(out, size, "%s", start);
    size_t length = strlen(out);
    while (length && isspace((unsigned char)out[length - 1])) out[--length] = '\0';
}

/* A numeric query of `bytes` bytes; 0 when the driver does not answer (an optional query). */
static uint64_t number_info(const opencl_api *api, cl_device_id id, cl_device_info what, size_t bytes) {
    uint64_t value = 0; /* (little-endian: a narrower answer fills the low bytes) */
    if (bytes > sizeof value || api->GetDeviceInfo(id, what, bytes, &value, NULL) != CL_SUCCESS) return 0;
    return value;
}

/* Builds the probe kernel: its preferred work-group multiple, or why the driver cannot build. */
static void probe(const opencl_api *api, const opencl_device *device, tas_device_properties *out) {
    cl_int code = CL_SUCCESS;
    char name[96];
    const char *doing = "creating a context";
    cl_context context = api->CreateContext(NULL, 1, &device->id, NULL, NULL, &code);
    cl_program program = NULL;
    cl_kernel kernel = NULL;
    if (code == CL_SUCCESS) {
        const char *source = PROBE_SOURCE;
        doing = "creating a program";
        program = api->CreateProgramWithSource(context, 1, &source, NULL, &code);
    }
    if (code == CL_SUCCESS) {
        doing = "building a kernel";
        code = api->BuildProgram(program, 1, &device->id, "", NULL, NULL);
    }
    if (code == CL_SUCCESS) kernel = api->CreateKernel(program, "probe", &code);
    if (code == CL_SUCCESS) {
        size_t multiple = 0;
        code = api->GetKernelWorkGroupInfo(kernel, device->id, CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE,
                                           sizeof multiple, &multiple, NULL);
        out->preferred_work_group_multiple = code == CL_SUCCESS ? multiple : 0;
    }
    if (code != CL_SUCCESS)
        snprintf(out->unusable, sizeof out->unusable, "its OpenCL driver cannot build a kernel: %s failed: %s", doing,
                 opencl_error_name(code, name, sizeof name));
    if (kernel) api->ReleaseKernel(kernel);
    if (program) api->ReleaseProgram(program);
    if (context) api->ReleaseContext(context);
}

static void describe_all(const opencl_api *api, const opencl_device *device, tas_device_properties *out) {
    cl_device_id id = device->id;
    memset(out, 0, sizeof *out);
    out->index = device->index;
    snprintf(out->platform, sizeof out->platform, "%s", device->info.platform);
    snprintf(out->name, sizeof out->name, "%s", device->info.name);
    snprintf(out->version, sizeof out->version, "%s", device->info.version);
    snprintf(out->driver, sizeof out->driver, "%s", device->info.driver);
    text_info(api, id, CL_DEVICE_VENDOR, out->vendor, sizeof out->vendor);
    text_info(api, id, CL_DEVICE_OPENCL_C_VERSION, out->opencl_c_version, sizeof out->opencl_c_version);
    snprintf(out->extensions, sizeof out->extensions, "%s", device->extensions ? device->extensions : "");
    out->is_gpu = device->info.is_gpu;
    out->unified_memory = number_info(api, id, CL_DEVICE_HOST_UNIFIED_MEMORY, sizeof(cl_bool)) != 0;
    out->image_support = number_info(api, id, CL_DEVICE_IMAGE_SUPPORT, sizeof(cl_bool)) != 0;
    out->compute_units = (uint32_t)number_info(api, id, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof(cl_uint));
    out->max_clock_mhz = (uint32_t)number_info(api, id, CL_DEVICE_MAX_CLOCK_FREQUENCY, sizeof(cl_uint));
    out->address_bits = (uint32_t)number_info(api, id, CL_DEVICE_ADDRESS_BITS, sizeof(cl_uint));
    out->base_address_align_bits = (uint32_t)number_info(api, id, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof(cl_uint));
    out->max_work_group = device->info.max_work_group;
    for (int d = 0; d < 3; d++) out->max_work_item_sizes[d] = device->max_item_sizes[d];
    out->max_parameter_bytes = (size_t)number_info(api, id, CL_DEVICE_MAX_PARAMETER_SIZE, sizeof(size_t));
    out->local_memory = number_info(api, id, CL_DEVICE_LOCAL_MEM_SIZE, sizeof(cl_ulong));
    out->global_memory = device->info.global_memory;
    out->max_allocation = device->info.max_allocation;
    if (out->image_support) {
        out->image2d_max_width = (size_t)number_info(api, id, CL_DEVICE_IMAGE2D_MAX_WIDTH, sizeof(size_t));
        out->image2d_max_height = (size_t)number_info(api, id, CL_DEVICE_IMAGE2D_MAX_HEIGHT, sizeof(size_t));
        out->image_pitch_alignment = (uint32_t)number_info(api, id, DEVICE_IMAGE_PITCH_ALIGNMENT, sizeof(cl_uint));
        out->image_base_address_alignment =
            (uint32_t)number_info(api, id, DEVICE_IMAGE_BASE_ADDRESS_ALIGNMENT, sizeof(cl_uint));
    }
    probe(api, device, out);
}

tas_status tas_describe_device(const char *opencl_library, const char *device, tas_device_properties *properties,
                               char *message, size_t message_size) {
    error_record error = {TAS_OK, ""};
    opencl_api api;
    opencl_device chosen;
    memset(&chosen, 0, sizeof chosen);
    tas_status status = properties == NULL ? fail(&error, TAS_ERROR_ARGUMENT, "no place for the properties given")
                                           : opencl_load(&api, opencl_library, &error);
    int loaded = status == TAS_OK;
    if (status == TAS_OK) status = device_choose(&api, device, &chosen, &error);
    if (status == TAS_OK) describe_all(&api, &chosen, properties);
    device_free(&chosen);
    if (loaded) opencl_unload(&api);
    if (message != NULL && message_size) snprintf(message, message_size, "%s", error.message);
    return status;
}
