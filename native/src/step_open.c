/* Opening a step: the file read and checked, the device chosen and checked, the plan's memory
 * allocated, every program built and every kernel argument bound once (as torch_adreno's Python
 * runner does in StepRunner.__init__). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "integrity.h"
#include "step_runtime.h"

/* The initializer's values as `bytes` bytes of `dtype`, in `values` (malloc'd) or pointing into
 * the mapped file (`*owned` 0). */
static tas_status initial_values(tas_step *step, const onnx_initializer *tensor, const state_tensor *state,
                                 const void **values, int *owned) {
    *owned = 0;
    size_t elements = state->bytes / dtype_size(state->dtype);
    const char *name = state->name;
    if (tensor->storage == STORAGE_RAW || (tensor->storage == STORAGE_NONE && elements == 0)) {
        if (tensor->raw_length != state->bytes)
            return fail(&step->error, TAS_ERROR_FORMAT,
                        "%s: the initial value of %s holds %zu bytes; its dtype and shape make %zu: export it again",
                        step->origin, name, tensor->raw_length, state->bytes);
        *values = tensor->raw;
        return TAS_OK;
    }
    int fits = (tensor->storage == STORAGE_FLOATS && state->dtype == TAS_FLOAT32) ||
               (tensor->storage == STORAGE_INT64S && state->dtype == TAS_INT64) ||
               (tensor->storage == STORAGE_INT32S && state->dtype != TAS_FLOAT32 && state->dtype != TAS_INT64);
    if (!fits || tensor->value_count != elements)
        return fail(&step->error, TAS_ERROR_FORMAT,
                    "%s: the initial value of %s does not hold %zu values of %s: export it again", step->origin, name,
                    elements, dtype_name(state->dtype));
    if (tensor->storage != STORAGE_INT32S || state->dtype == TAS_INT32) {
        *values = tensor->values;
        return TAS_OK;
    }
    /* bool and uint8 are stored one value per int32 (TensorProto.int32_data) */
    uint8_t *narrow = malloc(elements + 1);
    if (narrow == NULL) return fail(&step->error, TAS_ERROR_MEMORY, "out of memory");
    const int32_t *wide = tensor->values;
    for (size_t i = 0; i < elements; i++) narrow[i] = (uint8_t)wide[i];
    *values = narrow;
    *owned = 1;
    return TAS_OK;
}

/* The state tensors: each persistent identity's input, with its initializer's dtype and shape. */
static tas_status read_state_layout(tas_step *step, uint64_t *largest) {
    step_plan *plan = &step->plan;
    step->state = calloc(plan->identity_count + 1, sizeof *step->state);
    if (step->state == NULL) return fail(&step->error, TAS_ERROR_MEMORY, "out of memory");
    for (size_t i = 0; i < plan->identity_count; i++) {
        const plan_identity *identity = &plan->identities[i];
        if (identity->kind != MEMORY_PERSISTENT) continue;
        const onnx_initializer *tensor = onnx_find_initializer(&step->model, identity->input);
        if (tensor == NULL)
            return fail(&step->error, TAS_ERROR_FORMAT, "%s has no initial value for state input %s", step->origin,
                        identity->input);
        for (size_t j = 0; j < step->state_count; j++)
            if (strcmp(step->state[j].name, identity->input) == 0)
                return fail(&step->error, TAS_ERROR_FORMAT, "%s binds state input %s to two memory identities",
                            step->origin, identity->input);
        state_tensor *state = &step->state[step->state_count];
        state->name = identity->input;
        state->identity = identity->index;
        if (!dtype_from_onnx(tensor->data_type, &state->dtype))
            return fail(&step->error, TAS_ERROR_FORMAT,
                        "%s: state input %s has ONNX element type %d; the step format uses float32, int64, int32, bool "
                        "and uint8", step->origin, state->name, (int)tensor->data_type);
        if (tensor->external)
            return fail(&step->error, TAS_ERROR_FORMAT,
                        "%s keeps the values of %s in another file (ONNX external data); this runtime reads one file: "
                        "save the model without external data", step->origin, state->name);
        state->rank = tensor->rank;
        memcpy(state->shape, tensor->dims, sizeof state->shape);
        size_t elements;
        if (!shape_elements(state->shape, state->rank, &elements) ||
            !multiply_size(elements, dtype_size(state->dtype), &state->bytes))
            return fail(&step->error, TAS_ERROR_FORMAT, "%s: state input %s has an invalid shape", step->origin,
                        state->name);
        if (state->bytes > *largest) *largest = state->bytes;
        step->state_count += 1;
    }
    return TAS_OK;
}

