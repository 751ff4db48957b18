#include "opencl_api.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Where libOpenCL is found: an ICD loader on Linux; the vendor's library on Android phones. */
static const char *const DEFAULT_LIBRARIES[] = {
    "libOpenCL.so",
    "libOpenCL.so.1",
    "/vendor/lib64/libOpenCL.so",
    "/system/vendor/lib64/libOpenCL.so",
    "/system/lib64/libOpenCL.so",
};

typedef struct entry_point {
    const char *name;
    size_t offset;
} entry_point;

#define ENTRY(field) {"cl" #field, offsetof(opencl_api, field)}
static const entry_point ENTRY_POINTS[] = {
    ENTRY(GetPlatformIDs),      ENTRY(GetPlatformInfo),         ENTRY(GetDeviceIDs),
    ENTRY(GetDeviceInfo),       ENTRY(CreateContext),           ENTRY(ReleaseContext),
    ENTRY(CreateCommandQueue),  ENTRY(ReleaseCommandQueue),     ENTRY(CreateBuffer),
    ENTRY(ReleaseMemObject),    ENTRY(CreateProgramWithSource), ENTRY(CreateProgramWithBinary),
    ENTRY(BuildProgram),        ENTRY(GetProgramInfo),          ENTRY(GetProgramBuildInfo),
    ENTRY(ReleaseProgram),      ENTRY(CreateKernel),            ENTRY(ReleaseKernel),
    ENTRY(SetKernelArg),        ENTRY(EnqueueNDRangeKernel),    ENTRY(EnqueueCopyBuffer),
    ENTRY(EnqueueWriteBuffer),  ENTRY(EnqueueReadBuffer),       ENTRY(EnqueueFillBuffer),
    ENTRY(Finish),              ENTRY(GetEventProfilingInfo),   ENTRY(ReleaseEvent),
    ENTRY(Flush),               ENTRY(GetKernelWorkGroupInfo),
};
#undef ENTRY

static tas_status resolve(opencl_api *api, error_record *error) {
    for (size_t i = 0; i < sizeof ENTRY_POINTS / sizeof ENTRY_POINTS[0]; i++) {
        void *symbol = dlsym(api->library, ENTRY_POINTS[i].name);
        if (symbol == NULL)
            return fail(error, TAS_ERROR_DEVICE,
                        "%s has no %s: it is not an OpenCL 1.2 library; point %s at the device's libOpenCL.so",
                        api->library_path, ENTRY_POINTS[i].name, OPENCL_LIBRARY_VARIABLE);
        /* (a data pointer to a function pointer: POSIX guarantees dlsym's result converts) */
        memcpy((char *)api + ENTRY_POINTS[i].offset, &symbol, sizeof symbol);
    }
    return TAS_OK;
}

tas_status opencl_load(opencl_api *api, const char *path, error_record *error) {
    memset(api, 0, sizeof *api);
    const char *chosen = path && *path ? path : getenv(OPENCL_LIBRARY_VARIABLE);
    if (chosen && *chosen) {
        api->library = dlopen(chosen, RTLD_NOW | RTLD_LOCAL);
        if (api->library == NULL) {
            const char *why = dlerror();
            return fail(error, TAS_ERROR_DEVICE,
                        "cannot load the OpenCL library %s: %s (where torch_adreno is installed with pip's OpenCL "
                        "runtimes, eval \"$(python -m torch_adreno native env)\" sets %s to its loader)", chosen,
                        why ? why : "unknown reason", OPENCL_LIBRARY_VARIABLE);
        }
        snprintf(api->library_path, sizeof api->library_path, "%s", chosen);
        return resolve(api, error);
    }
    char tried[1536] = "";
    size_t used = 0;
    for (size_t i = 0; i < sizeof DEFAULT_LIBRARIES / sizeof DEFAULT_LIBRARIES[0]; i++) {
        api->library = dlopen(DEFAULT_LIBRARIES[i], RTLD_NOW | RTLD_LOCAL);
        if (api->library != NULL) {
            snprintf(api->library_path, sizeof api->library_path, "%s", DEFAULT_LIBRARIES[i]);
            return resolve(api, error);
        }
        const char *why = dlerror();
        int written = snprintf(tried + used, sizeof tried - used, "%s%s (%s)", i ? "; " : "", DEFAULT_LIBRARIES[i],
                               why ? why : "not found");
        if (written > 0 && (size_t)written < sizeof tried - used) used += (size_t)written;
    }
    return fail(error, TAS_ERROR_DEVICE,
                "no OpenCL library found: tried %s. Where torch_adreno is installed with pip's OpenCL runtimes: "
                "eval \"$(python -m torch_adreno native env)\" (it sets %s and the runtimes). Else install an "
                "OpenCL driver and ICD loader (Linux), or set %s to the library's path (on Android: "
                "LD_LIBRARY_PATH=/vendor/lib64)", tried, OPENCL_LIBRARY_VARIABLE, OPENCL_LIBRARY_VARIABLE);
}

