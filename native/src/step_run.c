/* Running a step: the batch uploaded, the file's launches and copies enqueued in its order, the loss
 * read back, the index record checked (torch_adreno/runner/__init__.py, StepRunner._run). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "step_runtime.h"

/* Operation counts after which a run flushes the queue: early, then at doubling intervals, so that
 * the device computes while the host enqueues the rest (some drivers submit only at a flush or a
 * blocking call). The replay's FLUSH_AFTER (torch_adreno/replay/step.py). */
static const size_t FLUSH_AFTER[] = {4, 16, 48, 112, 240, 496, 1008};

static double milliseconds_now(void) {
    struct timespec time;
    clock_gettime(CLOCK_MONOTONIC, &time);
    return (double)time.tv_sec * 1e3 + (double)time.tv_nsec * 1e-6;
}

tas_status opencl_failure(tas_step *step, cl_int code, const char *doing, const char *what) {
    char name[96];
    const char *hint = code == CL_MEM_OBJECT_ALLOCATION_FAILURE || code == CL_OUT_OF_RESOURCES
                           ? " (the device is out of memory or resources)" : "";
    return fail(&step->error, TAS_ERROR_OPENCL, "%s %s on %s failed: %s%s", doing, what,
                step->device.label[0] ? step->device.label : "the device", opencl_error_name(code, name, sizeof name),
                hint);
}

static tas_status require_open(tas_step *step) {
    if (step->queue == NULL)
        return fail(&step->error, TAS_ERROR_ARGUMENT, "the step did not open (%s)",
                    step->error.message[0] ? step->error.message : "tas_step_open failed");
    return TAS_OK;
}

/* The elements of `source` a batch view selects, contiguous in `out` (numpy's as_strided of the
 * flat input: offset + sum(index[d] * stride[d])). */
static void gather_view(const batch_view *view, const uint8_t *source, size_t element, uint8_t *out) {
    size_t count = 1;
    for (int d = 0; d < view->rank; d++) count *= (size_t)view->shape[d];
    int64_t index[TAS_MAX_RANK] = {0};
    for (size_t n = 0; n < count; n++) {
        int64_t position = view->offset;
        for (int d = 0; d < view->rank; d++) position += index[d] * view->stride[d];
        memcpy(out + n * element, source + (size_t)position * element, element);
        for (int d = view->rank - 1; d >= 0; d--) {
            if (++index[d] < view->shape[d]) break;
            index[d] = 0;
        }
    }
}

/* Uploads the batch identities of the training step (or of the prediction); the gathered views are
 * left in `scratch` (freed by the caller once the queue has finished with them). */
static tas_status upload_batch(tas_step *step, const void *const *batch, int prediction, void **scratch) {
    const step_plan *plan = &step->plan;
    for (size_t i = 0; i < plan->identity_count; i++) {
        const plan_identity *identity = &plan->identities[i];
        if (identity->kind != MEMORY_BATCH || identity->for_prediction != prediction) continue;
        const tensor_spec *input = &plan->batch[identity->batch];
        if (prediction && identity->batch != 0)
            return fail(&step->error, TAS_ERROR_FORMAT,
                        "%s: the prediction reads batch input %s; it takes batch input 0 only", step->origin, input->name);
        const void *data = batch[identity->batch];
        size_t bytes = input->bytes;
        if (identity->has_view) {
            size_t element = dtype_size(input->dtype), count;
            shape_elements(identity->view.shape, identity->view.rank, &count); /* (checked when the plan was read) */
            bytes = count * element;
            scratch[i] = malloc(bytes + 1);
            if (scratch[i] == NULL) return fail(&step->error, TAS_ERROR_MEMORY, "out of memory");
            gather_view(&identity->view, data, element, scratch[i]);
            data = scratch[i];
        }
        if (bytes == 0) continue;
        cl_int code = step->api.EnqueueWriteBuffer(step->queue, step->buffers[identity->index].buffer, CL_FALSE, 0,
                                                   bytes, data, 0, NULL, NULL);
        if (code != CL_SUCCESS) return opencl_failure(step, code, "uploading batch input", input->name);
    }
    return TAS_OK;
}

