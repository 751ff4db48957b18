/* The training step recorded once into the OpenCL driver and enqueued with one call per step, as
 * torch_adreno's replayed TrainingStep does (torch_adreno/replay/driver_recording.py, whose
 * launch_list.c makes the same calls):
 *
 * - cl_khr_command_buffer (Khronos; the signatures of OpenCL-Headers' cl_ext.h): the launches,
 *   copies and fills recorded into one command buffer, each kernel's arguments as set when
 *   recorded (all are bound once, at open; the batch is uploaded into the step's own buffers), run
 *   by clEnqueueCommandBufferKHR in order with the queue's other commands. From version 0.9.5 on,
 *   every recording call takes a properties list after the queue; before it only the launch did.
 * - cl_qcom_recordable_queues (Qualcomm; the declarations of its published cl_ext_qcom.h; NOT RUN
 *   on a device: none was available): runs of launches enqueued on a CL_QUEUE_RECORDABLE_QCOM queue
 *   between clNewRecordingQCOM and clEndRecordingQCOM, at most CL_DEVICE_RECORDABLE_QUEUE_MAX_SIZE
 *   each, run by clEnqueueRecordingQCOM; copies and fills (not documented as recordable) are
 *   enqueued between them. Used only when TORCH_ADRENO_REPLAY_COMMAND_BUFFERS=1 asks for it.
 *
 * TORCH_ADRENO_REPLAY_COMMAND_BUFFERS (the Python option's variable): unset or "auto", a command
 * buffer where the device offers one; 1/true/yes/on, that, else a recordable queue, else an error;
 * 0/false/no/off, operation by operation. A step opened with profiling always enqueues operation by
 * operation (each operation is timed), and so does the prediction. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "step_runtime.h"

#define RECORDING_VARIABLE "TORCH_ADRENO_REPLAY_COMMAND_BUFFERS"

/* OpenCL 3.0's CL_DEVICE_EXTENSIONS_WITH_VERSION and cl_name_version (cl.h, beyond the 1.2 the
 * runtime builds against). */
#define DEVICE_EXTENSIONS_WITH_VERSION 0x1060
typedef struct name_version {
    cl_uint version;
    char name[64];
} name_version;
/* cl_khr_command_buffer */
#define DEVICE_COMMAND_BUFFER_CAPABILITIES 0x12A9
#define DEVICE_COMMAND_BUFFER_REQUIRED_QUEUE_PROPERTIES 0x12AA
#define COMMAND_BUFFER_FLAGS 0x1293
#define COMMAND_BUFFER_CAPABILITY_SIMULTANEOUS_USE (1 << 2)
#define COMMAND_BUFFER_SIMULTANEOUS_USE (1 << 0)
/* cl_qcom_recordable_queues */
#define DEVICE_RECORDABLE_QUEUE_MAX_SIZE 0x41DE
#define QUEUE_RECORDABLE ((cl_command_queue_properties)1 << 30)

#define VERSION(major, minor, patch) (((cl_uint)(major) << 22) | ((cl_uint)(minor) << 12) | (cl_uint)(patch))

typedef void *(*create_command_buffer_fn)(cl_uint, const cl_command_queue *, const cl_ulong *, cl_int *);
typedef cl_int (*command_buffer_fn)(void *);
typedef cl_int (*enqueue_command_buffer_fn)(cl_uint, cl_command_queue *, void *, cl_uint, const cl_event *, cl_event *);
typedef cl_int (*command_nd_range_kernel_fn)(void *, cl_command_queue, const cl_ulong *, cl_kernel, cl_uint,
                                             const size_t *, const size_t *, const size_t *, cl_uint, const cl_uint *,
                                             cl_uint *, void *);
typedef cl_int (*command_copy_buffer_fn)(void *, cl_command_queue, const cl_ulong *, cl_mem, cl_mem, size_t, size_t,
                                         size_t, cl_uint, const cl_uint *, cl_uint *, void *);
