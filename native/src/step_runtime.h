/* The tas_step handle: a step file bound to one OpenCL device (step_open.c builds it, step_run.c
 * runs it, step_state.c reads and writes its state). */
#ifndef TORCH_ADRENO_STEP_RUNTIME_H
#define TORCH_ADRENO_STEP_RUNTIME_H

#include "device.h"
#include "onnx_reader.h"
#include "program_cache.h"
#include "step_plan.h"

/* A state tensor: a graph input with an initial value, updated in place by the kernels. */
typedef struct state_tensor {
    const char *name; /* into the plan */
    int64_t identity;
    tas_dtype dtype;
    int rank;
    int64_t shape[TAS_MAX_RANK];
    size_t bytes;
} state_tensor;

/* One memory identity's buffer: a slot of the plan (shared) or a buffer of its own. */
typedef struct identity_buffer {
    cl_mem buffer;
    size_t bytes;
} identity_buffer;

typedef struct operation_time {
    double milliseconds;
    size_t runs;
} operation_time;

struct tas_step {
    error_record error;
    char *origin;
    opencl_api api;
    onnx_model model;
    step_plan plan;
    opencl_device device;
    cl_context context;
    cl_command_queue queue;
    cl_mem *slot_buffers;
    size_t slot_buffer_count;
    identity_buffer *buffers;      /* by memory identity (plan.identity_range of them) */
    cl_mem *owned_buffers;         /* state and batch buffers, released at close */
    size_t owned_count;
    cl_mem index_record;           /* 4 x int32: the first out-of-range index a kernel met */
    int32_t index_values[4];       /* the record as the last step read it (in the loss's wait) */
    tas_step_phases phases;        /* of the last run */
    state_tensor *state;
    size_t state_count;
    cl_program *programs;
    size_t program_count;
    cl_kernel *kernels;            /* by operation; NULL for copies */
    const char **checking_launches; /* the kernels with index checks, by token - 1 */
    size_t checking_count;
    size_t training_operations;    /* the first operations; the prediction's follow */
    int profile;
    size_t *fills_before;          /* with filling on: operation i's fills are plan.fills[fills_before[i] ..
                                    * fills_before[i + 1]); NULL with it off */
    operation_time *times;         /* by operation, with profile */
    size_t programs_built, programs_cached;
    uint64_t device_bytes;
    /* step_record.c: the training step recorded in the driver (NULL: enqueued operation by operation) */
    struct step_recording *recording;
    int recording_decided;         /* whether the step was recorded (or found not recordable) */
    int recording_disabled;        /* tas_step_set_recording(step, 0) */
    char recording_path[512];      /* how a run enqueues the step, once decided */
    char recording_text[512];      /* what tas_step_enqueue_path returned last */
};

/* step_run.c: a failed OpenCL call as a TAS_ERROR_OPENCL naming what was being done. */
tas_status opencl_failure(tas_step *step, cl_int code, const char *doing, const char *what);

/* step_record.c: records the training step into the driver on first use where it can (see there);
 * step_recording_ready says whether runs enqueue the recording, which step_recording_enqueue does
 * (`enqueue_range` enqueues operations [first, last) that a recordable queue does not record). */
tas_status step_recording_prepare(tas_step *step);
int step_recording_ready(const tas_step *step);
tas_status step_recording_enqueue(tas_step *step, tas_status (*enqueue_range)(tas_step *, size_t, size_t));
void step_recording_release(tas_step *step);

#endif
