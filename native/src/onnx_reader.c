#include "onnx_reader.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <pb_decode.h>

#include "onnx.pb.h"

/* What the nanopb callbacks share: the model being filled and the first problem they met (nanopb
 * only says that a callback failed, so the reason is kept here). */
typedef struct decoding {
    onnx_model *model;
    error_record *error;
    int failed;
    const uint8_t *start, *end; /* the buffer being decoded, to check pointers into it */
} decoding;

static bool callback_failure(decoding *context, tas_status status, const char *what) {
    if (!context->failed) fail(context->error, status, "%s", what);
    context->failed = 1;
    return false;
}

/* Reads a whole length-delimited field as a NUL-terminated string, replacing *out (protobuf's
 * rule for a singular field given twice: the last one wins). */
static bool read_text(pb_istream_t *stream, decoding *context, char **out) {
    size_t length = stream->bytes_left;
    char *text = malloc(length + 1);
    if (text == NULL) return callback_failure(context, TAS_ERROR_MEMORY, "out of memory reading the step file");
    if (!pb_read(stream, (pb_byte_t *)text, length)) {
        free(text);
        return false;
    }
    text[length] = '\0';
    free(*out);
    *out = text;
    return true;
}

static bool append_text(pb_istream_t *stream, decoding *context, text_list *list) {
    char *text = NULL;
    if (!read_text(stream, context, &text)) return false;
    if (!append_item((void **)&list->items, &list->count, &list->capacity, &text, sizeof text)) {
        free(text);
        return callback_failure(context, TAS_ERROR_MEMORY, "out of memory reading the step file");
    }
    return true;
}

/* -- node attributes ---------------------------------------------------------------------- */

typedef struct attribute_target {
    decoding *context;
    onnx_attribute *attribute;
} attribute_target;

static bool decode_attribute_name(pb_istream_t *stream, const pb_field_t *field, void **arg) {
    (void)field;
    attribute_target *target = *arg;
    return read_text(stream, target->context, &target->attribute->name);
}

static bool decode_attribute_s(pb_istream_t *stream, const pb_field_t *field, void **arg) {
    (void)field;
    attribute_target *target = *arg;
    return read_text(stream, target->context, &target->attribute->s);
}

static bool decode_attribute_ints(pb_istream_t *stream, const pb_field_t *field, void **arg) {
    (void)field;
    attribute_target *target = *arg;
    uint64_t value;
    if (!pb_decode_varint(stream, &value)) return false;
    int64_t signed_value = (int64_t)value;
    int_list *ints = &target->attribute->ints;
    if (!append_item((void **)&ints->items, &ints->count, &ints->capacity, &signed_value, sizeof signed_value))
        return callback_failure(target->context, TAS_ERROR_MEMORY, "out of memory reading the step file");
    return true;
}

static bool decode_attribute_strings(pb_istream_t *stream, const pb_field_t *field, void **arg) {
    (void)field;
    attribute_target *target = *arg;
    return append_text(stream, target->context, &target->attribute->strings);
}

static void free_attribute(onnx_attribute *attribute) {
    free(attribute->name);
    free(attribute->s);
    free(attribute->ints.items);
    for (size_t i = 0; i < attribute->strings.count; i++) free(attribute->strings.items[i]);
    free(attribute->strings.items);
}

typedef struct node_target {
    decoding *context;
    onnx_node *node;
} node_target;

static bool decode_attribute(pb_istream_t *stream, const pb_field_t *field, void **arg) {
    (void)field;
    node_target *target = *arg;
    onnx_attribute attribute;
    memset(&attribute, 0, sizeof attribute);
    attribute_target into = {target->context, &attribute};
    onnx_AttributeProto message = onnx_AttributeProto_init_zero;
    message.name.funcs.decode = decode_attribute_name;
    message.name.arg = &into;
    message.s.funcs.decode = decode_attribute_s;
    message.s.arg = &into;
    message.ints.funcs.decode = decode_attribute_ints;
    message.ints.arg = &into;
    message.strings.funcs.decode = decode_attribute_strings;
    message.strings.arg = &into;
    if (!pb_decode(stream, onnx_AttributeProto_fields, &message)) {
        free_attribute(&attribute);
        return false;
    }
    attribute.type = message.has_type ? (int)message.type : 0;
    attribute.i = message.i;
    onnx_node *node = target->node;
    if (!append_item((void **)&node->attributes, &node->attribute_count, &node->attribute_capacity, &attribute,
                     sizeof attribute)) {
        free_attribute(&attribute);
        return callback_failure(target->context, TAS_ERROR_MEMORY, "out of memory reading the step file");
    }
    return true;
}

static bool decode_node_name(pb_istream_t *stream, const pb_field_t *field, void **arg) {
    (void)field;
    node_target *target = *arg;
    return read_text(stream, target->context, &target->node->name);
}