typedef cl_int (*command_copy_buffer_094_fn)(void *, cl_command_queue, cl_mem, cl_mem, size_t, size_t, size_t, cl_uint,
                                             const cl_uint *, cl_uint *, void *);
typedef cl_int (*command_fill_buffer_fn)(void *, cl_command_queue, const cl_ulong *, cl_mem, const void *, size_t,
                                         size_t, size_t, cl_uint, const cl_uint *, cl_uint *, void *);
typedef cl_int (*command_fill_buffer_094_fn)(void *, cl_command_queue, cl_mem, const void *, size_t, size_t, size_t,
                                             cl_uint, const cl_uint *, cl_uint *, void *);
typedef void *(*new_recording_fn)(cl_command_queue, cl_int *);
typedef cl_int (*recording_fn)(void *);
typedef cl_int (*enqueue_recording_fn)(cl_command_queue, void *, size_t, const void *, size_t, const void *, size_t,
                                       const void *, size_t, const void *, cl_uint, const cl_event *, cl_event *);
typedef void *(*extension_address_fn)(cl_platform_id, const char *);

struct step_recording {
    int kind;                   /* RECORDED_* */
    /* cl_khr_command_buffer */
    void *command_buffer;
    create_command_buffer_fn create;
    command_buffer_fn finalize, release;
    enqueue_command_buffer_fn enqueue;
    command_nd_range_kernel_fn command_kernel;
    union { command_copy_buffer_fn with_properties; command_copy_buffer_094_fn without_properties; } command_copy;
    union { command_fill_buffer_fn with_properties; command_fill_buffer_094_fn without_properties; } command_fill;
    int properties_on_every_command;
    cl_ulong flags;
    /* cl_qcom_recordable_queues: segments of operations, each a recording of launches or a range of
     * operations enqueued directly */
    cl_command_queue recordable_queue;
    new_recording_fn new_recording;
    recording_fn end_recording, release_recording;
    enqueue_recording_fn enqueue_recording;
    size_t max_launches;
    struct recorded_segment { void *recording; size_t first, last; } *segments;
    size_t segment_count, segment_capacity;
};

enum { RECORDED_NONE = 0, RECORDED_COMMAND_BUFFER = 1, RECORDED_RECORDABLE_QUEUE = 2 };

static int has_extension(const char *extensions, const char *wanted) {
    size_t n = strlen(wanted);
    for (const char *at = extensions; at && (at = strstr(at, wanted)) != NULL; at += n)
        if ((at == extensions || at[-1] == ' ') && (at[n] == ' ' || at[n] == '\0')) return 1;
    return 0;
}

/* The version the device reports for `extension` (CL_DEVICE_EXTENSIONS_WITH_VERSION), 0 if none. */
static cl_uint extension_version(tas_step *step, const char *extension) {
    size_t size = 0;
    if (step->api.GetDeviceInfo(step->device.id, DEVICE_EXTENSIONS_WITH_VERSION, 0, NULL, &size) != CL_SUCCESS || !size)
        return 0;
    name_version *entries = malloc(size);
    cl_uint version = 0;
    if (entries && step->api.GetDeviceInfo(step->device.id, DEVICE_EXTENSIONS_WITH_VERSION, size, entries, NULL) == CL_SUCCESS)
        for (size_t i = 0; i < size / sizeof *entries; i++)
            if (strncmp(entries[i].name, extension, sizeof entries[i].name) == 0) version = entries[i].version;
    free(entries);
    return version;
}

/* The driver's `name` (clGetExtensionFunctionAddressForPlatform; with `exported`, else the OpenCL
 * library's own export, as a vendor library loaded directly has them). */
static void *extension_function(tas_step *step, const char *name, int exported) {
    void *lookup = dlsym(step->api.library, "clGetExtensionFunctionAddressForPlatform");
    void *address = NULL;
    if (lookup) {
        extension_address_fn function;
        memcpy(&function, &lookup, sizeof function); /* (POSIX: dlsym's result converts) */
        address = function(step->device.platform, name);
    }
    if (address == NULL && exported) address = dlsym(step->api.library, name);
    return address;
}