static tas_status enqueue(tas_step *step, size_t index, cl_event *event) {
    const step_operation *operation = &step->plan.operations[index];
    cl_int code;
    if (operation->is_copy) {
        const copy_operation *copy = &operation->copy;
        if (copy->nbytes == 0) return TAS_OK;
        code = step->api.EnqueueCopyBuffer(step->queue, step->buffers[copy->source].buffer,
                                           step->buffers[copy->destination].buffer, 0, 0, (size_t)copy->nbytes, 0, NULL,
                                           event);
        return code == CL_SUCCESS ? TAS_OK : opencl_failure(step, code, "copy", copy->node_name);
    }
    const launch_operation *launch = &operation->launch;
    code = step->api.EnqueueNDRangeKernel(step->queue, step->kernels[index], launch->dimensions, NULL,
                                          launch->global_size, launch->has_local_size ? launch->local_size : NULL, 0,
                                          NULL, event);
    return code == CL_SUCCESS ? TAS_OK : opencl_failure(step, code, "launching kernel", launch->node_name);
}

/* The fills listed before operation `index` (with filling on): each the 16-bit pattern over the even
 * part, and its first byte over an odd last byte (runner/format.py, fill_commands). */
static tas_status enqueue_fills(tas_step *step, size_t index) {
    static const uint8_t PATTERN[2] = {0xFF, 0x7F}; /* runner/format.py, FILL_PATTERN */
    for (size_t f = step->fills_before[index]; f < step->fills_before[index + 1]; f++) {
        const plan_fill *fill = &step->plan.fills[f];
        cl_mem buffer = step->buffers[fill->identity].buffer;
        size_t whole = (size_t)(fill->nbytes & ~(uint64_t)1), offset = (size_t)fill->offset;
        cl_int code = CL_SUCCESS;
        if (whole)
            code = step->api.EnqueueFillBuffer(step->queue, buffer, PATTERN, sizeof PATTERN, offset, whole, 0, NULL, NULL);
        if (code == CL_SUCCESS && fill->nbytes > whole)
            code = step->api.EnqueueFillBuffer(step->queue, buffer, PATTERN, 1, offset + whole, 1, 0, NULL, NULL);
        if (code != CL_SUCCESS) {
            const step_operation *before = &step->plan.operations[index];
            return opencl_failure(step, code, "filling memory before",
                                  before->is_copy ? before->copy.node_name : before->launch.node_name);
        }
    }
    return TAS_OK;
}

static void add_time(tas_step *step, size_t index, cl_event event) {
    cl_ulong start = 0, end = 0;
    if (step->api.GetEventProfilingInfo(event, CL_PROFILING_COMMAND_START, sizeof start, &start, NULL) == CL_SUCCESS &&
        step->api.GetEventProfilingInfo(event, CL_PROFILING_COMMAND_END, sizeof end, &end, NULL) == CL_SUCCESS &&
        end >= start) {
        step->times[index].milliseconds += (double)(end - start) / 1e6;
        step->times[index].runs += 1;
    }
}

/* As the Python runner: the first out-of-range index a kernel met (read in the loss's wait, into
 * step->index_values), then the record zeroed. */
static tas_status check_index_record(tas_step *step) {
    const int32_t *record = step->index_values;
    if (record[0] == 0) return TAS_OK;
    static const int32_t NO_ERROR[4] = {0, 0, 0, 0};
    cl_int code = step->api.EnqueueWriteBuffer(step->queue, step->index_record, CL_TRUE, 0, sizeof NO_ERROR, NO_ERROR,
                                               0, NULL, NULL);
    if (code != CL_SUCCESS) return opencl_failure(step, code, "resetting", "the index record");
    long long value = (long long)(((uint64_t)(uint32_t)record[2]) | ((uint64_t)(int64_t)record[3] << 32));
    const char *kernel = record[0] > 0 && (size_t)record[0] <= step->checking_count
                             ? step->checking_launches[record[0] - 1] : "?";
    return fail(&step->error, TAS_ERROR_INDEX,
                "kernel %s read index %lld out of range (check site %d): a batch value indexes past a dimension (e.g. a "
                "token id >= the vocabulary); that step's results are invalid (its update was applied with the index "
                "replaced by 0)", kernel, value, (int)record[1]);
}

/* Enqueues operations [first, last) with their fills, flushing early then at doubling intervals;
 * with `events`, each operation's event into events[i - first]. */
static tas_status enqueue_operations(tas_step *step, size_t first, size_t last, cl_event *events) {
    tas_status status = TAS_OK;
    size_t next_flush = 0;
    for (size_t i = first; i < last && status == TAS_OK; i++) {
        if (step->fills_before && (status = enqueue_fills(step, i)) != TAS_OK) break;
        status = enqueue(step, i, events ? &events[i - first] : NULL);
        if (status != TAS_OK || next_flush >= sizeof FLUSH_AFTER / sizeof FLUSH_AFTER[0] ||
            i - first + 1 != FLUSH_AFTER[next_flush])
            continue;
        next_flush += 1;
        cl_int code = step->api.Flush(step->queue);
        if (code != CL_SUCCESS) status = opencl_failure(step, code, "flushing", "the queue");
    }
    return status;
}

