/* The memory plan: the JSON of metadata torch_adreno.step (written by step_model of
 * torch_adreno/export/onnx_writer.py; laid out in torch_adreno/runner/format.py): memory identities,
 * slots, batch inputs, the loss and the prediction. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "step_plan.h"

/* Identities are small consecutive numbers in every export; a bound keeps a corrupted file from
 * asking for a huge lookup table. */
#define MAX_IDENTITY 10000000

typedef struct json_reading {
    const char *origin;
    error_record *error;
} json_reading;

static tas_status malformed(json_reading *reading, const char *format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static tas_status malformed(json_reading *reading, const char *format, ...) {
    char detail[512];
    va_list arguments;
    va_start(arguments, format);
    vsnprintf(detail, sizeof detail, format, arguments);
    va_end(arguments);
    return fail(reading->error, TAS_ERROR_FORMAT,
                "the step plan of %s (metadata " STEP_PLAN_KEY ") is malformed: %s; export the step again",
                reading->origin, detail);
}

static int integer_value(const cJSON *item, int64_t minimum, int64_t maximum, int64_t *out) {
    if (!cJSON_IsNumber(item)) return 0;
    double value = item->valuedouble;
    if (!(value >= (double)minimum && value <= (double)maximum) || floor(value) != value) return 0;
    *out = (int64_t)value;
    return 1;
}

static int get_integer(const cJSON *object, const char *key, int64_t minimum, int64_t maximum, int64_t *out) {
    return integer_value(cJSON_GetObjectItemCaseSensitive(object, key), minimum, maximum, out);
}

static const char *get_string(const cJSON *object, const char *key) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(object, key);
    return cJSON_IsString(item) ? item->valuestring : NULL;
}

/* A JSON list of at most TAS_MAX_RANK integers >= minimum. */
static int integer_list(const cJSON *list, int64_t minimum, int64_t *values, int *count) {
    if (!cJSON_IsArray(list)) return 0;
    int n = cJSON_GetArraySize(list);
    if (n > TAS_MAX_RANK) return 0;
    for (int i = 0; i < n; i++)
        if (!integer_value(cJSON_GetArrayItem(list, i), minimum, INT64_C(1) << 53, &values[i])) return 0;
    *count = n;
    return 1;
}

/* {"identity", "dtype", "shape"} (the loss, the prediction's output), or a batch input. */
static tas_status read_tensor(json_reading *reading, const cJSON *object, const char *what, int with_identity,
                              tensor_spec *spec) {
    if (!cJSON_IsObject(object)) return malformed(reading, "%s is not an object", what);
    if (with_identity && !get_integer(object, "identity", 0, MAX_IDENTITY, &spec->identity))
        return malformed(reading, "%s has no identity", what);
    const char *dtype = get_string(object, "dtype");
    if (dtype == NULL || !dtype_from_name(dtype, &spec->dtype))
        return malformed(reading, "%s has no dtype of float32, int64, int32, bool or uint8", what);
    if (!integer_list(cJSON_GetObjectItemCaseSensitive(object, "shape"), 0, spec->shape, &spec->rank))
        return malformed(reading, "%s has no shape of at most 8 sizes", what);
    if (!shape_elements(spec->shape, spec->rank, &spec->elements) ||
        !multiply_size(spec->elements, dtype_size(spec->dtype), &spec->bytes))
        return malformed(reading, "%s is too large", what);
    return TAS_OK;
}

static tas_status read_batch_inputs(json_reading *reading, const cJSON *list, step_plan *plan) {
    if (!cJSON_IsArray(list)) return malformed(reading, "%s is not a list", "batch");
    int count = cJSON_GetArraySize(list);
    plan->batch = calloc((size_t)count + 1, sizeof *plan->batch);
    if (plan->batch == NULL) return fail(reading->error, TAS_ERROR_MEMORY, "out of memory");
    for (int i = 0; i < count; i++) {
        const cJSON *entry = cJSON_GetArrayItem(list, i);
        tensor_spec *spec = &plan->batch[plan->batch_count];
        tas_status status = read_tensor(reading, entry, "a batch input", 0, spec);
        if (status != TAS_OK) return status;
        int64_t position;
        const char *name = get_string(entry, "input");
        if (name == NULL || !get_integer(entry, "position", 0, 1 << 20, &position))
            return malformed(reading, "%s %lld has no input name or position", "batch input", (long long)i);
        spec->position = (int)position;
        spec->name = copy_text(name, strlen(name));
        if (spec->name == NULL) return fail(reading->error, TAS_ERROR_MEMORY, "out of memory");
        plan->batch_count += 1;
    }
    return TAS_OK;
}