#define RESOLVE(field, name, exported)                                                                 \
    do {                                                                                              \
        void *address_ = extension_function(step, name, exported);                                    \
        if (address_ == NULL) {                                                                       \
            snprintf(why, why_size, "the driver offers %s but has no %s", extension, name);           \
            return 0;                                                                                 \
        }                                                                                             \
        memcpy(&(field), &address_, sizeof address_);                                                 \
    } while (0)

/* Fills the command buffer entry points; 0 with `why` where the device cannot record one. */
static int command_buffer_api(tas_step *step, struct step_recording *r, char *why, size_t why_size) {
    const char *extension = "cl_khr_command_buffer";
    if (!has_extension(step->device.extensions, extension)) {
        snprintf(why, why_size, "the device offers no %s", extension);
        return 0;
    }
    cl_uint version = extension_version(step, extension);
    if (version == 0) {
        snprintf(why, why_size, "the driver offers %s but not its version (CL_DEVICE_EXTENSIONS_WITH_VERSION), which "
                 "decides its entry points' signatures", extension);
        return 0;
    }
    cl_ulong required = 0, capabilities = 0;
    if (step->api.GetDeviceInfo(step->device.id, DEVICE_COMMAND_BUFFER_REQUIRED_QUEUE_PROPERTIES, sizeof required,
                                &required, NULL) == CL_SUCCESS && required) {
        snprintf(why, why_size, "%s needs queue properties %#llx of the step's queue", extension,
                 (unsigned long long)required);
        return 0;
    }
    RESOLVE(r->create, "clCreateCommandBufferKHR", 0);
    RESOLVE(r->finalize, "clFinalizeCommandBufferKHR", 0);
    RESOLVE(r->release, "clReleaseCommandBufferKHR", 0);
    RESOLVE(r->enqueue, "clEnqueueCommandBufferKHR", 0);
    RESOLVE(r->command_kernel, "clCommandNDRangeKernelKHR", 0);
    RESOLVE(r->command_copy.with_properties, "clCommandCopyBufferKHR", 0);
    RESOLVE(r->command_fill.with_properties, "clCommandFillBufferKHR", 0);
    r->properties_on_every_command = version >= VERSION(0, 9, 5);
    /* Each run waits for the step's output before the next one is enqueued, so a command buffer is
     * never enqueued while it runs; before 0.9.8 asking for simultaneous use costs nothing where offered. */
    if (version < VERSION(0, 9, 8) &&
        step->api.GetDeviceInfo(step->device.id, DEVICE_COMMAND_BUFFER_CAPABILITIES, sizeof capabilities,
                                &capabilities, NULL) == CL_SUCCESS &&
        (capabilities & COMMAND_BUFFER_CAPABILITY_SIMULTANEOUS_USE))
        r->flags = COMMAND_BUFFER_SIMULTANEOUS_USE;
    snprintf(step->recording_path, sizeof step->recording_path, "command buffer (%s %u.%u.%u)", extension,
             version >> 22, (version >> 12) & 0x3FF, version & 0xFFF);
    return 1;
}

static int recordable_queue_api(tas_step *step, struct step_recording *r, char *why, size_t why_size) {
    const char *extension = "cl_qcom_recordable_queues";
    if (!has_extension(step->device.extensions, extension)) {
        snprintf(why, why_size, "the device offers no %s", extension);
        return 0;
    }
    cl_uint largest = 0;
    if (step->api.GetDeviceInfo(step->device.id, DEVICE_RECORDABLE_QUEUE_MAX_SIZE, sizeof largest, &largest, NULL) !=
            CL_SUCCESS || largest == 0) {
        snprintf(why, why_size, "%s is offered, but CL_DEVICE_RECORDABLE_QUEUE_MAX_SIZE is not reported", extension);
        return 0;
    }
    RESOLVE(r->new_recording, "clNewRecordingQCOM", 1);
    RESOLVE(r->end_recording, "clEndRecordingQCOM", 1);
    RESOLVE(r->release_recording, "clReleaseRecordingQCOM", 1);
    RESOLVE(r->enqueue_recording, "clEnqueueRecordingQCOM", 1);
    r->max_launches = largest;
    snprintf(step->recording_path, sizeof step->recording_path,
             "recordable queue (%s, up to %u launches a recording, not run on a device yet)", extension, largest);
    return 1;
}
#undef RESOLVE

