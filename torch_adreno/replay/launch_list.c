/* A replayed step's device operations, enqueued in one call from Python, or recorded once into
 * the driver (a cl_khr_command_buffer, or a recording of Qualcomm's cl_qcom_recordable_queues) and
 * enqueued with one call per step.
 *
 * Built by torch_adreno/replay/launch_list.py with the machine's C compiler and loaded through
 * ctypes: it has no Python or OpenCL headers to build against and links nothing. The OpenCL entry
 * points come in as function pointers taken from the OpenCL library the process already loaded
 * (pyopencl's), so the handles it passes belong to that library.
 *
 * Why: a replay's loop in Python costs ~1-2 us per launch above the driver's own enqueue (the
 * interpreter, pyopencl's argument conversion, the event object it makes for every call); here
 * each operation is the driver's call alone, with no event asked for.
 */
#include <stddef.h>
#include <stdint.h>

/* Operation kinds; the same numbers as _LAUNCH, _COPY, _FLUSH and _FILL in launch_list.py. */
enum { TA_LAUNCH = 0, TA_COPY = 1, TA_FLUSH = 2, TA_FILL = 3 };

/* One operation; launch_list.py's _Operation mirrors this layout field for field. */
struct ta_operation {
    int32_t kind;
    uint32_t dims;               /* launch: work dimensions, 1 to 3 */
    void *kernel;                /* launch: cl_kernel, arguments bound beforehand */
    void *source;                /* copy: cl_mem */
    void *destination;           /* copy, fill: cl_mem */
    size_t global_size[3];       /* launch */
    size_t local_size[3];        /* launch: all zero lets the driver choose (NULL) */
    size_t source_offset;        /* copy: bytes */
    size_t destination_offset;   /* copy, fill: bytes */
    size_t nbytes;               /* copy, fill */
    const void *pattern;         /* fill: the bytes repeated */
    size_t pattern_size;         /* fill */
};

typedef int32_t (*ta_enqueue_nd_range_kernel)(void *queue, void *kernel, uint32_t dims,
                                               const size_t *offset, const size_t *global_size,
                                               const size_t *local_size, uint32_t wait_count,
                                               const void *wait_list, void *event);
typedef int32_t (*ta_enqueue_copy_buffer)(void *queue, void *source, void *destination,
                                          size_t source_offset, size_t destination_offset,
                                          size_t nbytes, uint32_t wait_count, const void *wait_list,
                                          void *event);
typedef int32_t (*ta_flush)(void *queue);
typedef int32_t (*ta_enqueue_fill_buffer)(void *queue, void *buffer, const void *pattern, size_t pattern_size,
                                          size_t offset, size_t nbytes, uint32_t wait_count,
                                          const void *wait_list, void *event);

/* The OpenCL entry points; launch_list.py's _EntryPoints mirrors this layout. */
struct ta_entry_points {
    ta_enqueue_nd_range_kernel enqueue_nd_range_kernel;
    ta_enqueue_copy_buffer enqueue_copy_buffer;
    ta_flush flush;
    ta_enqueue_fill_buffer enqueue_fill_buffer;
};

/* Enqueue operations[0..count) on queue in order. Returns -1 when all were enqueued; else the index
 * of the operation that failed, with the driver's error code in *status (and nothing after it
 * enqueued). An unknown kind fails with status 1. */
int64_t ta_enqueue_operations(void *queue, const struct ta_operation *operations, int64_t count,
                              const struct ta_entry_points *cl, int32_t *status) {
    for (int64_t i = 0; i < count; ++i) {
        const struct ta_operation *op = &operations[i];
        int32_t code;
        switch (op->kind) {
        case TA_LAUNCH:
            code = cl->enqueue_nd_range_kernel(queue, op->kernel, op->dims, NULL, op->global_size,
                                               op->local_size[0] ? op->local_size : NULL, 0, NULL,
                                               NULL);
            break;
        case TA_COPY:
            code = cl->enqueue_copy_buffer(queue, op->source, op->destination, op->source_offset,
                                           op->destination_offset, op->nbytes, 0, NULL, NULL);
            break;
        case TA_FLUSH:
            code = cl->flush(queue);
            break;
        case TA_FILL:
            code = cl->enqueue_fill_buffer(queue, op->destination, op->pattern, op->pattern_size,
                                           op->destination_offset, op->nbytes, 0, NULL, NULL);
            break;
        default:
            code = 1;
        }
        if (code != 0) {
            *status = code;
            return i;
        }
    }
    *status = 0;
    return -1;
}

/* ---- Recorded in the driver -------------------------------------------------------------------
 *
 * cl_khr_command_buffer (Khronos; the signatures of OpenCL-Headers' cl_ext.h): a command buffer
 * holds the launches, copies and fills, each kernel's arguments as they were set when it was
 * recorded; clEnqueueCommandBufferKHR runs it on the queue it was made for, in order with the
 * queue's other commands. From version 0.9.5 on, every recording call takes a properties list
 * after the queue argument; before it only the launch did (`properties_on_every_command` 0). */