static tas_status read_view(json_reading *reading, const cJSON *view, plan_identity *identity) {
    if (cJSON_IsNull(view) || view == NULL) return TAS_OK;
    int shape_rank = 0, stride_rank = 0;
    if (!cJSON_IsArray(view) || cJSON_GetArraySize(view) != 3 ||
        !integer_list(cJSON_GetArrayItem(view, 0), 0, identity->view.shape, &shape_rank) ||
        !integer_list(cJSON_GetArrayItem(view, 1), 0, identity->view.stride, &stride_rank) ||
        shape_rank != stride_rank || !integer_value(cJSON_GetArrayItem(view, 2), 0, INT64_C(1) << 53, &identity->view.offset))
        return malformed(reading, "the view of %s %lld is not [shape, stride, offset]", "identity",
                         (long long)identity->index);
    identity->view.rank = shape_rank;
    identity->has_view = 1;
    return TAS_OK;
}

static tas_status read_identity(json_reading *reading, const cJSON *entry, step_plan *plan, plan_identity *identity) {
    identity->slot = -1;
    if (!cJSON_IsObject(entry) || !get_integer(entry, "index", 0, MAX_IDENTITY, &identity->index))
        return malformed(reading, "%s %lld has no index below 10000000", "identity", (long long)plan->identity_count);
    long long index = (long long)identity->index;
    int64_t nbytes;
    if (!get_integer(entry, "nbytes", 0, INT64_C(1) << 53, &nbytes))
        return malformed(reading, "%s %lld has no nbytes", "identity", index);
    identity->nbytes = (uint64_t)nbytes;
    const char *kind = get_string(entry, "kind");
    const char *program = get_string(entry, "program");
    identity->for_prediction = program != NULL && strcmp(program, "predict") == 0;
    if (kind != NULL && strcmp(kind, "internal") == 0) {
        identity->kind = MEMORY_INTERNAL;
        const cJSON *slot = cJSON_GetObjectItemCaseSensitive(entry, "slot");
        if (slot != NULL && !cJSON_IsNull(slot) && !integer_value(slot, 0, (int64_t)plan->slot_count - 1, &identity->slot))
            return malformed(reading, "%s %lld names a slot the plan does not have", "identity", index);
    } else if (kind != NULL && strcmp(kind, "persistent") == 0) {
        identity->kind = MEMORY_PERSISTENT;
        const char *input = get_string(entry, "input");
        if (input == NULL) return malformed(reading, "%s %lld (persistent) names no input", "identity", index);
        identity->input = copy_text(input, strlen(input));
        if (identity->input == NULL) return fail(reading->error, TAS_ERROR_MEMORY, "out of memory");
    } else if (kind != NULL && strcmp(kind, "batch") == 0) {
        identity->kind = MEMORY_BATCH;
        int64_t position;
        if (!get_integer(entry, "position", 0, 1 << 20, &position))
            return malformed(reading, "%s %lld (batch) has no position", "identity", index);
        size_t found = plan->batch_count;
        for (size_t i = 0; i < plan->batch_count; i++)
            if (plan->batch[i].position == position) found = i;
        if (found == plan->batch_count)
            return malformed(reading, "%s %lld reads a batch argument the step does not take", "identity", index);
        identity->batch = found;
        tas_status status = read_view(reading, cJSON_GetObjectItemCaseSensitive(entry, "view"), identity);
        if (status != TAS_OK) return status;
    } else {
        return fail(reading->error, TAS_ERROR_FORMAT,
                    "%s has memory of kind '%s' (identity %lld), which this runtime cannot provide; it knows internal, "
                    "persistent and batch memory: a newer export? update torch_adreno's native runtime",
                    reading->origin, kind ? kind : "(none)", index);
    }
    return TAS_OK;
}

