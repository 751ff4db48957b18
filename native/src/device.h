/* OpenCL devices: listing them, choosing one as torch_adreno's Python runner does (by index, by a
 * name substring, else TORCH_ADRENO_DEVICE, else the first GPU, else the first device), and
 * refusing one that lacks what a step's kernels need. */
#ifndef TORCH_ADRENO_STEP_DEVICE_H
#define TORCH_ADRENO_STEP_DEVICE_H

#include "opencl_api.h"
#include "step_plan.h"

#define DEVICE_VARIABLE "TORCH_ADRENO_DEVICE"

typedef struct opencl_device {
    cl_platform_id platform;
    cl_device_id id;
    tas_device_info info;
    char label[280];             /* "platform: device", as torch_adreno names devices */
    size_t max_item_sizes[3];
    cl_uint item_dimensions;
    char *extensions;            /* space-separated; owned */
    size_t index;                /* among all devices (device_list's order) */
} opencl_device;

/* Every device of every platform, in the order device indices count them. */
tas_status device_list(const opencl_api *api, opencl_device **devices, size_t *count, error_record *error);
void device_list_free(opencl_device *devices, size_t count);

/* The device `spec` names (NULL or "": the default rule). Moves its entry into *chosen. */
tas_status device_choose(const opencl_api *api, const char *spec, opencl_device *chosen, error_record *error);
void device_free(opencl_device *device);

/* Refuses a device lacking a work-group size, an allocation size or an extension the step needs,
 * naming every problem. `largest_state` adds the state's buffers to the plan's. */
tas_status device_check(const opencl_device *device, const step_plan *plan, uint64_t largest_state,
                        error_record *error);

#endif
