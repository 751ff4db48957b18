/* The parts of an ONNX ModelProto a step file's runner reads, decoded with nanopb from a file
 * mapped into memory. Tensor data is not copied while decoding: an initializer's raw_data is a
 * pointer into the mapping (pages load when the state is uploaded), so a 500 MB model costs no
 * 500 MB of heap. Node attributes of kinds a step file does not use (tensors, graphs) are skipped. */
#ifndef TORCH_ADRENO_STEP_ONNX_READER_H
#define TORCH_ADRENO_STEP_ONNX_READER_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

typedef struct text_list {
    char **items;
    size_t count, capacity;
} text_list;

typedef struct int_list {
    int64_t *items;
    size_t count, capacity;
} int_list;

/* AttributeProto.AttributeType values the step format uses. */
enum { ONNX_ATTRIBUTE_INT = 2, ONNX_ATTRIBUTE_STRING = 3, ONNX_ATTRIBUTE_INTS = 7, ONNX_ATTRIBUTE_STRINGS = 8 };

typedef struct onnx_attribute {
    char *name;
    int type;
    int64_t i;
    char *s;  /* STRING, NUL-terminated */
    int_list ints;
    text_list strings;
} onnx_attribute;

typedef struct onnx_node {
    char *name, *op_type, *domain;
    onnx_attribute *attributes;
    size_t attribute_count, attribute_capacity;
} onnx_node;

/* How an initializer holds its values. */
typedef enum tensor_storage { STORAGE_NONE, STORAGE_RAW, STORAGE_FLOATS, STORAGE_INT32S, STORAGE_INT64S } tensor_storage;

typedef struct onnx_initializer {
    char *name;
    int32_t data_type;
    int64_t dims[TAS_MAX_RANK];
    int rank;
    int external;  /* data_location EXTERNAL: the values live in another file */
    tensor_storage storage;
    const uint8_t *raw;  /* STORAGE_RAW: into the file's mapping */
    size_t raw_length;
    void *values;  /* the typed fields (float_data, int32_data, int64_data), decoded */
    size_t value_count, value_capacity;
} onnx_initializer;

typedef struct onnx_function_name {
    char *name, *domain;
} onnx_function_name;

typedef struct onnx_model {
    const uint8_t *data;
    size_t size;
    int mapped;  /* data is a mapping of the file (released with munmap) */
    char *producer;
    text_list metadata_keys, metadata_values;
    onnx_node *nodes;
    size_t node_count, node_capacity;
    onnx_function_name *functions;
    size_t function_count, function_capacity;
    onnx_initializer *initializers;
    size_t initializer_count, initializer_capacity;
} onnx_model;

/* Maps and decodes the file at `path`. On failure the model holds nothing to free but what
 * onnx_free releases (call it in any case). */
tas_status onnx_read_file(const char *path, onnx_model *model, error_record *error);
/* Decodes `size` bytes at `data`, which must outlive the model (the fuzz target's entry). */
tas_status onnx_read_memory(const uint8_t *data, size_t size, const char *origin, onnx_model *model,
                            error_record *error);
void onnx_free(onnx_model *model);

/* The value of metadata_props[key], or NULL. */
const char *onnx_metadata(const onnx_model *model, const char *key);
const onnx_initializer *onnx_find_initializer(const onnx_model *model, const char *name);
const onnx_attribute *onnx_find_attribute(const onnx_node *node, const char *name);

#endif
