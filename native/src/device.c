#include "device.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void trimmed_copy(char *out, size_t size, const char *text) {
    while (*text && isspace((unsigned char)*text)) text++;
    snprintf(out, size, "%s", text);
    size_t length = strlen(out);
    while (length && isspace((unsigned char)out[length - 1])) out[--length] = '\0';
}

static tas_status describe(const opencl_api *api, cl_platform_id platform, cl_device_id id, opencl_device *device,
                           error_record *error) {
    memset(device, 0, sizeof *device);
    device->platform = platform;
    device->id = id;
    char text[1024];
    cl_device_type type = 0;
    cl_ulong global = 0, allocation = 0;
    size_t extensions_size = 0;
    cl_int code = api->GetPlatformInfo(platform, CL_PLATFORM_NAME, sizeof text, text, NULL);
    if (code == CL_SUCCESS) trimmed_copy(device->info.platform, sizeof device->info.platform, text);
    if (code == CL_SUCCESS) code = api->GetDeviceInfo(id, CL_DEVICE_NAME, sizeof text, text, NULL);
    if (code == CL_SUCCESS) trimmed_copy(device->info.name, sizeof device->info.name, text);
    if (code == CL_SUCCESS) code = api->GetDeviceInfo(id, CL_DEVICE_VERSION, sizeof text, text, NULL);
    if (code == CL_SUCCESS) trimmed_copy(device->info.version, sizeof device->info.version, text);
    if (code == CL_SUCCESS) code = api->GetDeviceInfo(id, CL_DRIVER_VERSION, sizeof text, text, NULL);
    if (code == CL_SUCCESS) trimmed_copy(device->info.driver, sizeof device->info.driver, text);
    if (code == CL_SUCCESS) code = api->GetDeviceInfo(id, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    if (code == CL_SUCCESS) code = api->GetDeviceInfo(id, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof global, &global, NULL);
    if (code == CL_SUCCESS) code = api->GetDeviceInfo(id, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof allocation, &allocation, NULL);
    if (code == CL_SUCCESS)
        code = api->GetDeviceInfo(id, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof device->info.max_work_group,
                                  &device->info.max_work_group, NULL);
    if (code == CL_SUCCESS)
        code = api->GetDeviceInfo(id, CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS, sizeof device->item_dimensions,
                                  &device->item_dimensions, NULL);
    if (code == CL_SUCCESS) {
        size_t sizes[16] = {0};
        code = api->GetDeviceInfo(id, CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof sizes, sizes, NULL);
        for (int d = 0; d < 3; d++) device->max_item_sizes[d] = d < (int)device->item_dimensions ? sizes[d] : 1;
    }
    if (code == CL_SUCCESS) code = api->GetDeviceInfo(id, CL_DEVICE_EXTENSIONS, 0, NULL, &extensions_size);
    if (code == CL_SUCCESS) {
        device->extensions = calloc(extensions_size + 1, 1);
        if (device->extensions == NULL) return fail(error, TAS_ERROR_MEMORY, "out of memory");
        code = api->GetDeviceInfo(id, CL_DEVICE_EXTENSIONS, extensions_size, device->extensions, NULL);
    }
    if (code != CL_SUCCESS) {
        char name[96];
        return fail(error, TAS_ERROR_DEVICE, "querying an OpenCL device failed: %s",
                    opencl_error_name(code, name, sizeof name));
    }
    device->info.is_gpu = (type & CL_DEVICE_TYPE_GPU) != 0;
    device->info.global_memory = global;
    device->info.max_allocation = allocation;
    snprintf(device->label, sizeof device->label, "%s: %s", device->info.platform, device->info.name);
    return TAS_OK;
}

void device_free(opencl_device *device) {
    free(device->extensions);
    device->extensions = NULL;
}

void device_list_free(opencl_device *devices, size_t count) {
    for (size_t i = 0; i < count; i++) device_free(&devices[i]);
    free(devices);
}

tas_status device_list(const opencl_api *api, opencl_device **devices, size_t *count, error_record *error) {
    *devices = NULL;
    *count = 0;
    cl_uint platform_count = 0;
    cl_int code = api->GetPlatformIDs(0, NULL, &platform_count);
    if (code == -1001 || (code == CL_SUCCESS && platform_count == 0)) /* CL_PLATFORM_NOT_FOUND_KHR */
        return fail(error, TAS_ERROR_DEVICE,
                    "no OpenCL platform found by %s: install a driver (or PoCL for the CPU) and register it with the "
                    "ICD loader (OCL_ICD_VENDORS, /etc/OpenCL/vendors)", api->library_path);
    char name[96];
    if (code != CL_SUCCESS)
        return fail(error, TAS_ERROR_DEVICE, "listing OpenCL platforms failed: %s", opencl_error_name(code, name, sizeof name));
    cl_platform_id platforms[64];
    if (platform_count > 64) platform_count = 64;
    code = api->GetPlatformIDs(platform_count, platforms, NULL);
    if (code != CL_SUCCESS)
        return fail(error, TAS_ERROR_DEVICE, "listing OpenCL platforms failed: %s", opencl_error_name(code, name, sizeof name));
    size_t capacity = 0;
    for (cl_uint p = 0; p < platform_count; p++) {
        cl_uint device_count = 0;
        cl_device_id ids[64];
        if (api->GetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, 64, ids, &device_count) != CL_SUCCESS) continue;
        if (device_count > 64) device_count = 64;
        for (cl_uint d = 0; d < device_count; d++) {
            opencl_device device;
            tas_status status = describe(api, platforms[p], ids[d], &device, error);
            device.index = *count;
            if (status == TAS_OK && !append_item((void **)devices, count, &capacity, &device, sizeof device))
                status = fail(error, TAS_ERROR_MEMORY, "out of memory");
            if (status != TAS_OK) {
                device_free(&device);
                device_list_free(*devices, *count);
                *devices = NULL;
                *count = 0;
                return status;
            }
        }
    }
    if (*count == 0) return fail(error, TAS_ERROR_DEVICE, "no OpenCL device found (install a driver, or PoCL for the CPU)");
    return TAS_OK;
}