void opencl_unload(opencl_api *api) {
    /* Not dlclose: OpenCL drivers keep worker threads (and atexit handlers) that crash once their
     * code is unmapped; the library stays loaded, as every OpenCL program leaves it. */
    api->library = NULL;
}

const char *opencl_error_name(cl_int code, char *buffer, size_t size) {
    static const struct { cl_int code; const char *name; } NAMES[] = {
        {CL_DEVICE_NOT_FOUND, "CL_DEVICE_NOT_FOUND"},
        {CL_DEVICE_NOT_AVAILABLE, "CL_DEVICE_NOT_AVAILABLE"},
        {CL_COMPILER_NOT_AVAILABLE, "CL_COMPILER_NOT_AVAILABLE"},
        {CL_MEM_OBJECT_ALLOCATION_FAILURE, "CL_MEM_OBJECT_ALLOCATION_FAILURE"},
        {CL_OUT_OF_RESOURCES, "CL_OUT_OF_RESOURCES"},
        {CL_OUT_OF_HOST_MEMORY, "CL_OUT_OF_HOST_MEMORY"},
        {CL_BUILD_PROGRAM_FAILURE, "CL_BUILD_PROGRAM_FAILURE"},
        {CL_INVALID_VALUE, "CL_INVALID_VALUE"},
        {CL_INVALID_DEVICE, "CL_INVALID_DEVICE"},
        {CL_INVALID_BINARY, "CL_INVALID_BINARY"},
        {CL_INVALID_BUILD_OPTIONS, "CL_INVALID_BUILD_OPTIONS"},
        {CL_INVALID_PROGRAM_EXECUTABLE, "CL_INVALID_PROGRAM_EXECUTABLE"},
        {CL_INVALID_KERNEL_NAME, "CL_INVALID_KERNEL_NAME"},
        {CL_INVALID_ARG_INDEX, "CL_INVALID_ARG_INDEX"},
        {CL_INVALID_ARG_SIZE, "CL_INVALID_ARG_SIZE"},
        {CL_INVALID_KERNEL_ARGS, "CL_INVALID_KERNEL_ARGS"},
        {CL_INVALID_WORK_DIMENSION, "CL_INVALID_WORK_DIMENSION"},
        {CL_INVALID_WORK_GROUP_SIZE, "CL_INVALID_WORK_GROUP_SIZE"},
        {CL_INVALID_WORK_ITEM_SIZE, "CL_INVALID_WORK_ITEM_SIZE"},
        {CL_INVALID_GLOBAL_WORK_SIZE, "CL_INVALID_GLOBAL_WORK_SIZE"},
        {CL_INVALID_BUFFER_SIZE, "CL_INVALID_BUFFER_SIZE"},
        {CL_INVALID_MEM_OBJECT, "CL_INVALID_MEM_OBJECT"},
        {CL_INVALID_OPERATION, "CL_INVALID_OPERATION"},
        {-1001, "CL_PLATFORM_NOT_FOUND_KHR (no OpenCL platform)"},
    };
    const char *name = "an OpenCL error";
    for (size_t i = 0; i < sizeof NAMES / sizeof NAMES[0]; i++)
        if (NAMES[i].code == code) name = NAMES[i].name;
    snprintf(buffer, size, "%s (%d)", name, (int)code);
    return buffer;
}
