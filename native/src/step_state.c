/* The state of an open step: read, written, saved to and loaded from safetensors; and the device
 * list, which needs no step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"
#include "step_runtime.h"

static tas_status find_state(tas_step *step, const char *name, state_tensor **out) {
    if (step->queue == NULL)
        return fail(&step->error, TAS_ERROR_ARGUMENT, "the step did not open (%s)", step->error.message);
    if (name == NULL) return fail(&step->error, TAS_ERROR_ARGUMENT, "no state name given");
    for (size_t i = 0; i < step->state_count; i++)
        if (strcmp(step->state[i].name, name) == 0) {
            *out = &step->state[i];
            return TAS_OK;
        }
    return fail(&step->error, TAS_ERROR_ARGUMENT,
                "the step has no state tensor %s (tas_step_state_info lists its %zu state tensors)", name,
                step->state_count);
}

size_t tas_step_state_count(const tas_step *step) {
    return step != NULL && step->queue != NULL ? step->state_count : 0;
}

tas_status tas_step_state_info(tas_step *step, size_t index, tas_tensor_info *info) {
    if (step == NULL || info == NULL) return TAS_ERROR_ARGUMENT;
    if (index >= tas_step_state_count(step))
        return fail(&step->error, TAS_ERROR_ARGUMENT, "state tensor %zu: the step has %zu", index,
                    tas_step_state_count(step));
    const state_tensor *state = &step->state[index];
    info->name = state->name;
    info->dtype = state->dtype;
    info->rank = state->rank;
    memcpy(info->shape, state->shape, sizeof info->shape);
    info->bytes = state->bytes;
    return TAS_OK;
}

static tas_status check_size(tas_step *step, const state_tensor *state, const void *data, size_t bytes) {
    if (bytes != state->bytes || (data == NULL && bytes))
        return fail(&step->error, TAS_ERROR_ARGUMENT, "state tensor %s is %s with %zu bytes; %zu bytes given",
                    state->name, dtype_name(state->dtype), state->bytes, bytes);
    return TAS_OK;
}

tas_status tas_step_read_state(tas_step *step, const char *name, void *data, size_t bytes) {
    if (step == NULL) return TAS_ERROR_ARGUMENT;
    state_tensor *state;
    tas_status status = find_state(step, name, &state);
    if (status == TAS_OK) status = check_size(step, state, data, bytes);
    if (status != TAS_OK || bytes == 0) return status;
    cl_int code = step->api.EnqueueReadBuffer(step->queue, step->buffers[state->identity].buffer, CL_TRUE, 0, bytes,
                                              data, 0, NULL, NULL);
    return code == CL_SUCCESS ? TAS_OK : opencl_failure(step, code, "reading state tensor", name);
}

tas_status tas_step_write_state(tas_step *step, const char *name, const void *data, size_t bytes) {
    if (step == NULL) return TAS_ERROR_ARGUMENT;
    state_tensor *state;
    tas_status status = find_state(step, name, &state);
    if (status == TAS_OK) status = check_size(step, state, data, bytes);
    if (status != TAS_OK || bytes == 0) return status;
    cl_int code = step->api.EnqueueWriteBuffer(step->queue, step->buffers[state->identity].buffer, CL_TRUE, 0, bytes,
                                               data, 0, NULL, NULL);
    return code == CL_SUCCESS ? TAS_OK : opencl_failure(step, code, "writing state tensor", name);
}

tas_status tas_step_set_scalar(tas_step *step, const char *name, double value) {
    if (step == NULL) return TAS_ERROR_ARGUMENT;
    state_tensor *state;
    tas_status status = find_state(step, name, &state);
    if (status != TAS_OK) return status;
    if (state->bytes != dtype_size(state->dtype))
        return fail(&step->error, TAS_ERROR_ARGUMENT, "state tensor %s holds %zu elements, not one",
                    name, state->bytes / dtype_size(state->dtype));
    union { float f32; int64_t i64; int32_t i32; uint8_t u8; } converted;
    switch (state->dtype) {
    case TAS_FLOAT32: converted.f32 = (float)value; break;
    case TAS_INT64: converted.i64 = (int64_t)value; break;
    case TAS_INT32: converted.i32 = (int32_t)value; break;
    default: converted.u8 = (uint8_t)(value != 0 && state->dtype == TAS_BOOL ? 1 : (uint8_t)value); break;
    }
    return tas_step_write_state(step, name, &converted, state->bytes);
}

static tas_status read_for_saving(void *context, size_t index, void *buffer, error_record *error) {
    tas_step *step = context;
    const state_tensor *state = &step->state[index];
    tas_status status = tas_step_read_state(step, state->name, buffer, state->bytes);
    if (status != TAS_OK && error != &step->error) *error = step->error;
    return status;
}

tas_status tas_step_save_state(tas_step *step, const char *path) {
    if (step == NULL) return TAS_ERROR_ARGUMENT;
    if (step->queue == NULL) return fail(&step->error, TAS_ERROR_ARGUMENT, "the step did not open");
    if (path == NULL) return fail(&step->error, TAS_ERROR_ARGUMENT, "no file name given");
    safetensor_output *outputs = calloc(step->state_count + 1, sizeof *outputs);
    if (outputs == NULL) return fail(&step->error, TAS_ERROR_MEMORY, "out of memory");
    for (size_t i = 0; i < step->state_count; i++) {
        const state_tensor *state = &step->state[i];
        outputs[i] = (safetensor_output){state->name, state->dtype, state->rank, state->shape, state->bytes};
    }
    tas_status status = safetensors_write(path, outputs, step->state_count, read_for_saving, step, &step->error);
    free(outputs);
    return status;
}

tas_status tas_step_load_state(tas_step *step, const char *path) {
    if (step == NULL) return TAS_ERROR_ARGUMENT;
    if (step->queue == NULL) return fail(&step->error, TAS_ERROR_ARGUMENT, "the step did not open");
    if (path == NULL) return fail(&step->error, TAS_ERROR_ARGUMENT, "no file name given");
    safetensors_file file;
    tas_status status = safetensors_read_file(path, &file, &step->error);
    /* every tensor is checked before any is written: a bad file changes nothing */
    for (size_t i = 0; i < file.count && status == TAS_OK; i++) {
        const safetensor *tensor = &file.tensors[i];
        state_tensor *state;
        status = find_state(step, tensor->name, &state);
        if (status != TAS_OK) {
            fail_context(&step->error, "%s", path);
            break;
        }
        int same = tensor->dtype == state->dtype && tensor->rank == state->rank;
        for (int d = 0; same && d < state->rank; d++) same = tensor->shape[d] == state->shape[d];
        if (!same)
            status = fail(&step->error, TAS_ERROR_FORMAT, "%s: tensor %s is %s of rank %d; the step's is %s of rank %d "
                          "(or their shapes differ)", path, tensor->name, dtype_name(tensor->dtype), tensor->rank,
                          dtype_name(state->dtype), state->rank);
    }
    for (size_t i = 0; i < file.count && status == TAS_OK; i++)
        status = tas_step_write_state(step, file.tensors[i].name, file.tensors[i].data, file.tensors[i].bytes);
    safetensors_free(&file);
    return status;
}

tas_status tas_list_devices(const char *opencl_library, tas_device_info *devices, size_t capacity, size_t *count,
                            char *message, size_t message_size) {
    error_record error = {TAS_OK, ""};
    opencl_api api;
    opencl_device *found = NULL;
    size_t found_count = 0;
    tas_status status = count == NULL || (devices == NULL && capacity)
                            ? fail(&error, TAS_ERROR_ARGUMENT, "no place for the devices given")
                            : opencl_load(&api, opencl_library, &error);
    if (status == TAS_OK) status = device_list(&api, &found, &found_count, &error);
    if (status == TAS_OK) {
        *count = found_count;
        for (size_t i = 0; i < found_count && i < capacity; i++) devices[i] = found[i].info;
        device_list_free(found, found_count);
    }
    if (message != NULL && message_size) snprintf(message, message_size, "%s", error.message);
    return status;
}