static tas_status enqueue_range(tas_step *step, size_t first, size_t last) {
    return enqueue_operations(step, first, last, NULL);
}

/* Uploads, enqueues operations [first, last) (the training step's recorded in the driver where it
 * is: step_record.c), reads `output` into `result` (and the index record, non-blocking before it:
 * one wait for both). */
static tas_status execute(tas_step *step, const void *const *batch, int prediction, size_t first, size_t last,
                          const tensor_spec *output, void *result) {
    void **scratch = calloc(step->plan.identity_count + 1, sizeof *scratch);
    if (scratch == NULL) return fail(&step->error, TAS_ERROR_MEMORY, "out of memory");
    int timing = step->profile && !prediction;
    cl_event *events = timing ? calloc(last - first + 1, sizeof *events) : NULL;
    tas_status status = timing && events == NULL ? fail(&step->error, TAS_ERROR_MEMORY, "out of memory") : TAS_OK;
    if (status == TAS_OK && !prediction) status = step_recording_prepare(step);
    double started = milliseconds_now();
    if (status == TAS_OK) status = upload_batch(step, batch, prediction, scratch);
    double uploaded = milliseconds_now();
    if (status == TAS_OK && !prediction && step_recording_ready(step)) status = step_recording_enqueue(step, enqueue_range);
    else if (status == TAS_OK) status = enqueue_operations(step, first, last, events);
    cl_int code = CL_SUCCESS;
    if (status == TAS_OK && step->checking_count)
        code = step->api.EnqueueReadBuffer(step->queue, step->index_record, CL_FALSE, 0, sizeof step->index_values,
                                           step->index_values, 0, NULL, NULL);
    if (status == TAS_OK && code != CL_SUCCESS) status = opencl_failure(step, code, "reading", "the index record");
    double enqueued = milliseconds_now();
    if (status == TAS_OK)
        code = step->api.EnqueueReadBuffer(step->queue, step->buffers[output->identity].buffer, CL_TRUE, 0,
                                           output->bytes, result, 0, NULL, NULL);
    if (status == TAS_OK && code != CL_SUCCESS) status = opencl_failure(step, code, "reading", "the step's output");
    /* nothing may still use the scratch buffers or step->index_values */
    if (status != TAS_OK) step->api.Finish(step->queue);
    double finished = milliseconds_now();
    if (status == TAS_OK && !prediction)
        step->phases = (tas_step_phases){uploaded - started, enqueued - uploaded, finished - enqueued};
    for (size_t i = 0; timing && i < last - first; i++)
        if (events[i] != NULL) {
            if (status == TAS_OK) add_time(step, first + i, events[i]);
            step->api.ReleaseEvent(events[i]);
        }
    free(events);
    for (size_t i = 0; i < step->plan.identity_count; i++) free(scratch[i]);
    free(scratch);
    if (status == TAS_OK && step->checking_count) status = check_index_record(step);
    return status;
}

tas_status tas_step_run(tas_step *step, const void *const *batch, const size_t *bytes, float *loss) {
    if (step == NULL) return TAS_ERROR_ARGUMENT;
    tas_status status = require_open(step);
    if (status != TAS_OK) return status;
    if ((batch == NULL || bytes == NULL) && step->plan.batch_count)
        return fail(&step->error, TAS_ERROR_ARGUMENT, "no batch given: the step takes %zu arrays", step->plan.batch_count);
    if (loss == NULL) return fail(&step->error, TAS_ERROR_ARGUMENT, "no place for the loss given");
    for (size_t i = 0; i < step->plan.batch_count; i++) {
        const tensor_spec *spec = &step->plan.batch[i];
        if (bytes[i] != spec->bytes || (batch[i] == NULL && spec->bytes))
            return fail(&step->error, TAS_ERROR_ARGUMENT,
                        "%s: the step was exported for %s with %zu elements (%zu bytes), got %zu bytes", spec->name,
                        dtype_name(spec->dtype), spec->elements, spec->bytes, bytes[i]);
    }
    return execute(step, batch, 0, 0, step->training_operations, &step->plan.loss, loss);
}