/* CL_COMMAND_BUFFER_FLAGS_KHR: the command buffer's flags property (CL_COMMAND_BUFFER_SIMULTANEOUS_USE_KHR
 * before version 0.9.8, where a command buffer still running could not be enqueued again without it). */
#define TA_COMMAND_BUFFER_FLAGS 0x1293

typedef void *(*ta_create_command_buffer)(uint32_t queue_count, void *const *queues, const uint64_t *properties,
                                          int32_t *status);
typedef int32_t (*ta_command_buffer_call)(void *command_buffer);
typedef int32_t (*ta_enqueue_command_buffer_call)(uint32_t queue_count, void **queues, void *command_buffer,
                                                  uint32_t wait_count, const void *wait_list, void *event);
typedef int32_t (*ta_command_nd_range_kernel)(void *command_buffer, void *queue, const uint64_t *properties,
                                              void *kernel, uint32_t dims, const size_t *offset,
                                              const size_t *global_size, const size_t *local_size,
                                              uint32_t sync_count, const void *sync_list, void *sync_point,
                                              void *mutable_handle);
typedef int32_t (*ta_command_copy_buffer)(void *command_buffer, void *queue, const uint64_t *properties,
                                          void *source, void *destination, size_t source_offset,
                                          size_t destination_offset, size_t nbytes, uint32_t sync_count,
                                          const void *sync_list, void *sync_point, void *mutable_handle);
typedef int32_t (*ta_command_copy_buffer_without_properties)(void *command_buffer, void *queue, void *source,
                                                             void *destination, size_t source_offset,
                                                             size_t destination_offset, size_t nbytes,
                                                             uint32_t sync_count, const void *sync_list,
                                                             void *sync_point, void *mutable_handle);
typedef int32_t (*ta_command_fill_buffer)(void *command_buffer, void *queue, const uint64_t *properties,
                                          void *buffer, const void *pattern, size_t pattern_size, size_t offset,
                                          size_t nbytes, uint32_t sync_count, const void *sync_list,
                                          void *sync_point, void *mutable_handle);
typedef int32_t (*ta_command_fill_buffer_without_properties)(void *command_buffer, void *queue, void *buffer,
                                                             const void *pattern, size_t pattern_size,
                                                             size_t offset, size_t nbytes, uint32_t sync_count,
                                                             const void *sync_list, void *sync_point,
                                                             void *mutable_handle);

/* The extension's entry points (clGetExtensionFunctionAddressForPlatform); driver_recording.py's
 * _CommandBufferApi mirrors this layout. */
struct ta_command_buffer_api {
    ta_create_command_buffer create;
    ta_command_buffer_call finalize;
    ta_command_buffer_call release;
    ta_enqueue_command_buffer_call enqueue;
    ta_command_nd_range_kernel command_nd_range_kernel;
    union { /* the form of the version: without properties where the flag below is 0 */
        ta_command_copy_buffer with_properties;
        ta_command_copy_buffer_without_properties without_properties;
    } command_copy_buffer;
    union {
        ta_command_fill_buffer with_properties;
        ta_command_fill_buffer_without_properties without_properties;
    } command_fill_buffer;
    int32_t properties_on_every_command;
    uint64_t flags;                                  /* CL_COMMAND_BUFFER_FLAGS_KHR; 0: none given */
};

static int32_t record_command(void *command_buffer, const struct ta_operation *op,
                              const struct ta_command_buffer_api *api) {
    switch (op->kind) {
    case TA_LAUNCH:
        return api->command_nd_range_kernel(command_buffer, NULL, NULL, op->kernel, op->dims, NULL, op->global_size,
                                            op->local_size[0] ? op->local_size : NULL, 0, NULL, NULL, NULL);
    case TA_COPY:
        if (!api->properties_on_every_command)
            return api->command_copy_buffer.without_properties(
                command_buffer, NULL, op->source, op->destination, op->source_offset, op->destination_offset,
                op->nbytes, 0, NULL, NULL, NULL);
        return api->command_copy_buffer.with_properties(command_buffer, NULL, NULL, op->source, op->destination,
                                                        op->source_offset, op->destination_offset, op->nbytes, 0,
                                                        NULL, NULL, NULL);
    case TA_FILL:
        if (!api->properties_on_every_command)
            return api->command_fill_buffer.without_properties(
                command_buffer, NULL, op->destination, op->pattern, op->pattern_size, op->destination_offset,
                op->nbytes, 0, NULL, NULL, NULL);
        return api->command_fill_buffer.with_properties(command_buffer, NULL, NULL, op->destination, op->pattern,
                                                        op->pattern_size, op->destination_offset, op->nbytes, 0,
                                                        NULL, NULL, NULL);
    case TA_FLUSH:
        return 0; /* a command buffer is handed to the device whole; the enqueue flushes after it */
    default:
        return 1;
    }
}