/* A batch identity's elements must lie inside its input, and fit its buffer. */
static tas_status check_batch_identity(json_reading *reading, const step_plan *plan, const plan_identity *identity) {
    const tensor_spec *input = &plan->batch[identity->batch];
    size_t elements = input->elements;
    if (identity->has_view) {
        const batch_view *view = &identity->view;
        size_t count;
        if (!shape_elements(view->shape, view->rank, &count))
            return malformed(reading, "the view of %s %lld is too large", "identity", (long long)identity->index);
        if (count > 0) {
            /* the furthest element the view reaches (strides are >= 0) */
            int64_t last = view->offset;
            for (int d = 0; d < view->rank; d++) {
                if (view->shape[d] > 0 && view->stride[d] > (INT64_C(1) << 53) / view->shape[d])
                    return malformed(reading, "the view of %s %lld is too large", "identity", (long long)identity->index);
                last += (view->shape[d] - 1) * view->stride[d];
            }
            if ((uint64_t)last >= elements)
                return malformed(reading, "the view of %s %lld reaches past its batch input", "identity",
                                 (long long)identity->index);
        }
        elements = count;
    }
    if ((uint64_t)elements * dtype_size(input->dtype) > identity->nbytes)
        return malformed(reading, "%s %lld is smaller than the batch it holds", "identity", (long long)identity->index);
    return TAS_OK;
}

static tas_status read_identities(json_reading *reading, const cJSON *list, step_plan *plan) {
    if (!cJSON_IsArray(list)) return malformed(reading, "%s is not a list", "identities");
    int count = cJSON_GetArraySize(list);
    plan->identities = calloc((size_t)count + 1, sizeof *plan->identities);
    if (plan->identities == NULL) return fail(reading->error, TAS_ERROR_MEMORY, "out of memory");
    int64_t largest = -1;
    for (int i = 0; i < count; i++) {
        plan_identity *identity = &plan->identities[plan->identity_count];
        tas_status status = read_identity(reading, cJSON_GetArrayItem(list, i), plan, identity);
        plan->identity_count += 1; /* (counted even on failure: plan_free releases its input) */
        if (status != TAS_OK) return status;
        if (identity->kind == MEMORY_BATCH && (status = check_batch_identity(reading, plan, identity)) != TAS_OK)
            return status;
        if (identity->index > largest) largest = identity->index;
    }
    plan->identity_range = (size_t)(largest + 1);
    plan->identity_at = malloc((plan->identity_range + 1) * sizeof *plan->identity_at);
    if (plan->identity_at == NULL) return fail(reading->error, TAS_ERROR_MEMORY, "out of memory");
    for (size_t i = 0; i < plan->identity_range; i++) plan->identity_at[i] = -1;
    for (size_t i = 0; i < plan->identity_count; i++) {
        int64_t index = plan->identities[i].index;
        if (plan->identity_at[index] != -1)
            return malformed(reading, "%s %lld is listed twice", "identity", (long long)index);
        plan->identity_at[index] = (int64_t)i;
    }
    return TAS_OK;
}

static tas_status read_slots(json_reading *reading, const cJSON *list, step_plan *plan) {
    if (!cJSON_IsArray(list)) return malformed(reading, "%s is not a list", "slots");
    int count = cJSON_GetArraySize(list);
    plan->slots = calloc((size_t)count + 1, sizeof *plan->slots);
    if (plan->slots == NULL) return fail(reading->error, TAS_ERROR_MEMORY, "out of memory");
    for (int i = 0; i < count; i++) {
        int64_t bytes;
        if (!integer_value(cJSON_GetArrayItem(list, i), 0, INT64_C(1) << 53, &bytes))
            return malformed(reading, "%s %lld is not a size in bytes", "slot", (long long)i);
        plan->slots[i] = (uint64_t)bytes;
    }
    plan->slot_count = (size_t)count;
    return TAS_OK;
}