static const uint8_t FILL_PATTERN[2] = {0xFF, 0x7F}; /* runner/format.py, FILL_PATTERN */

static cl_int record_fills(tas_step *step, struct step_recording *r, size_t index) {
    for (size_t f = step->fills_before[index]; f < step->fills_before[index + 1]; f++) {
        const plan_fill *fill = &step->plan.fills[f];
        cl_mem buffer = step->buffers[fill->identity].buffer;
        size_t whole = (size_t)(fill->nbytes & ~(uint64_t)1), offset = (size_t)fill->offset;
        for (int odd = 0; odd < 2; odd++) {
            size_t bytes = odd ? (size_t)fill->nbytes - whole : whole, at = odd ? offset + whole : offset;
            if (bytes == 0) continue;
            cl_int code = r->properties_on_every_command
                              ? r->command_fill.with_properties(r->command_buffer, NULL, NULL, buffer, FILL_PATTERN,
                                                                odd ? 1 : 2, at, bytes, 0, NULL, NULL, NULL)
                              : r->command_fill.without_properties(r->command_buffer, NULL, buffer, FILL_PATTERN,
                                                                   odd ? 1 : 2, at, bytes, 0, NULL, NULL, NULL);
            if (code != CL_SUCCESS) return code;
        }
    }
    return CL_SUCCESS;
}

/* The training operations (and their fills) recorded into one command buffer. */
static tas_status record_command_buffer(tas_step *step, struct step_recording *r) {
    cl_ulong properties[3] = {COMMAND_BUFFER_FLAGS, r->flags, 0};
    cl_int code = CL_SUCCESS;
    r->command_buffer = r->create(1, &step->queue, r->flags ? properties : NULL, &code);
    if (r->command_buffer == NULL || code != CL_SUCCESS)
        return opencl_failure(step, code ? code : CL_OUT_OF_RESOURCES, "creating", "a command buffer");
    for (size_t i = 0; i < step->training_operations; i++) {
        const step_operation *operation = &step->plan.operations[i];
        if (step->fills_before && (code = record_fills(step, r, i)) != CL_SUCCESS)
            return opencl_failure(step, code, "recording the fills before", operation->is_copy
                                  ? operation->copy.node_name : operation->launch.node_name);
        if (operation->is_copy) {
            const copy_operation *copy = &operation->copy;
            if (copy->nbytes == 0) continue;
            cl_mem source = step->buffers[copy->source].buffer, destination = step->buffers[copy->destination].buffer;
            code = r->properties_on_every_command
                       ? r->command_copy.with_properties(r->command_buffer, NULL, NULL, source, destination, 0, 0,
                                                         (size_t)copy->nbytes, 0, NULL, NULL, NULL)
                       : r->command_copy.without_properties(r->command_buffer, NULL, source, destination, 0, 0,
                                                            (size_t)copy->nbytes, 0, NULL, NULL, NULL);
            if (code != CL_SUCCESS) return opencl_failure(step, code, "recording copy", copy->node_name);
            continue;
        }
        const launch_operation *launch = &operation->launch;
        code = r->command_kernel(r->command_buffer, NULL, NULL, step->kernels[i], launch->dimensions, NULL,
                                 launch->global_size, launch->has_local_size ? launch->local_size : NULL, 0, NULL, NULL,
                                 NULL);
        if (code != CL_SUCCESS) return opencl_failure(step, code, "recording kernel", launch->node_name);
    }
    code = r->finalize(r->command_buffer);
    return code == CL_SUCCESS ? TAS_OK : opencl_failure(step, code, "finalizing", "the command buffer");
}

