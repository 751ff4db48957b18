/* A replayed step's device operations, enqueued in one call from Python.
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