static bool decode_node_op_type(pb_istream_t *stream, const pb_field_t *field, void **arg) {
    (void)field;
    node_target *target = *arg;
    return read_text(stream, target->context, &target->node->op_type);
}

static bool decode_node_domain(pb_istream_t *stream, const pb_field_t *field, void **arg) {
    (void)field;
    node_target *target = *arg;
    return read_text(stream, target->context, &target->node->domain);
}

static void free_node(onnx_node *node) {
    free(node->name);
    free(node->op_type);
    free(node->domain);
    for (size_t i = 0; i < node->attribute_count; i++) free_attribute(&node->attributes[i]);
    free(node->attributes);
}

static bool decode_node(pb_istream_t *stream, const pb_field_t *field, void **arg) {
    (void)field;
    decoding *context = *arg;
    onnx_node node;
    memset(&node, 0, sizeof node);
    node_target into = {context, &node};
    onnx_NodeProto message = onnx_NodeProto_init_zero;
    message.name.funcs.decode = decode_node_name;
    message.name.arg = &into;
    message.op_type.funcs.decode = decode_node_op_type;
    message.op_type.arg = &into;
    message.domain.funcs.decode = decode_node_domain;
    message.domain.arg = &into;
    message.attribute.funcs.decode = decode_attribute;
    message.attribute.arg = &into;
    if (!pb_decode(stream, onnx_NodeProto_fields, &message)) {
        free_node(&node);
        return false;
    }
    onnx_model *model = context->model;
    if (!append_item((void **)&model->nodes, &model->node_count, &model->node_capacity, &node, sizeof node)) {
        free_node(&node);
        return callback_failure(context, TAS_ERROR_MEMORY, "out of memory reading the step file");
    }
    return true;
}

/* -- initializers ------------------------------------------------------------------------- */

typedef struct tensor_target {
    decoding *context;
    onnx_initializer *tensor;
} tensor_target;

static bool decode_tensor_name(pb_istream_t *stream, const pb_field_t *field, void **arg) {
    (void)field;
    tensor_target *target = *arg;
    return read_text(stream, target->context, &target->tensor->name);
}

static bool decode_tensor_dims(pb_istream_t *stream, const pb_field_t *field, void **arg) {
    (void)field;
    tensor_target *target = *arg;
    uint64_t value;
    if (!pb_decode_varint(stream, &value)) return false;
    onnx_initializer *tensor = target->tensor;
    if (tensor->rank == TAS_MAX_RANK)
        return callback_failure(target->context, TAS_ERROR_FORMAT,
                                "an initializer has more dimensions than this runtime supports (8)");
    tensor->dims[tensor->rank++] = (int64_t)value;
    return true;
}

/* The raw bytes stay in the mapped file: remember where, and step over them. */
static bool decode_tensor_raw(pb_istream_t *stream, const pb_field_t *field, void **arg) {
    (void)field;
    tensor_target *target = *arg;
    /* A buffer stream's state is its read position (pb_istream_from_buffer). */
    const uint8_t *at = stream->state;
    size_t length = stream->bytes_left;
    if (at < target->context->start || at > target->context->end || length > (size_t)(target->context->end - at))
        return callback_failure(target->context, TAS_ERROR_FORMAT, "an initializer's raw_data lies outside the file");
    onnx_initializer *tensor = target->tensor;
    tensor->storage = STORAGE_RAW;
    tensor->raw = at;
    tensor->raw_length = length;
    return pb_read(stream, NULL, length);
}

/* float_data, int32_data and int64_data (packed or not): one value per call. */
static bool append_value(tensor_target *target, tensor_storage storage, const void *value, size_t size) {
    onnx_initializer *tensor = target->tensor;
    if (tensor->storage != storage && tensor->storage != STORAGE_NONE)
        return callback_failure(target->context, TAS_ERROR_FORMAT,
                                "an initializer holds its values in two kinds of field at once");
    tensor->storage = storage;
    if (!append_item(&tensor->values, &tensor->value_count, &tensor->value_capacity, value, size))
        return callback_failure(target->context, TAS_ERROR_MEMORY, "out of memory reading the step file");
    return true;
}

static bool decode_tensor_floats(pb_istream_t *stream, const pb_field_t *field, void **arg) {
    (void)field;
    float value;
    if (!pb_decode_fixed32(stream, &value)) return false;
    return append_value(*arg, STORAGE_FLOATS, &value, sizeof value);
}

static bool decode_tensor_int32s(pb_istream_t *stream, const pb_field_t *field, void **arg) {
    (void)field;
    uint64_t raw;
    if (!pb_decode_varint(stream, &raw)) return false;
    int32_t value = (int32_t)(int64_t)raw;
    return append_value(*arg, STORAGE_INT32S, &value, sizeof value);
}