static int contains_ignoring_case(const char *text, const char *wanted) {
    size_t n = strlen(wanted);
    for (; *text; text++) {
        size_t i = 0;
        while (i < n && text[i] && tolower((unsigned char)text[i]) == tolower((unsigned char)wanted[i])) i++;
        if (i == n) return 1;
    }
    return n == 0;
}

static int all_digits(const char *text) {
    if (!*text) return 0;
    for (; *text; text++)
        if (!isdigit((unsigned char)*text)) return 0;
    return 1;
}

static size_t pick(const opencl_device *devices, size_t count, const char *spec, error_record *error) {
    if (spec == NULL) {
        for (size_t i = 0; i < count; i++)
            if (devices[i].info.is_gpu) return i;
        return 0;
    }
    if (all_digits(spec)) {
        size_t index = strlen(spec) > 6 ? count : (size_t)atol(spec);
        if (index >= count)
            fail(error, TAS_ERROR_DEVICE, "device index %s: there are %zu OpenCL devices (`torch-adreno-step devices` "
                 "lists them)", spec, count);
        return index;
    }
    char wanted[256];
    trimmed_copy(wanted, sizeof wanted, spec);
    for (size_t i = 0; i < count; i++) {
        char spaced[300];
        snprintf(spaced, sizeof spaced, "%s %s", devices[i].info.platform, devices[i].info.name);
        if (contains_ignoring_case(devices[i].label, wanted) || contains_ignoring_case(spaced, wanted)) return i;
    }
    char names[1024] = "";
    for (size_t i = 0; i < count; i++) {
        size_t used = strlen(names);
        snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "", devices[i].info.name);
    }
    fail(error, TAS_ERROR_DEVICE, "no OpenCL device named like '%s'; devices: %s", spec, names);
    return count;
}