static tas_status add_segment(tas_step *step, struct step_recording *r, void *recording, size_t first, size_t last) {
    struct recorded_segment segment = {recording, first, last};
    if (!append_item((void **)&r->segments, &r->segment_count, &r->segment_capacity, &segment, sizeof segment))
        return fail(&step->error, TAS_ERROR_MEMORY, "out of memory");
    return TAS_OK;
}

/* Runs of launches (none with fills before it) recorded on a recordable queue; every other
 * operation a segment enqueued directly. */
static tas_status record_recordings(tas_step *step, struct step_recording *r) {
    cl_int code = CL_SUCCESS;
    r->recordable_queue = step->api.CreateCommandQueue(step->context, step->device.id, QUEUE_RECORDABLE, &code);
    if (r->recordable_queue == NULL || code != CL_SUCCESS)
        return opencl_failure(step, code ? code : CL_OUT_OF_RESOURCES, "creating", "a recordable queue");
    size_t i = 0, n = step->training_operations;
    while (i < n) {
        size_t first = i;
        int recordable = !step->plan.operations[i].is_copy &&
                         (!step->fills_before || step->fills_before[i] == step->fills_before[i + 1]);
        if (!recordable) {
            tas_status status = add_segment(step, r, NULL, i, i + 1);
            if (status != TAS_OK) return status;
            i++;
            continue;
        }
        void *recording = r->new_recording(r->recordable_queue, &code);
        if (recording == NULL || code != CL_SUCCESS)
            return opencl_failure(step, code ? code : CL_OUT_OF_RESOURCES, "starting", "a recording");
        for (; i < n && i - first < r->max_launches && !step->plan.operations[i].is_copy &&
               (!step->fills_before || step->fills_before[i] == step->fills_before[i + 1]); i++) {
            const launch_operation *launch = &step->plan.operations[i].launch;
            code = step->api.EnqueueNDRangeKernel(r->recordable_queue, step->kernels[i], launch->dimensions, NULL,
                                                  launch->global_size, launch->has_local_size ? launch->local_size : NULL,
                                                  0, NULL, NULL);
            if (code != CL_SUCCESS) break;
        }
        cl_int ended = r->end_recording(recording);
        tas_status status = add_segment(step, r, recording, first, i);
        if (status != TAS_OK) {
            r->release_recording(recording);
            return status;
        }
        if (code != CL_SUCCESS) return opencl_failure(step, code, "recording kernel", step->plan.operations[i].launch.node_name);
        if (ended != CL_SUCCESS) return opencl_failure(step, ended, "ending", "a recording");
    }
    return TAS_OK;
}

void step_recording_release(tas_step *step) {
    struct step_recording *r = step->recording;
    if (r == NULL) return;
    if (step->queue) step->api.Finish(step->queue);
    if (r->command_buffer) r->release(r->command_buffer);
    for (size_t s = 0; s < r->segment_count; s++)
        if (r->segments[s].recording) r->release_recording(r->segments[s].recording);
    if (r->recordable_queue) step->api.ReleaseCommandQueue(r->recordable_queue);
    free(r->segments);
    free(r);
    step->recording = NULL;
}

/* Whether the variable asks for recording: 1 auto, 2 required, 0 off; -1 with a message for a bad value. */
static int recording_wanted(tas_step *step) {
    const char *value = getenv(RECORDING_VARIABLE);
    if (value == NULL || *value == '\0' || strcasecmp(value, "auto") == 0) return 1;
    static const char *const ON[] = {"1", "true", "yes", "on"}, *const OFF[] = {"0", "false", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(value, ON[i]) == 0) return 2;
        if (strcasecmp(value, OFF[i]) == 0) return 0;
    }
    fail(&step->error, TAS_ERROR_ARGUMENT, "%s is '%s': it takes auto, 1 or 0", RECORDING_VARIABLE, value);
    return -1;
}

