/* Building a kernel's program with its options, through an on-disk cache of program binaries
 * (clGetProgramInfo CL_PROGRAM_BINARIES, clCreateProgramWithBinary) keyed by the source, the
 * options, the platform, the device and its driver version: a phone compiles each program once. */
#ifndef TORCH_ADRENO_STEP_PROGRAM_CACHE_H
#define TORCH_ADRENO_STEP_PROGRAM_CACHE_H

#include "device.h"

typedef struct program_request {
    const char *kernel;   /* for messages */
    const char *source;
    const char *options;
} program_request;

typedef enum program_origin { PROGRAM_BUILT, PROGRAM_FROM_CACHE } program_origin;

/* Builds `request` for `device`: from the cache folder `cache_dir` when it holds this exact key
 * (NULL: no cache), else from source, then stores the binary there. A cached binary the driver
 * refuses (a corrupted file) is rebuilt from source and replaced. */
tas_status program_build(const opencl_api *api, cl_context context, const opencl_device *device,
                         const program_request *request, const char *cache_dir, cl_program *program,
                         program_origin *origin, error_record *error);

/* Creates `path` and its parents where missing. */
tas_status make_folders(const char *path, error_record *error);

#endif