static tas_status read_outputs(json_reading *reading, const cJSON *root, step_plan *plan) {
    tas_status status = read_tensor(reading, cJSON_GetObjectItemCaseSensitive(root, "loss"), "loss", 1, &plan->loss);
    if (status != TAS_OK) return status;
    if (plan->loss.dtype != TAS_FLOAT32 || plan->loss.elements != 1)
        return fail(reading->error, TAS_ERROR_FORMAT,
                    "%s has a loss of %s with %zu elements; this runtime reads one float32 loss per step",
                    reading->origin, dtype_name(plan->loss.dtype), plan->loss.elements);
    const cJSON *predict = cJSON_GetObjectItemCaseSensitive(root, "predict");
    if (predict == NULL || cJSON_IsNull(predict)) return TAS_OK;
    int64_t operations;
    if (!get_integer(predict, "operations", 0, INT64_C(1) << 31, &operations))
        return malformed(reading, "%s has no operation count", "predict");
    plan->has_prediction = 1;
    plan->prediction_operations = (size_t)operations;
    return read_tensor(reading, cJSON_GetObjectItemCaseSensitive(predict, "output"), "the prediction's output", 1,
                       &plan->prediction);
}

/* [before, identity, offset, nbytes] each: an internal identity placed in a slot, inside the slot,
 * at an even offset, in operation order (the operation count is checked once the nodes are read). */
static tas_status read_fills(json_reading *reading, const cJSON *list, step_plan *plan) {
    if (list == NULL) return TAS_OK;
    if (!cJSON_IsArray(list)) return malformed(reading, "%s is not a list", STEP_FILLS_KEY);
    int count = cJSON_GetArraySize(list);
    plan->fills = calloc((size_t)count + 1, sizeof *plan->fills);
    if (plan->fills == NULL) return fail(reading->error, TAS_ERROR_MEMORY, "out of memory");
    plan->has_fills = 1;
    for (int i = 0; i < count; i++) {
        const cJSON *entry = cJSON_GetArrayItem(list, i);
        int64_t before, identity, offset, nbytes;
        if (!cJSON_IsArray(entry) || cJSON_GetArraySize(entry) != 4 ||
            !integer_value(cJSON_GetArrayItem(entry, 0), 0, INT64_C(1) << 31, &before) ||
            !integer_value(cJSON_GetArrayItem(entry, 1), 0, MAX_IDENTITY, &identity) ||
            !integer_value(cJSON_GetArrayItem(entry, 2), 0, INT64_C(1) << 53, &offset) ||
            !integer_value(cJSON_GetArrayItem(entry, 3), 0, INT64_C(1) << 53, &nbytes))
            return malformed(reading, "fill %d is not [before, identity, offset, nbytes]", i);
        const plan_identity *filled = plan_identity_of(plan, identity);
        if (filled == NULL || filled->kind != MEMORY_INTERNAL || filled->slot < 0 || offset % 2 ||
            (uint64_t)(offset + nbytes) > plan->slots[filled->slot])
            return malformed(reading, "fill %d is not inside the slot of an internal identity", i);
        if (i > 0 && (size_t)before < plan->fills[i - 1].before)
            return malformed(reading, "fill %d comes before the fill ahead of it", i);
        plan->fills[i] = (plan_fill){(size_t)before, identity, (uint64_t)offset, (uint64_t)nbytes};
        plan->fill_count += 1;
    }
    return TAS_OK;
}

tas_status plan_read_memory(const char *json, const char *origin, step_plan *plan, error_record *error) {
    json_reading reading = {origin, error};
    cJSON *root = cJSON_Parse(json);
    if (root == NULL || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return fail(error, TAS_ERROR_FORMAT,
                    "the step plan of %s (metadata " STEP_PLAN_KEY ") is not a JSON object: corrupted? export the "
                    "step again", origin);
    }
    tas_status status = read_slots(&reading, cJSON_GetObjectItemCaseSensitive(root, "slots"), plan);
    if (status == TAS_OK) status = read_batch_inputs(&reading, cJSON_GetObjectItemCaseSensitive(root, "batch"), plan);
    if (status == TAS_OK) status = read_identities(&reading, cJSON_GetObjectItemCaseSensitive(root, "identities"), plan);
    if (status == TAS_OK) status = read_outputs(&reading, root, plan);
    if (status == TAS_OK) status = read_fills(&reading, cJSON_GetObjectItemCaseSensitive(root, STEP_FILLS_KEY), plan);
    cJSON_Delete(root);
    return status;
}

const plan_identity *plan_identity_of(const step_plan *plan, int64_t index) {
    if (index < 0 || (uint64_t)index >= plan->identity_range || plan->identity_at[index] < 0) return NULL;
    return &plan->identities[plan->identity_at[index]];
}
