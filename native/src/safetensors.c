#include "safetensors.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cJSON.h>

/* The safetensors library refuses larger headers (MAX_HEADER_SIZE) */
#define MAX_HEADER_BYTES 100000000u

static tas_status bad_header(error_record *error, const char *origin, const char *what, const char *name) {
    return fail(error, TAS_ERROR_FORMAT, "%s is not a valid safetensors file: %s%s%s; write it again with "
                "safetensors (save_file) or `python -m torch_adreno export --data-out`", origin, what,
                name ? " " : "", name ? name : "");
}

static int read_integer(const cJSON *item, double maximum, uint64_t *out) {
    if (!cJSON_IsNumber(item) || !(item->valuedouble >= 0 && item->valuedouble <= maximum) ||
        floor(item->valuedouble) != item->valuedouble)
        return 0;
    *out = (uint64_t)item->valuedouble;
    return 1;
}

static tas_status read_entry(const cJSON *entry, const char *origin, size_t data_size, safetensor *tensor,
                             uint64_t offsets[2], error_record *error) {
    const char *name = tensor->name;
    if (!cJSON_IsObject(entry)) return bad_header(error, origin, "the header's entry is not an object:", name);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(entry, "dtype");
    if (!cJSON_IsString(dtype)) return bad_header(error, origin, "no dtype for tensor", name);
    if (!dtype_from_safetensors_name(dtype->valuestring, &tensor->dtype))
        return fail(error, TAS_ERROR_FORMAT, "%s: tensor %s is %s; this runtime reads F32, I64, I32, BOOL and U8",
                    origin, name, dtype->valuestring);
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(entry, "shape");
    if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > TAS_MAX_RANK)
        return bad_header(error, origin, "no shape of at most 8 sizes for tensor", name);
    tensor->rank = cJSON_GetArraySize(shape);
    for (int d = 0; d < tensor->rank; d++) {
        uint64_t size;
        if (!read_integer(cJSON_GetArrayItem(shape, d), 9007199254740992.0, &size))
            return bad_header(error, origin, "a size that is not a whole number >= 0 in the shape of", name);
        tensor->shape[d] = (int64_t)size;
    }
    size_t elements;
    if (!shape_elements(tensor->shape, tensor->rank, &elements) ||
        !multiply_size(elements, dtype_size(tensor->dtype), &tensor->bytes))
        return bad_header(error, origin, "a shape too large for", name);
    const cJSON *range = cJSON_GetObjectItemCaseSensitive(entry, "data_offsets");
    if (!cJSON_IsArray(range) || cJSON_GetArraySize(range) != 2 ||
        !read_integer(cJSON_GetArrayItem(range, 0), 9007199254740992.0, &offsets[0]) ||
        !read_integer(cJSON_GetArrayItem(range, 1), 9007199254740992.0, &offsets[1]) || offsets[0] > offsets[1])
        return bad_header(error, origin, "no data_offsets [begin, end] for tensor", name);
    if (offsets[1] > data_size) return bad_header(error, origin, "data past the end of the file (truncated?) for", name);
    if (offsets[1] - offsets[0] != tensor->bytes)
        return bad_header(error, origin, "data_offsets that do not match the dtype and shape of", name);
    return TAS_OK;
}

typedef struct ranged {
    uint64_t begin, end;
} ranged;