static bool decode_tensor_int64s(pb_istream_t *stream, const pb_field_t *field, void **arg) {
    (void)field;
    uint64_t raw;
    if (!pb_decode_varint(stream, &raw)) return false;
    int64_t value = (int64_t)raw;
    return append_value(*arg, STORAGE_INT64S, &value, sizeof value);
}

static void free_initializer(onnx_initializer *tensor) {
    free(tensor->name);
    free(tensor->values);
}

static bool decode_initializer(pb_istream_t *stream, const pb_field_t *field, void **arg) {
    (void)field;
    decoding *context = *arg;
    onnx_initializer tensor;
    memset(&tensor, 0, sizeof tensor);
    tensor_target into = {context, &tensor};
    onnx_TensorProto message = onnx_TensorProto_init_zero;
    message.name.funcs.decode = decode_tensor_name;
    message.dims.funcs.decode = decode_tensor_dims;
    message.raw_data.funcs.decode = decode_tensor_raw;
    message.float_data.funcs.decode = decode_tensor_floats;
    message.int32_data.funcs.decode = decode_tensor_int32s;
    message.int64_data.funcs.decode = decode_tensor_int64s;
    message.name.arg = message.dims.arg = message.raw_data.arg = &into;
    message.float_data.arg = message.int32_data.arg = message.int64_data.arg = &into;
    if (!pb_decode(stream, onnx_TensorProto_fields, &message)) {
        free_initializer(&tensor);
        return false;
    }
    tensor.data_type = message.has_data_type ? message.data_type : 0;
    tensor.external = message.has_data_location && message.data_location == onnx_TensorProto_DataLocation_EXTERNAL;
    onnx_model *model = context->model;
    if (!append_item((void **)&model->initializers, &model->initializer_count, &model->initializer_capacity, &tensor,
                     sizeof tensor)) {
        free_initializer(&tensor);
        return callback_failure(context, TAS_ERROR_MEMORY, "out of memory reading the step file");
    }
    return true;
}

/* -- the model ---------------------------------------------------------------------------- */

typedef struct pair_target {
    decoding *context;
    char *key, *value;
} pair_target;

static bool decode_pair_key(pb_istream_t *stream, const pb_field_t *field, void **arg) {
    (void)field;
    pair_target *target = *arg;
    return read_text(stream, target->context, &target->key);
}

static bool decode_pair_value(pb_istream_t *stream, const pb_field_t *field, void **arg) {
    (void)field;
    pair_target *target = *arg;
    return read_text(stream, target->context, &target->value);
}

static bool decode_metadata(pb_istream_t *stream, const pb_field_t *field, void **arg) {
    (void)field;
    decoding *context = *arg;
    pair_target pair = {context, NULL, NULL};
    onnx_StringStringEntryProto message = onnx_StringStringEntryProto_init_zero;
    message.key.funcs.decode = decode_pair_key;
    message.value.funcs.decode = decode_pair_value;
    message.key.arg = message.value.arg = &pair;
    onnx_model *model = context->model;
    bool decoded = pb_decode(stream, onnx_StringStringEntryProto_fields, &message);
    if (decoded && pair.key == NULL) pair.key = copy_text("", 0);
    if (decoded && pair.value == NULL) pair.value = copy_text("", 0);
    if (decoded && (pair.key == NULL || pair.value == NULL))
        decoded = callback_failure(context, TAS_ERROR_MEMORY, "out of memory reading the step file");
    /* keys and values stay in step: both appended or neither */
    if (decoded && append_item((void **)&model->metadata_keys.items, &model->metadata_keys.count,
                               &model->metadata_keys.capacity, &pair.key, sizeof pair.key)) {
        if (append_item((void **)&model->metadata_values.items, &model->metadata_values.count,
                        &model->metadata_values.capacity, &pair.value, sizeof pair.value))
            return true;
        model->metadata_keys.count -= 1;
        decoded = callback_failure(context, TAS_ERROR_MEMORY, "out of memory reading the step file");
    } else if (decoded) {
        decoded = callback_failure(context, TAS_ERROR_MEMORY, "out of memory reading the step file");
    }
    free(pair.key);
    free(pair.value);
    return decoded;
}

static bool decode_producer(pb_istream_t *stream, const pb_field_t *field, void **arg) {
    (void)field;
    decoding *context = *arg;
    return read_text(stream, context, &context->model->producer);
}

typedef struct function_target {
    decoding *context;
    onnx_function_name *function;
} function_target;

static bool decode_function_name(pb_istream_t *stream, const pb_field_t *field, void **arg) {
    (void)field;
    function_target *target = *arg;
    return read_text(stream, target->context, &target->function->name);
}