/* A finalized command buffer for `queue` holding operations[0..count) in order (flushes left out),
 * each kernel's arguments as set now. NULL on failure: *status holds the driver's error and *failed
 * the operation refused (-1: creating or finalizing the command buffer). */
void *ta_record_command_buffer(void *queue, const struct ta_operation *operations, int64_t count,
                               const struct ta_command_buffer_api *api, int32_t *status, int64_t *failed) {
    uint64_t properties[3] = {TA_COMMAND_BUFFER_FLAGS, api->flags, 0};
    int32_t code = 0;
    void *command_buffer = api->create(1, &queue, api->flags ? properties : NULL, &code);
    *failed = -1;
    if (command_buffer == NULL || code != 0) {
        *status = code ? code : 1;
        return NULL;
    }
    for (int64_t i = 0; i < count; ++i) {
        code = record_command(command_buffer, &operations[i], api);
        if (code != 0) {
            *failed = i;
            break;
        }
    }
    if (code == 0) code = api->finalize(command_buffer);
    if (code != 0) {
        api->release(command_buffer);
        *status = code;
        return NULL;
    }
    *status = 0;
    return command_buffer;
}

/* Enqueues `command_buffer` on the queue it was made for, then flushes `queue` (the same), so that
 * the device starts on it while the host goes on. Returns the driver's error, 0 on success. */
int32_t ta_enqueue_command_buffer(void *queue, void *command_buffer, const struct ta_command_buffer_api *api,
                                  const struct ta_entry_points *cl) {
    int32_t code = api->enqueue(0, NULL, command_buffer, 0, NULL, NULL);
    return code != 0 ? code : cl->flush(queue);
}

/* cl_qcom_recordable_queues (Qualcomm; the declarations of its published cl_ext_qcom.h, NOT RUN on
 * a device here: no Adreno was available). Kernel launches enqueued on a queue made with
 * CL_QUEUE_RECORDABLE_QCOM between clNewRecordingQCOM and clEndRecordingQCOM make a recording;
 * clEnqueueRecordingQCOM runs it on an ordinary queue (with no argument, offset or work-size
 * updates here: every argument stays as it was set when recorded). Only launches are recorded (the
 * header documents no other command); a replay enqueues copies and fills between recordings. */
typedef void *(*ta_new_recording)(void *recordable_queue, int32_t *status);
typedef int32_t (*ta_recording_call)(void *recording);
typedef int32_t (*ta_enqueue_recording_call)(void *queue, void *recording, size_t argument_count,
                                             const void *arguments, size_t offset_count, const void *offsets,
                                             size_t global_size_count, const void *global_sizes,
                                             size_t local_size_count, const void *local_sizes,
                                             uint32_t wait_count, const void *wait_list, void *event);

/* driver_recording.py's _RecordableQueueApi mirrors this layout. */
struct ta_recordable_queue_api {
    ta_new_recording new_recording;
    ta_recording_call end_recording;
    ta_recording_call release_recording;
    ta_enqueue_recording_call enqueue_recording;
};

/* A recording of the launches operations[0..count) (launches only) made on `recordable_queue`.
 * NULL on failure, with *status and *failed as ta_record_command_buffer's. */
void *ta_record_launches(void *recordable_queue, const struct ta_operation *operations, int64_t count,
                         const struct ta_recordable_queue_api *api, const struct ta_entry_points *cl,
                         int32_t *status, int64_t *failed) {
    int32_t code = 0;
    void *recording = api->new_recording(recordable_queue, &code);
    *failed = -1;
    if (recording == NULL || code != 0) {
        *status = code ? code : 1;
        return NULL;
    }
    for (int64_t i = 0; i < count && code == 0; ++i) {
        const struct ta_operation *op = &operations[i];
        code = op->kind != TA_LAUNCH ? 1
               : cl->enqueue_nd_range_kernel(recordable_queue, op->kernel, op->dims, NULL, op->global_size,
                                             op->local_size[0] ? op->local_size : NULL, 0, NULL, NULL);
        if (code != 0) *failed = i;
    }
    int32_t ended = api->end_recording(recording);
    if (code == 0) code = ended;
    if (code != 0) {
        api->release_recording(recording);
        *status = code;
        return NULL;
    }
    *status = 0;
    return recording;
}

/* Enqueues `recording` on `queue` as recorded, then flushes it. Returns the driver's error, 0 on success. */
int32_t ta_enqueue_recording(void *queue, void *recording, const struct ta_recordable_queue_api *api,
                             const struct ta_entry_points *cl) {
    int32_t code = api->enqueue_recording(queue, recording, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, NULL, NULL);
    return code != 0 ? code : cl->flush(queue);
}
