/* Safetensors files (the Hugging Face format: an 8-byte little-endian header length, a JSON header
 * naming each tensor's dtype, shape and byte range, then the bytes), read from a mapping of the
 * file with the header parsed by cJSON and checked as the safetensors library checks it, and
 * written tensor by tensor. Only the dtypes a step file uses: F32, I64, I32, BOOL, U8. */
#ifndef TORCH_ADRENO_STEP_SAFETENSORS_H
#define TORCH_ADRENO_STEP_SAFETENSORS_H

#include "common.h"

typedef struct safetensor {
    char *name;
    tas_dtype dtype;
    int rank;
    int64_t shape[TAS_MAX_RANK];
    size_t bytes;
    const uint8_t *data; /* into the mapping */
} safetensor;

typedef struct safetensors_file {
    const uint8_t *data;
    size_t size;
    int mapped;
    safetensor *tensors;
    size_t count;
} safetensors_file;

tas_status safetensors_read_file(const char *path, safetensors_file *file, error_record *error);
/* Reads `size` bytes at `data`, which must outlive `file` (the fuzz target's entry). */
tas_status safetensors_read_memory(const uint8_t *data, size_t size, const char *origin, safetensors_file *file,
                                   error_record *error);
void safetensors_free(safetensors_file *file);
const safetensor *safetensors_find(const safetensors_file *file, const char *name);

typedef struct safetensor_output {
    const char *name;
    tas_dtype dtype;
    int rank;
    const int64_t *shape;
    size_t bytes;
} safetensor_output;

/* Fills `buffer` with tensor `index`'s bytes (it has room for the largest tensor). */
typedef tas_status (*safetensor_source)(void *context, size_t index, void *buffer, error_record *error);

/* Writes `count` tensors to `path` (through a temporary file renamed into place). */
tas_status safetensors_write(const char *path, const safetensor_output *tensors, size_t count,
                             safetensor_source source, void *context, error_record *error);

#endif