static bool decode_function_domain(pb_istream_t *stream, const pb_field_t *field, void **arg) {
    (void)field;
    function_target *target = *arg;
    return read_text(stream, target->context, &target->function->domain);
}

/* Only a function's name and domain: the runner runs the kernels, not the functions' bodies. */
static bool decode_function(pb_istream_t *stream, const pb_field_t *field, void **arg) {
    (void)field;
    decoding *context = *arg;
    onnx_function_name function = {NULL, NULL};
    function_target into = {context, &function};
    onnx_FunctionProto message = onnx_FunctionProto_init_zero;
    message.name.funcs.decode = decode_function_name;
    message.domain.funcs.decode = decode_function_domain;
    message.name.arg = message.domain.arg = &into;
    onnx_model *model = context->model;
    if (pb_decode(stream, onnx_FunctionProto_fields, &message) &&
        append_item((void **)&model->functions, &model->function_count, &model->function_capacity, &function,
                    sizeof function))
        return true;
    free(function.name);
    free(function.domain);
    return context->failed ? false : callback_failure(context, TAS_ERROR_MEMORY, "out of memory reading the step file");
}

tas_status onnx_read_memory(const uint8_t *data, size_t size, const char *origin, onnx_model *model,
                            error_record *error) {
    memset(model, 0, sizeof *model);
    model->data = data;
    model->size = size;
    decoding context = {model, error, 0, data, data + size};
    onnx_ModelProto message = onnx_ModelProto_init_zero;
    message.producer_name.funcs.decode = decode_producer;
    message.producer_name.arg = &context;
    message.metadata_props.funcs.decode = decode_metadata;
    message.metadata_props.arg = &context;
    message.functions.funcs.decode = decode_function;
    message.functions.arg = &context;
    message.graph.node.funcs.decode = decode_node;
    message.graph.node.arg = &context;
    message.graph.initializer.funcs.decode = decode_initializer;
    message.graph.initializer.arg = &context;
    pb_istream_t stream = pb_istream_from_buffer(data, size);
    if (!pb_decode(&stream, onnx_ModelProto_fields, &message)) {
        if (context.failed) return fail_context(error, "%s", origin);
        return fail(error, TAS_ERROR_FORMAT,
                    "%s is not a valid ONNX model (%s at byte %zu of %zu): truncated or corrupted? export it again",
                    origin, PB_GET_ERROR(&stream), size - stream.bytes_left, size);
    }
    return TAS_OK;
}

tas_status onnx_read_file(const char *path, onnx_model *model, error_record *error) {
    memset(model, 0, sizeof *model);
    const uint8_t *data = NULL;
    size_t size = 0;
    tas_status status = map_file(path, &data, &size, error);
    if (status != TAS_OK) return status;
    if (size == 0) return fail(error, TAS_ERROR_FORMAT, "%s is empty: not a step file; export it again", path);
    status = onnx_read_memory(data, size, path, model, error);
    model->mapped = 1;
    return status;
}

void onnx_free(onnx_model *model) {
    free(model->producer);
    for (size_t i = 0; i < model->metadata_keys.count; i++) free(model->metadata_keys.items[i]);
    for (size_t i = 0; i < model->metadata_values.count; i++) free(model->metadata_values.items[i]);
    free(model->metadata_keys.items);
    free(model->metadata_values.items);
    for (size_t i = 0; i < model->node_count; i++) free_node(&model->nodes[i]);
    free(model->nodes);
    for (size_t i = 0; i < model->function_count; i++) {
        free(model->functions[i].name);
        free(model->functions[i].domain);
    }
    free(model->functions);
    for (size_t i = 0; i < model->initializer_count; i++) free_initializer(&model->initializers[i]);
    free(model->initializers);
    if (model->mapped && model->data) munmap((void *)model->data, model->size);
    memset(model, 0, sizeof *model);
}

const char *onnx_metadata(const onnx_model *model, const char *key) {
    const char *found = NULL; /* protobuf maps: the last entry of a key wins */
    for (size_t i = 0; i < model->metadata_keys.count; i++)
        if (strcmp(model->metadata_keys.items[i], key) == 0) found = model->metadata_values.items[i];
    return found;
}

const onnx_initializer *onnx_find_initializer(const onnx_model *model, const char *name) {
    for (size_t i = 0; i < model->initializer_count; i++)
        if (model->initializers[i].name && strcmp(model->initializers[i].name, name) == 0)
            return &model->initializers[i];
    return NULL;
}

const onnx_attribute *onnx_find_attribute(const onnx_node *node, const char *name) {
    for (size_t i = 0; i < node->attribute_count; i++)
        if (node->attributes[i].name && strcmp(node->attributes[i].name, name) == 0) return &node->attributes[i];
    return NULL;
}