static tas_status new_buffer(tas_step *step, size_t bytes, const char *what, cl_mem *buffer) {
    cl_int code = CL_SUCCESS;
    size_t size = bytes ? bytes : 1; /* OpenCL has no empty buffers */
    *buffer = step->api.CreateBuffer(step->context, CL_MEM_READ_WRITE, size, NULL, &code);
    if (*buffer == NULL || code != CL_SUCCESS) return opencl_failure(step, code, "allocating", what);
    step->device_bytes += size;
    return TAS_OK;
}

static tas_status own_buffer(tas_step *step, int64_t identity, size_t bytes, const char *what) {
    cl_mem buffer;
    tas_status status = new_buffer(step, bytes, what, &buffer);
    if (status != TAS_OK) return status;
    step->owned_buffers[step->owned_count++] = buffer;
    step->buffers[identity] = (identity_buffer){buffer, bytes};
    return TAS_OK;
}

static tas_status upload_state(tas_step *step, const state_tensor *state) {
    const onnx_initializer *tensor = onnx_find_initializer(&step->model, state->name);
    const void *values = NULL;
    int owned;
    tas_status status = initial_values(step, tensor, state, &values, &owned);
    if (status == TAS_OK) status = own_buffer(step, state->identity, state->bytes, state->name);
    if (status == TAS_OK && state->bytes) {
        cl_int code = step->api.EnqueueWriteBuffer(step->queue, step->buffers[state->identity].buffer, CL_TRUE, 0,
                                                   state->bytes, values, 0, NULL, NULL);
        if (code != CL_SUCCESS) status = opencl_failure(step, code, "uploading the initial value of", state->name);
    }
    if (owned) free((void *)values);
    return status;
}

static tas_status allocate(tas_step *step) {
    step_plan *plan = &step->plan;
    step->slot_buffers = calloc(plan->slot_count + 1, sizeof *step->slot_buffers);
    step->buffers = calloc(plan->identity_range + 1, sizeof *step->buffers);
    step->owned_buffers = calloc(plan->identity_count + 1, sizeof *step->owned_buffers);
    if (!step->slot_buffers || !step->buffers || !step->owned_buffers)
        return fail(&step->error, TAS_ERROR_MEMORY, "out of memory");
    for (size_t i = 0; i < plan->slot_count; i++) {
        char what[64];
        snprintf(what, sizeof what, "slot %zu of the memory plan", i);
        tas_status status = new_buffer(step, (size_t)plan->slots[i], what, &step->slot_buffers[i]);
        if (status != TAS_OK) return status;
        step->slot_buffer_count += 1;
    }
    for (size_t i = 0; i < plan->identity_count; i++) {
        const plan_identity *identity = &plan->identities[i];
        tas_status status = TAS_OK;
        if (identity->kind == MEMORY_INTERNAL && identity->slot >= 0)
            step->buffers[identity->index] = (identity_buffer){step->slot_buffers[identity->slot],
                                                               (size_t)plan->slots[identity->slot]};
        else if (identity->kind == MEMORY_BATCH)
            status = own_buffer(step, identity->index, (size_t)identity->nbytes, "a batch input");
        if (status != TAS_OK) return status;
    }
    for (size_t i = 0; i < step->state_count; i++) {
        tas_status status = upload_state(step, &step->state[i]);
        if (status != TAS_OK) return status;
    }
    static const int32_t NO_ERROR[4] = {0, 0, 0, 0};
    cl_int code = CL_SUCCESS;
    step->index_record = step->api.CreateBuffer(step->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                                sizeof NO_ERROR, (void *)NO_ERROR, &code);
    if (step->index_record == NULL || code != CL_SUCCESS) return opencl_failure(step, code, "allocating", "the index record");
    return TAS_OK;
}

/* The buffer of a memory identity an operation uses, or a refusal naming it. */
static tas_status buffer_of(tas_step *step, int64_t identity, const char *node, identity_buffer **out) {
    if (plan_identity_of(&step->plan, identity) == NULL || step->buffers[identity].buffer == NULL)
        return fail(&step->error, TAS_ERROR_FORMAT,
                    "%s: operation %s uses memory identity %lld, which the file's plan does not place", step->origin,
                    node, (long long)identity);
    *out = &step->buffers[identity];
    return TAS_OK;
}