tas_status step_recording_prepare(tas_step *step) {
    if (step->recording_decided) return TAS_OK;
    step->recording_decided = 1;
    if (step->profile) {
        snprintf(step->recording_path, sizeof step->recording_path,
                 "operation by operation (opened with profiling: each operation is timed)");
        return TAS_OK;
    }
    int wanted = recording_wanted(step);
    if (wanted < 0) return step->error.status;
    if (wanted == 0) {
        snprintf(step->recording_path, sizeof step->recording_path, "operation by operation (%s=0)", RECORDING_VARIABLE);
        return TAS_OK;
    }
    struct step_recording *r = calloc(1, sizeof *r);
    if (r == NULL) return fail(&step->error, TAS_ERROR_MEMORY, "out of memory");
    step->recording = r;
    char khr[200] = "", qcom[200] = "";
    tas_status status = TAS_OK;
    if (command_buffer_api(step, r, khr, sizeof khr)) {
        r->kind = RECORDED_COMMAND_BUFFER;
        status = record_command_buffer(step, r);
    } else if (recordable_queue_api(step, r, qcom, sizeof qcom) && wanted == 2) {
        r->kind = RECORDED_RECORDABLE_QUEUE;
        status = record_recordings(step, r);
    } else if (wanted == 2) {
        step_recording_release(step);
        return fail(&step->error, TAS_ERROR_DEVICE, "%s=1, but %s cannot record the step: %s; %s. Unset it or set 0",
                    RECORDING_VARIABLE, step->device.label, khr, qcom);
    } else {
        int offered = r->max_launches != 0; /* (recordable_queue_api found everything) */
        step_recording_release(step);
        snprintf(step->recording_path, sizeof step->recording_path, "operation by operation (%s%s)", khr,
                 offered ? "; it offers cl_qcom_recordable_queues, used only with " RECORDING_VARIABLE "=1: that path "
                           "has not run on a device" : "");
        return TAS_OK;
    }
    if (status != TAS_OK) {
        step_recording_release(step);
        step->recording_decided = 0; /* (a failed recording is an error of this run; the next tries again) */
    }
    return status;
}

int step_recording_ready(const tas_step *step) {
    return step->recording != NULL && !step->recording_disabled;
}

tas_status step_recording_enqueue(tas_step *step, tas_status (*enqueue_range)(tas_step *, size_t, size_t)) {
    struct step_recording *r = step->recording;
    cl_int code = CL_SUCCESS;
    if (r->kind == RECORDED_COMMAND_BUFFER) {
        code = r->enqueue(0, NULL, r->command_buffer, 0, NULL, NULL);
        if (code != CL_SUCCESS) return opencl_failure(step, code, "enqueueing", "the step's command buffer");
    } else {
        for (size_t s = 0; s < r->segment_count; s++) {
            const struct recorded_segment *segment = &r->segments[s];
            if (segment->recording == NULL) {
                tas_status status = enqueue_range(step, segment->first, segment->last);
                if (status != TAS_OK) return status;
                continue;
            }
            code = r->enqueue_recording(step->queue, segment->recording, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, NULL,
                                        NULL);
            if (code != CL_SUCCESS)
                return opencl_failure(step, code, "enqueueing the recording starting at",
                                      step->plan.operations[segment->first].launch.node_name);
        }
    }
    code = step->api.Flush(step->queue);
    return code == CL_SUCCESS ? TAS_OK : opencl_failure(step, code, "flushing", "the queue");
}

tas_status tas_step_set_recording(tas_step *step, int recording) {
    if (step == NULL) return TAS_ERROR_ARGUMENT;
    step->recording_disabled = recording == 0;
    return TAS_OK;
}

tas_status tas_step_enqueue_path(tas_step *step, const char **path) {
    if (step == NULL || path == NULL) return TAS_ERROR_ARGUMENT;
    *path = "";
    if (step->queue == NULL) return fail(&step->error, TAS_ERROR_ARGUMENT, "the step did not open");
    tas_status status = step_recording_prepare(step);
    if (status != TAS_OK) return status;
    if (step->recording_disabled && !step->profile)
        snprintf(step->recording_text, sizeof step->recording_text, "operation by operation (tas_step_set_recording 0)");
    else
        snprintf(step->recording_text, sizeof step->recording_text, "%s", step->recording_path);
    *path = step->recording_text;
    return TAS_OK;
}
