#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

tas_status fail(error_record *error, tas_status status, const char *format, ...) {
    error->status = status;
    va_list arguments;
    va_start(arguments, format);
    vsnprintf(error->message, sizeof error->message, format, arguments);
    va_end(arguments);
    return status;
}

tas_status fail_context(error_record *error, const char *format, ...) {
    char context[512];
    va_list arguments;
    va_start(arguments, format);
    vsnprintf(context, sizeof context, format, arguments);
    va_end(arguments);
    char message[sizeof error->message];
    snprintf(message, sizeof message, "%.500s: %.1500s", context, error->message);
    memcpy(error->message, message, sizeof message);
    return error->status;
}

int multiply_size(size_t a, size_t b, size_t *result) {
    if (a != 0 && b > SIZE_MAX / a) return 0;
    *result = a * b;
    return 1;
}

int add_size(size_t a, size_t b, size_t *result) {
    if (b > SIZE_MAX - a) return 0;
    *result = a + b;
    return 1;
}

char *copy_text(const char *text, size_t length) {
    char *copy = malloc(length + 1);
    if (copy == NULL) return NULL;
    if (length) memcpy(copy, text, length);
    copy[length] = '\0';
    return copy;
}

int append_item(void **items, size_t *count, size_t *capacity, const void *item, size_t item_size) {
    if (*count == *capacity) {
        size_t grown = *capacity ? *capacity * 2 : 8;
        size_t bytes;
        if (!multiply_size(grown, item_size, &bytes)) return 0;
        void *larger = realloc(*items, bytes);
        if (larger == NULL) return 0;
        *items = larger;
        *capacity = grown;
    }
    memcpy((char *)*items + *count * item_size, item, item_size);
    *count += 1;
    return 1;
}

typedef struct dtype_names {
    tas_dtype dtype;
    size_t size;
    const char *numpy;
    const char *safetensors;
    int32_t onnx;  /* TensorProto.DataType */
} dtype_names;

static const dtype_names DTYPES[] = {
    {TAS_FLOAT32, 4, "float32", "F32", 1},
    {TAS_INT64, 8, "int64", "I64", 7},
    {TAS_INT32, 4, "int32", "I32", 6},
    {TAS_BOOL, 1, "bool", "BOOL", 9},
    {TAS_UINT8, 1, "uint8", "U8", 2},
};
#define DTYPE_COUNT (sizeof DTYPES / sizeof DTYPES[0])

size_t dtype_size(tas_dtype dtype) {
    for (size_t i = 0; i < DTYPE_COUNT; i++)
        if (DTYPES[i].dtype == dtype) return DTYPES[i].size;
    return 0;
}

const char *dtype_name(tas_dtype dtype) {
    for (size_t i = 0; i < DTYPE_COUNT; i++)
        if (DTYPES[i].dtype == dtype) return DTYPES[i].numpy;
    return "unknown";
}

const char *dtype_safetensors_name(tas_dtype dtype) {
    for (size_t i = 0; i < DTYPE_COUNT; i++)
        if (DTYPES[i].dtype == dtype) return DTYPES[i].safetensors;
    return "unknown";
}

int dtype_from_name(const char *name, tas_dtype *dtype) {
    for (size_t i = 0; i < DTYPE_COUNT; i++)
        if (strcmp(DTYPES[i].numpy, name) == 0) {
            *dtype = DTYPES[i].dtype;
            return 1;
        }
    return 0;
}

int dtype_from_safetensors_name(const char *name, tas_dtype *dtype) {
    for (size_t i = 0; i < DTYPE_COUNT; i++)
        if (strcmp(DTYPES[i].safetensors, name) == 0) {
            *dtype = DTYPES[i].dtype;
            return 1;
        }
    return 0;
}

int dtype_from_onnx(int32_t onnx_type, tas_dtype *dtype) {
    for (size_t i = 0; i < DTYPE_COUNT; i++)
        if (DTYPES[i].onnx == onnx_type) {
            *dtype = DTYPES[i].dtype;
            return 1;
        }
    return 0;
}

int shape_elements(const int64_t *shape, int rank, size_t *elements) {
    size_t product = 1;
    for (int i = 0; i < rank; i++) {
        if (shape[i] < 0 || (uint64_t)shape[i] > SIZE_MAX) return 0;
        if (!multiply_size(product, (size_t)shape[i], &product)) return 0;
    }
    *elements = product;
    return 1;
}

tas_status map_file(const char *path, const uint8_t **data, size_t *size, error_record *error) {
    *data = NULL;
    *size = 0;
    int descriptor = open(path, O_RDONLY);
    if (descriptor < 0) return fail(error, TAS_ERROR_FILE, "cannot open %s: %s", path, strerror(errno));
    struct stat status;
    if (fstat(descriptor, &status) != 0 || !S_ISREG(status.st_mode)) {
        close(descriptor);
        return fail(error, TAS_ERROR_FILE, "%s is not a regular file", path);
    }
    if (status.st_size == 0) {
        close(descriptor);
        return TAS_OK;
    }
    void *mapping = mmap(NULL, (size_t)status.st_size, PROT_READ, MAP_PRIVATE, descriptor, 0);
    close(descriptor); /* the mapping keeps the file */
    if (mapping == MAP_FAILED) return fail(error, TAS_ERROR_FILE, "cannot map %s: %s", path, strerror(errno));
    *data = mapping;
    *size = (size_t)status.st_size;
    return TAS_OK;
}