static uint64_t program_hash(const launch_operation *launch) {
    uint64_t hash = 0xcbf29ce484222325ULL;
    for (const char *at = launch->source; *at; at++) hash = (hash ^ (uint8_t)*at) * 0x100000001b3ULL;
    hash = (hash ^ 0xffu) * 0x100000001b3ULL;
    for (const char *at = launch->options; *at; at++) hash = (hash ^ (uint8_t)*at) * 0x100000001b3ULL;
    return hash;
}

/* The program of `launch`, built once for every launch of the same source and options (the Python
 * runner's cache by source and options). */
static tas_status program_for(tas_step *step, const launch_operation *launch, const char *cache_dir,
                              uint64_t *hashes, const launch_operation **built_for, cl_program *program) {
    uint64_t hash = program_hash(launch);
    for (size_t i = 0; i < step->program_count; i++)
        if (hashes[i] == hash && strcmp(built_for[i]->source, launch->source) == 0 &&
            strcmp(built_for[i]->options, launch->options) == 0) {
            *program = step->programs[i];
            return TAS_OK;
        }
    program_request request = {launch->kernel_name, launch->source, launch->options};
    program_origin origin;
    tas_status status = program_build(&step->api, step->context, &step->device, &request, cache_dir, program, &origin,
                                      &step->error);
    if (status != TAS_OK) return status;
    hashes[step->program_count] = hash;
    built_for[step->program_count] = launch;
    step->programs[step->program_count++] = *program;
    if (origin == PROGRAM_FROM_CACHE) step->programs_cached += 1;
    else step->programs_built += 1;
    return TAS_OK;
}

static tas_status bind_launch(tas_step *step, size_t index, cl_program program) {
    const launch_operation *launch = &step->plan.operations[index].launch;
    cl_int code = CL_SUCCESS;
    cl_kernel kernel = step->api.CreateKernel(program, launch->kernel_name, &code);
    if (kernel == NULL || code != CL_SUCCESS) return opencl_failure(step, code, "creating kernel", launch->kernel_name);
    step->kernels[index] = kernel;
    cl_uint position = 0;
    for (; position < launch->buffer_count; position++) {
        identity_buffer *buffer = NULL;
        tas_status status = buffer_of(step, launch->buffers[position], launch->node_name, &buffer);
        if (status != TAS_OK) return status;
        code = step->api.SetKernelArg(kernel, position, sizeof(cl_mem), &buffer->buffer);
        if (code != CL_SUCCESS) return opencl_failure(step, code, "binding the arguments of", launch->node_name);
    }
    if (launch->index_checks) { /* the record and this launch's token (1-based: 0 means "no error") */
        step->checking_launches[step->checking_count++] = launch->kernel_name;
        cl_int token = (cl_int)step->checking_count;
        code = step->api.SetKernelArg(kernel, position, sizeof(cl_mem), &step->index_record);
        if (code == CL_SUCCESS) code = step->api.SetKernelArg(kernel, position + 1, sizeof token, &token);
        if (code != CL_SUCCESS) return opencl_failure(step, code, "binding the index record of", launch->node_name);
    }
    return TAS_OK;
}

static tas_status check_copy(tas_step *step, const copy_operation *copy) {
    identity_buffer *destination = NULL, *source = NULL;
    tas_status status = buffer_of(step, copy->destination, copy->node_name, &destination);
    if (status == TAS_OK) status = buffer_of(step, copy->source, copy->node_name, &source);
    if (status != TAS_OK) return status;
    if (copy->nbytes > destination->bytes || copy->nbytes > source->bytes)
        return fail(&step->error, TAS_ERROR_FORMAT,
                    "%s: copy %s moves %llu bytes between buffers of %zu and %zu bytes: a corrupted step file? export "
                    "it again", step->origin, copy->node_name, (unsigned long long)copy->nbytes, source->bytes,
                    destination->bytes);
    return TAS_OK;
}

static tas_status check_output(tas_step *step, const tensor_spec *output, const char *what) {
    identity_buffer *buffer = NULL;
    tas_status status = buffer_of(step, output->identity, what, &buffer);
    if (status == TAS_OK && buffer->bytes < output->bytes)
        status = fail(&step->error, TAS_ERROR_FORMAT, "%s: the %s (%zu bytes) is larger than its buffer (%zu bytes)",
                      step->origin, what, output->bytes, buffer->bytes);
    return status;
}

