/* The OpenCL 1.2 entry points the runtime calls, loaded from libOpenCL at run time (dlopen), so
 * that one binary runs with an ICD loader on Linux and with the vendor's library on Android,
 * where no ICD loader is installed and linking at build time would need the phone's library. */
#ifndef TORCH_ADRENO_STEP_OPENCL_API_H
#define TORCH_ADRENO_STEP_OPENCL_API_H

#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl_function_types.h>

#include "common.h"

#define OPENCL_LIBRARY_VARIABLE "TORCH_ADRENO_OPENCL_LIBRARY"

typedef struct opencl_api {
    void *library;
    char library_path[512];
    clGetPlatformIDs_fn GetPlatformIDs;
    clGetPlatformInfo_fn GetPlatformInfo;
    clGetDeviceIDs_fn GetDeviceIDs;
    clGetDeviceInfo_fn GetDeviceInfo;
    clCreateContext_fn CreateContext;
    clReleaseContext_fn ReleaseContext;
    clCreateCommandQueue_fn CreateCommandQueue;
    clReleaseCommandQueue_fn ReleaseCommandQueue;
    clCreateBuffer_fn CreateBuffer;
    clReleaseMemObject_fn ReleaseMemObject;
    clCreateProgramWithSource_fn CreateProgramWithSource;
    clCreateProgramWithBinary_fn CreateProgramWithBinary;
    clBuildProgram_fn BuildProgram;
    clGetProgramInfo_fn GetProgramInfo;
    clGetProgramBuildInfo_fn GetProgramBuildInfo;
    clReleaseProgram_fn ReleaseProgram;
    clCreateKernel_fn CreateKernel;
    clReleaseKernel_fn ReleaseKernel;
    clSetKernelArg_fn SetKernelArg;
    clEnqueueNDRangeKernel_fn EnqueueNDRangeKernel;
    clEnqueueCopyBuffer_fn EnqueueCopyBuffer;
    clEnqueueWriteBuffer_fn EnqueueWriteBuffer;
    clEnqueueReadBuffer_fn EnqueueReadBuffer;
    clEnqueueFillBuffer_fn EnqueueFillBuffer;
    clFinish_fn Finish;
    clFlush_fn Flush;
    clGetKernelWorkGroupInfo_fn GetKernelWorkGroupInfo;
    clGetEventProfilingInfo_fn GetEventProfilingInfo;
    clReleaseEvent_fn ReleaseEvent;
} opencl_api;

/* Loads the library: `path` if given, else $TORCH_ADRENO_OPENCL_LIBRARY, else the usual names on
 * Linux and Android in turn. On failure says which were tried and why. */
tas_status opencl_load(opencl_api *api, const char *path, error_record *error);
void opencl_unload(opencl_api *api);

/* "CL_OUT_OF_RESOURCES (-5)" for an OpenCL error code. */
const char *opencl_error_name(cl_int code, char *buffer, size_t size);

#endif