static int by_begin(const void *a, const void *b) {
    const ranged *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* As the safetensors library: the tensors' bytes cover the data without gaps or overlaps. */
static tas_status check_coverage(ranged *ranges, size_t count, size_t data_size, const char *origin,
                                 error_record *error) {
    qsort(ranges, count, sizeof *ranges, by_begin);
    uint64_t expected = 0;
    for (size_t i = 0; i < count; i++) {
        if (ranges[i].begin != expected) return bad_header(error, origin, "tensors whose bytes overlap or leave gaps", NULL);
        expected = ranges[i].end;
    }
    if (expected != data_size) return bad_header(error, origin, "bytes after the last tensor's data", NULL);
    return TAS_OK;
}

static tas_status read_header(const cJSON *header, const uint8_t *data, size_t data_size, const char *origin,
                              safetensors_file *file, error_record *error) {
    int entries = cJSON_GetArraySize(header);
    file->tensors = calloc((size_t)entries + 1, sizeof *file->tensors);
    ranged *ranges = calloc((size_t)entries + 1, sizeof *ranges);
    if (file->tensors == NULL || ranges == NULL) {
        free(ranges);
        return fail(error, TAS_ERROR_MEMORY, "out of memory");
    }
    tas_status status = TAS_OK;
    for (const cJSON *entry = header->child; entry != NULL && status == TAS_OK; entry = entry->next) {
        if (entry->string == NULL) {
            status = bad_header(error, origin, "a header entry without a name", NULL);
            break;
        }
        if (strcmp(entry->string, "__metadata__") == 0) continue;
        if (safetensors_find(file, entry->string) != NULL) {
            status = bad_header(error, origin, "two entries for tensor", entry->string);
            break;
        }
        safetensor *tensor = &file->tensors[file->count];
        tensor->name = copy_text(entry->string, strlen(entry->string));
        if (tensor->name == NULL) {
            status = fail(error, TAS_ERROR_MEMORY, "out of memory");
            break;
        }
        file->count += 1;
        uint64_t offsets[2] = {0, 0};
        status = read_entry(entry, origin, data_size, tensor, offsets, error);
        tensor->data = data + offsets[0];
        ranges[file->count - 1] = (ranged){offsets[0], offsets[1]};
    }
    if (status == TAS_OK) status = check_coverage(ranges, file->count, data_size, origin, error);
    free(ranges);
    return status;
}

tas_status safetensors_read_memory(const uint8_t *data, size_t size, const char *origin, safetensors_file *file,
                                   error_record *error) {
    memset(file, 0, sizeof *file);
    file->data = data;
    file->size = size;
    if (size < 8) return bad_header(error, origin, "shorter than its 8-byte header length", NULL);
    uint64_t header_length = 0;
    for (int i = 7; i >= 0; i--) header_length = header_length << 8 | data[i];
    if (header_length > MAX_HEADER_BYTES) return bad_header(error, origin, "a header length over 100 MB", NULL);
    if (header_length > size - 8) return bad_header(error, origin, "a header longer than the file (truncated?)", NULL);
    if (header_length == 0 || data[8] != '{') return bad_header(error, origin, "a header that is not a JSON object", NULL);
    cJSON *header = cJSON_ParseWithLength((const char *)data + 8, (size_t)header_length);
    if (header == NULL || !cJSON_IsObject(header)) {
        cJSON_Delete(header);
        return bad_header(error, origin, "a header that is not a JSON object", NULL);
    }
    const uint8_t *tensor_data = data + 8 + header_length;
    tas_status status = read_header(header, tensor_data, size - 8 - (size_t)header_length, origin, file, error);
    cJSON_Delete(header);
    return status;
}

tas_status safetensors_read_file(const char *path, safetensors_file *file, error_record *error) {
    memset(file, 0, sizeof *file);
    const uint8_t *data;
    size_t size;
    tas_status status = map_file(path, &data, &size, error);
    if (status != TAS_OK) return status;
    if (size < 8) {
        if (data) munmap((void *)data, size);
        return bad_header(error, path, "shorter than its 8-byte header length", NULL);
    }
    status = safetensors_read_memory(data, size, path, file, error);
    file->mapped = 1;
    return status;
}

void safetensors_free(safetensors_file *file) {
    for (size_t i = 0; i < file->count; i++) free(file->tensors[i].name);
    free(file->tensors);
    if (file->mapped && file->data) munmap((void *)file->data, file->size);
    memset(file, 0, sizeof *file);
}

const safetensor *safetensors_find(const safetensors_file *file, const char *name) {
    for (size_t i = 0; i < file->count; i++)
        if (strcmp(file->tensors[i].name, name) == 0) return &file->tensors[i];
    return NULL;
}

/* {"name": {"dtype", "shape", "data_offsets"}, ..., "__metadata__": {"format": "pt"}} */
static char *header_text(const safetensor_output *tensors, size_t count) {
    cJSON *header = cJSON_CreateObject();
    cJSON *metadata = cJSON_AddObjectToObject(header, "__metadata__");
    int ok = header != NULL && metadata != NULL && cJSON_AddStringToObject(metadata, "format", "pt") != NULL;
    double offset = 0;
    for (size_t i = 0; ok && i < count; i++) {
        cJSON *entry = cJSON_AddObjectToObject(header, tensors[i].name);
        cJSON *shape = entry ? cJSON_AddArrayToObject(entry, "shape") : NULL;
        cJSON *range = entry ? cJSON_AddArrayToObject(entry, "data_offsets") : NULL;
        ok = shape && range && cJSON_AddStringToObject(entry, "dtype", dtype_safetensors_name(tensors[i].dtype));
        for (int d = 0; ok && d < tensors[i].rank; d++)
            ok = cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)tensors[i].shape[d]));
        if (ok) ok = cJSON_AddItemToArray(range, cJSON_CreateNumber(offset));
        offset += (double)tensors[i].bytes;
        if (ok) ok = cJSON_AddItemToArray(range, cJSON_CreateNumber(offset));
    }
    char *text = ok ? cJSON_PrintUnformatted(header) : NULL;
    cJSON_Delete(header);
    return text;
}

tas_status safetensors_write(const char *path, const safetensor_output *tensors, size_t count,
                             safetensor_source source, void *context, error_record *error) {
    char *header = header_text(tensors, count);
    size_t largest = 1;
    for (size_t i = 0; i < count; i++)
        if (tensors[i].bytes > largest) largest = tensors[i].bytes;
    void *buffer = malloc(largest);
    if (header == NULL || buffer == NULL) {
        free(header);
        free(buffer);
        return fail(error, TAS_ERROR_MEMORY, "out of memory writing %s", path);
    }
    /* the header padded with spaces to a multiple of 8 bytes, as the safetensors library writes it */
    size_t length = strlen(header), padded = (length + 7) / 8 * 8;
    uint8_t prefix[8];
    for (int i = 0; i < 8; i++) prefix[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    char temporary[1100];
    snprintf(temporary, sizeof temporary, "%s.%ld.tmp", path, (long)getpid());
    FILE *file = fopen(temporary, "wb");
    tas_status status = TAS_OK;
    if (file == NULL) {
        status = fail(error, TAS_ERROR_FILE, "cannot write %s: %s", path, strerror(errno));
    } else {
        int written = fwrite(prefix, 1, 8, file) == 8 && fwrite(header, 1, length, file) == length;
        for (size_t i = length; written && i < padded; i++) written = fputc(' ', file) != EOF;
        for (size_t i = 0; written && i < count; i++) {
            status = source(context, i, buffer, error);
            written = status == TAS_OK && fwrite(buffer, 1, tensors[i].bytes, file) == tensors[i].bytes;
        }
        if (fclose(file) != 0) written = 0;
        if (status == TAS_OK && (!written || rename(temporary, path) != 0))
            status = fail(error, TAS_ERROR_FILE, "cannot write %s: %s", path, strerror(errno));
        if (status != TAS_OK) unlink(temporary);
    }
    free(header);
    free(buffer);
    return status;
}