static tas_status build_and_bind(tas_step *step, const char *cache_dir) {
    size_t count = step->plan.operation_count;
    step->programs = calloc(count + 1, sizeof *step->programs);
    step->kernels = calloc(count + 1, sizeof *step->kernels);
    step->checking_launches = calloc(count + 1, sizeof *step->checking_launches);
    uint64_t *hashes = calloc(count + 1, sizeof *hashes);
    const launch_operation **built_for = calloc(count + 1, sizeof *built_for);
    tas_status status = TAS_OK;
    if (!step->programs || !step->kernels || !step->checking_launches || !hashes || !built_for)
        status = fail(&step->error, TAS_ERROR_MEMORY, "out of memory");
    for (size_t i = 0; i < count && status == TAS_OK; i++) {
        const step_operation *operation = &step->plan.operations[i];
        cl_program program;
        if (operation->is_copy) {
            status = check_copy(step, &operation->copy);
        } else if ((status = program_for(step, &operation->launch, cache_dir, hashes, built_for, &program)) == TAS_OK) {
            status = bind_launch(step, i, program);
        }
    }
    free(hashes);
    free(built_for);
    if (status == TAS_OK) status = check_output(step, &step->plan.loss, "loss");
    if (status == TAS_OK && step->plan.has_prediction)
        status = check_output(step, &step->plan.prediction, "prediction's output");
    return status;
}

/* Whether to fill memory before its first write: the option, else the environment variable (the
 * words torch_adreno's options take, in any case). */
static tas_status fill_requested(tas_step *step, int option, int *fill) {
    *fill = option > 0;
    const char *value = getenv(FILL_VARIABLE);
    if (option != 0 || value == NULL) return TAS_OK;
    char word[8] = "";
    size_t length = strlen(value);
    for (size_t i = 0; i < length && length < sizeof word; i++) word[i] = (char)tolower((unsigned char)value[i]);
    static const char *const WORDS[] = {"", "0", "false", "no", "off", "1", "true", "yes", "on"};
    for (size_t i = 0; i < sizeof WORDS / sizeof WORDS[0] && length < sizeof word; i++)
        if (strcmp(word, WORDS[i]) == 0) {
            *fill = i >= 5;
            return TAS_OK;
        }
    return fail(&step->error, TAS_ERROR_ARGUMENT,
                "environment variable %s: must be 1 or 0 (true/false, yes/no, on/off), got '%s'", FILL_VARIABLE, value);
}

/* With filling on, where each operation's fills start (step->fills_before). */
static tas_status prepare_fills(tas_step *step, int option) {
    int fill;
    tas_status status = fill_requested(step, option, &fill);
    if (status != TAS_OK || !fill) return status;
    const step_plan *plan = &step->plan;
    if (!plan->has_fills)
        return fail(&step->error, TAS_ERROR_FORMAT,
                    "%s lists no fills (metadata " STEP_PLAN_KEY " has no '" STEP_FILLS_KEY "'): export the step again to "
                    "run it with fill_uninitialized_memory", step->origin);
    step->fills_before = calloc(plan->operation_count + 1, sizeof *step->fills_before);
    if (step->fills_before == NULL) return fail(&step->error, TAS_ERROR_MEMORY, "out of memory");
    size_t next = 0;
    for (size_t i = 0; i <= plan->operation_count; i++) {
        while (next < plan->fill_count && plan->fills[next].before < i) next++;
        step->fills_before[i] = next;
    }
    return TAS_OK;
}

static tas_status create_queue(tas_step *step, int profile) {
    cl_int code = CL_SUCCESS;
    step->context = step->api.CreateContext(NULL, 1, &step->device.id, NULL, NULL, &code);
    if (step->context == NULL || code != CL_SUCCESS) return opencl_failure(step, code, "creating a context on", step->device.label);
    cl_command_queue_properties properties = profile ? CL_QUEUE_PROFILING_ENABLE : 0;
    step->queue = step->api.CreateCommandQueue(step->context, step->device.id, properties, &code);
    if (step->queue == NULL || code != CL_SUCCESS) return opencl_failure(step, code, "creating a queue on", step->device.label);
    step->profile = profile;
    return TAS_OK;
}