tas_status device_choose(const opencl_api *api, const char *spec, opencl_device *chosen, error_record *error) {
    memset(chosen, 0, sizeof *chosen);
    if (spec == NULL || !*spec) {
        const char *variable = getenv(DEVICE_VARIABLE);
        spec = variable;
        while (spec && isspace((unsigned char)*spec)) spec++;
        if (spec && !*spec) spec = NULL;
    }
    opencl_device *devices;
    size_t count;
    tas_status status = device_list(api, &devices, &count, error);
    if (status != TAS_OK) return status;
    size_t index = pick(devices, count, spec, error);
    if (index >= count) {
        device_list_free(devices, count);
        return TAS_ERROR_DEVICE;
    }
    *chosen = devices[index];
    devices[index].extensions = NULL; /* moved */
    device_list_free(devices, count);
    return TAS_OK;
}

static int has_extension(const char *extensions, const char *wanted) {
    size_t n = strlen(wanted);
    for (const char *at = extensions; (at = strstr(at, wanted)) != NULL; at += n)
        if ((at == extensions || at[-1] == ' ') && (at[n] == ' ' || at[n] == '\0')) return 1;
    return 0;
}

/* Adds "; problem" unless the same text is there already (as the Python runner's dict.fromkeys). */
static void add_problem(char *problems, size_t size, const char *problem) {
    if (strstr(problems, problem) != NULL) return;
    size_t used = strlen(problems);
    snprintf(problems + used, size - used, "%s%s", used ? "; " : "", problem);
}

tas_status device_check(const opencl_device *device, const step_plan *plan, uint64_t largest_state,
                        error_record *error) {
    char problems[1800] = "";
    char problem[512];
    for (size_t i = 0; i < plan->operation_count; i++) {
        const step_operation *operation = &plan->operations[i];
        if (operation->is_copy) continue;
        const launch_operation *launch = &operation->launch;
        size_t items = 1;
        for (unsigned d = 0; d < launch->dimensions; d++) items *= launch->local_size[d];
        if (items > device->info.max_work_group) {
            snprintf(problem, sizeof problem, "kernel %s needs work-groups of %zu items (device: at most %zu)",
                     launch->kernel_name, items, device->info.max_work_group);
            add_problem(problems, sizeof problems, problem);
        }
        for (unsigned d = 0; d < launch->dimensions; d++)
            if (launch->local_size[d] > device->max_item_sizes[d]) {
                snprintf(problem, sizeof problem, "kernel %s needs %zu work-items in dimension %u (device: %zu)",
                         launch->kernel_name, launch->local_size[d], d, device->max_item_sizes[d]);
                add_problem(problems, sizeof problems, problem);
            }
        for (size_t e = 0; e < launch->extension_count; e++)
            if (*launch->extensions[e] && !has_extension(device->extensions, launch->extensions[e])) {
                snprintf(problem, sizeof problem, "kernel %s needs the OpenCL extension %s", launch->kernel_name,
                         launch->extensions[e]);
                add_problem(problems, sizeof problems, problem);
            }
    }
    uint64_t largest = largest_state;
    for (size_t i = 0; i < plan->slot_count; i++)
        if (plan->slots[i] > largest) largest = plan->slots[i];
    for (size_t i = 0; i < plan->identity_count; i++)
        if (plan->identities[i].nbytes > largest) largest = plan->identities[i].nbytes;
    if (largest > device->info.max_allocation) {
        snprintf(problem, sizeof problem, "a buffer of %llu bytes (device allocations: at most %llu)",
                 (unsigned long long)largest, (unsigned long long)device->info.max_allocation);
        add_problem(problems, sizeof problems, problem);
    }
    if (*problems) return fail(error, TAS_ERROR_DEVICE, "device %s cannot run this step: %s", device->info.name, problems);
    return TAS_OK;
}
