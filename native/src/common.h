/* Helpers shared by the runtime's parts: the error record every fallible function fills, checked
 * arithmetic for sizes read from files, and growable arrays. */
#ifndef TORCH_ADRENO_STEP_COMMON_H
#define TORCH_ADRENO_STEP_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "torch_adreno_step.h"

/* What went wrong, for the caller to show: a status and one message naming what and what to do. */
typedef struct error_record {
    tas_status status;
    char message[2048];
} error_record;

/* Records status and a printf-style message; returns status so that callers can `return fail(...)`. */
tas_status fail(error_record *error, tas_status status, const char *format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Puts `context: ` before the message already recorded (the message keeps its status). */
tas_status fail_context(error_record *error, const char *format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* a * b and a + b for sizes that come from files; 0 on overflow. */
int multiply_size(size_t a, size_t b, size_t *result);
int add_size(size_t a, size_t b, size_t *result);

/* A copy of `length` bytes of `text` as a NUL-terminated string (NULL when out of memory). */
char *copy_text(const char *text, size_t length);

/* Appends `item_size` bytes at `item` to a malloc'd array of `*count` items with `*capacity`. */
int append_item(void **items, size_t *count, size_t *capacity, const void *item, size_t item_size);

/* Maps the regular file at `path` read-only (`*size` may be 0: then `*data` is NULL); release
 * with munmap. Failing, it records why (TAS_ERROR_FILE). */
tas_status map_file(const char *path, const uint8_t **data, size_t *size, error_record *error);

/* Element types the step format uses (runner/format.py ELEMENT_TYPES). */
size_t dtype_size(tas_dtype dtype);
const char *dtype_name(tas_dtype dtype);         /* numpy's names: "float32" ... */
int dtype_from_name(const char *name, tas_dtype *dtype);
int dtype_from_onnx(int32_t onnx_type, tas_dtype *dtype);
const char *dtype_safetensors_name(tas_dtype dtype); /* "F32" ... */
int dtype_from_safetensors_name(const char *name, tas_dtype *dtype);

/* Product of a shape's sizes in elements; 0 when a size is negative or the product overflows. */
int shape_elements(const int64_t *shape, int rank, size_t *elements);

#endif