/* Opens the step file at `path`, or the `size` bytes at `bytes` (then `path` names them). */
static tas_status step_prepare(tas_step *step, const char *path, const void *bytes, size_t size,
                               const tas_open_options *options) {
    static const tas_open_options DEFAULTS = {NULL, NULL, NULL, 0, 0};
    if (options == NULL) options = &DEFAULTS;
    step->origin = copy_text(path, strlen(path));
    if (step->origin == NULL) return fail(&step->error, TAS_ERROR_MEMORY, "out of memory");
    tas_status status = bytes ? onnx_read_memory(bytes, size, path, &step->model, &step->error)
                              : onnx_read_file(path, &step->model, &step->error);
    /* The file's origin first (a foreign file is named as such), then its integrity: nothing of a
     * damaged file is parsed further, built or uploaded. */
    if (status == TAS_OK) status = plan_check_origin(&step->model, path, &step->error);
    if (status == TAS_OK) status = integrity_verify(&step->model, path, &step->error);
    if (status == TAS_OK) status = plan_read(&step->model, path, &step->plan, &step->error);
    uint64_t largest_state = 0;
    if (status == TAS_OK) status = read_state_layout(step, &largest_state);
    if (status != TAS_OK) return status;
    if ((status = opencl_load(&step->api, options->opencl_library, &step->error)) != TAS_OK) return status;
    if ((status = device_choose(&step->api, options->device, &step->device, &step->error)) != TAS_OK) return status;
    if ((status = device_check(&step->device, &step->plan, largest_state, &step->error)) != TAS_OK) return status;
    if ((status = create_queue(step, options->profile)) != TAS_OK) return status;
    if (options->cache_dir && (status = make_folders(options->cache_dir, &step->error)) != TAS_OK)
        return fail_context(&step->error, "the program cache");
    if ((status = allocate(step)) != TAS_OK) return status;
    if ((status = build_and_bind(step, options->cache_dir)) != TAS_OK) return status;
    if ((status = prepare_fills(step, options->fill_uninitialized_memory)) != TAS_OK) return status;
    step->training_operations = step->plan.operation_count - step->plan.prediction_operations;
    if (options->profile) {
        step->times = calloc(step->plan.operation_count + 1, sizeof *step->times);
        if (step->times == NULL) return fail(&step->error, TAS_ERROR_MEMORY, "out of memory");
    }
    return TAS_OK;
}

tas_status tas_step_open(const char *path, const tas_open_options *options, tas_step **out) {
    if (out == NULL) return TAS_ERROR_ARGUMENT;
    tas_step *step = calloc(1, sizeof *step);
    *out = step;
    if (step == NULL) return TAS_ERROR_MEMORY;
    if (path == NULL) return fail(&step->error, TAS_ERROR_ARGUMENT, "no step file given");
    return step_prepare(step, path, NULL, 0, options);
}

tas_status tas_step_open_memory(const void *bytes, size_t size, const char *origin, const tas_open_options *options,
                                tas_step **out) {
    if (out == NULL) return TAS_ERROR_ARGUMENT;
    tas_step *step = calloc(1, sizeof *step);
    *out = step;
    if (step == NULL) return TAS_ERROR_MEMORY;
    if (bytes == NULL || size == 0) return fail(&step->error, TAS_ERROR_FORMAT, "no step file bytes given (an empty file)");
    tas_status status = step_prepare(step, origin ? origin : "the step in memory", bytes, size, options);
    /* The initial values were uploaded: nothing may point into the caller's bytes after this call. */
    for (size_t i = 0; i < step->model.initializer_count; i++) step->model.initializers[i].raw = NULL;
    step->model.data = NULL;
    step->model.size = 0;
    return status;
}

void tas_step_close(tas_step *step) {
    if (step == NULL) return;
    opencl_api *api = &step->api;
    if (api->library != NULL) {
        step_recording_release(step);
        if (step->queue) api->Finish(step->queue);
        for (size_t i = 0; i < step->plan.operation_count && step->kernels; i++)
            if (step->kernels[i]) api->ReleaseKernel(step->kernels[i]);
        for (size_t i = 0; i < step->program_count; i++) api->ReleaseProgram(step->programs[i]);
        for (size_t i = 0; i < step->owned_count; i++) api->ReleaseMemObject(step->owned_buffers[i]);
        for (size_t i = 0; i < step->slot_buffer_count; i++) api->ReleaseMemObject(step->slot_buffers[i]);
        if (step->index_record) api->ReleaseMemObject(step->index_record);
        if (step->queue) api->ReleaseCommandQueue(step->queue);
        if (step->context) api->ReleaseContext(step->context);
    }
    free(step->kernels);
    free(step->programs);
    free(step->checking_launches);
    free(step->owned_buffers);
    free(step->slot_buffers);
    free(step->buffers);
    free(step->state);
    free(step->times);
    free(step->fills_before);
    device_free(&step->device);
    plan_free(&step->plan);
    onnx_free(&step->model);
    opencl_unload(api);
    free(step->origin);
    free(step);
}

const char *tas_step_error(const tas_step *step) {
    return step == NULL ? "out of memory" : step->error.message;
}