int tas_step_can_predict(const tas_step *step) {
    return step != NULL && step->queue != NULL && step->plan.has_prediction;
}

static tas_status describe_tensor(const tensor_spec *spec, tas_tensor_info *info) {
    info->name = spec->name ? spec->name : "logits";
    info->dtype = spec->dtype;
    info->rank = spec->rank;
    memcpy(info->shape, spec->shape, sizeof info->shape);
    info->bytes = spec->bytes;
    return TAS_OK;
}

tas_status tas_step_predict_info(tas_step *step, tas_tensor_info *output) {
    if (step == NULL || output == NULL) return TAS_ERROR_ARGUMENT;
    if (!tas_step_can_predict(step))
        return fail(&step->error, TAS_ERROR_ARGUMENT,
                    "this file holds no prediction: export it with predict= (the CLI always does)");
    return describe_tensor(&step->plan.prediction, output);
}

tas_status tas_step_predict(tas_step *step, const void *input, size_t input_bytes, void *output, size_t output_bytes) {
    tas_tensor_info info;
    tas_status status = tas_step_predict_info(step, &info);
    if (status != TAS_OK) return status;
    const tensor_spec *spec = &step->plan.batch[0];
    if (step->plan.batch_count == 0 || input == NULL || input_bytes != spec->bytes)
        return fail(&step->error, TAS_ERROR_ARGUMENT, "the prediction takes %s (%zu bytes), got %zu bytes",
                    step->plan.batch_count ? spec->name : "no input", step->plan.batch_count ? spec->bytes : 0,
                    input_bytes);
    if (output == NULL || output_bytes != info.bytes)
        return fail(&step->error, TAS_ERROR_ARGUMENT, "the prediction writes %zu bytes, room for %zu given", info.bytes,
                    output_bytes);
    const void *batch[1] = {input};
    return execute(step, batch, 1, step->training_operations, step->plan.operation_count, &step->plan.prediction,
                   output);
}

size_t tas_step_batch_count(const tas_step *step) {
    return step != NULL && step->queue != NULL ? step->plan.batch_count : 0;
}

tas_status tas_step_batch_info(tas_step *step, size_t index, tas_tensor_info *info) {
    if (step == NULL || info == NULL) return TAS_ERROR_ARGUMENT;
    if (index >= tas_step_batch_count(step))
        return fail(&step->error, TAS_ERROR_ARGUMENT, "batch input %zu: the step takes %zu", index,
                    tas_step_batch_count(step));
    return describe_tensor(&step->plan.batch[index], info);
}

tas_status tas_step_summarize(tas_step *step, tas_step_summary *summary) {
    if (step == NULL || summary == NULL) return TAS_ERROR_ARGUMENT;
    tas_status status = require_open(step);
    if (status != TAS_OK) return status;
    summary->device = step->device.label;
    summary->driver = step->device.info.driver;
    summary->operations = step->training_operations;
    summary->kernels = 0;
    for (size_t i = 0; i < step->training_operations; i++) summary->kernels += !step->plan.operations[i].is_copy;
    summary->programs_built = step->programs_built;
    summary->programs_cached = step->programs_cached;
    summary->device_bytes = step->device_bytes;
    return TAS_OK;
}

tas_status tas_step_kernel_time(tas_step *step, size_t operation, const char **name, double *milliseconds,
                                size_t *runs) {
    if (step == NULL || name == NULL || milliseconds == NULL || runs == NULL) return TAS_ERROR_ARGUMENT;
    if (step->times == NULL)
        return fail(&step->error, TAS_ERROR_ARGUMENT, "the step was opened without profiling (tas_open_options.profile)");
    if (operation >= step->training_operations)
        return fail(&step->error, TAS_ERROR_ARGUMENT, "operation %zu: the training step has %zu", operation,
                    step->training_operations);
    const step_operation *op = &step->plan.operations[operation];
    *name = op->is_copy ? op->copy.node_name : op->launch.node_name;
    *milliseconds = step->times[operation].milliseconds;
    *runs = step->times[operation].runs;
    return TAS_OK;
}

tas_status tas_step_last_phases(const tas_step *step, tas_step_phases *phases) {
    if (step == NULL || phases == NULL) return TAS_ERROR_ARGUMENT;
    *phases = step->phases;
    return TAS_OK;
}

void tas_step_reset_times(tas_step *step) {
    if (step != NULL && step->times != NULL)
        memset(step->times, 0, step->plan.operation_count * sizeof *step->times);
}
