/* The batches a run takes from a data file (the layout `python -m torch_adreno export --data-out`
 * writes), checked against the step's batch inputs by name, dtype and shape. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void describe(const tas_tensor_info *info, char *out, size_t size) {
    static const char *const NAMES[] = {"float32", "int64", "int32", "bool", "uint8"};
    int used = snprintf(out, size, "%s %s[", info->name, NAMES[info->dtype]);
    for (int d = 0; d < info->rank && used > 0 && (size_t)used < size; d++)
        used += snprintf(out + used, size - (size_t)used, "%s%lld", d ? ", " : "", (long long)info->shape[d]);
    if (used > 0 && (size_t)used < size) snprintf(out + used, size - (size_t)used, "]");
}

/* "batch_0 float32[64, 784], batch_1 int64[64]" */
static void takes(tas_step *step, char *out, size_t size) {
    out[0] = '\0';
    for (size_t i = 0; i < tas_step_batch_count(step); i++) {
        tas_tensor_info info;
        char one[256];
        tas_step_batch_info(step, i, &info);
        describe(&info, one, sizeof one);
        size_t used = strlen(out);
        snprintf(out + used, size - used, "%s%s", i ? ", " : "", one);
    }
}

static int check_tensor(batch_source *source, const char *path, const tas_tensor_info *info, const safetensor *tensor,
                        const char *expected) {
    int same = tensor->dtype == info->dtype && tensor->rank == info->rank + 1 && tensor->shape[0] >= 1;
    for (int d = 0; same && d < info->rank; d++) same = tensor->shape[d + 1] == info->shape[d];
    if (!same) {
        tas_tensor_info found = {info->name, tensor->dtype, tensor->rank, {0}, tensor->bytes};
        memcpy(found.shape, tensor->shape, sizeof found.shape);
        char text[256];
        describe(&found, text, sizeof text);
        fprintf(stderr, "error: %s: tensor %s must stack the step's batches over steps, [steps, ...] of the step's "
                "%s; it is %s (the step takes %s)\n", path, info->name, info->name, text, expected);
        return 0;
    }
    size_t rows = (size_t)tensor->shape[0];
    if (source->row_count == 0 || rows < source->row_count) source->row_count = rows;
    return 1;
}

int batches_open(batch_source *source, tas_step *step, const char *path) {
    memset(source, 0, sizeof *source);
    source->inputs = tas_step_batch_count(step);
    source->rows = calloc(source->inputs + 1, sizeof *source->rows);
    source->row_bytes = calloc(source->inputs + 1, sizeof *source->row_bytes);
    source->current = calloc(source->inputs + 1, sizeof *source->current);
    if (!source->rows || !source->row_bytes || !source->current) {
        fprintf(stderr, "error: out of memory\n");
        return EXIT_FAILED;
    }
    char expected[2048];
    takes(step, expected, sizeof expected);
    if (path == NULL) { /* one batch of zeros (bench without data: labels 0, token 0) */
        size_t largest = 1;
        for (size_t i = 0; i < source->inputs; i++) {
            tas_tensor_info info;
            tas_step_batch_info(step, i, &info);
            source->row_bytes[i] = info.bytes;
            if (info.bytes > largest) largest = info.bytes;
        }
        source->zeros = calloc(largest, 1);
        if (source->zeros == NULL) {
            fprintf(stderr, "error: out of memory\n");
            return EXIT_FAILED;
        }
        for (size_t i = 0; i < source->inputs; i++) source->rows[i] = source->zeros;
        source->row_count = 1;
        return 0;
    }
    error_record error = {TAS_OK, ""};
    tas_status status = safetensors_read_file(path, &source->file, &error);
    if (status != TAS_OK) {
        fprintf(stderr, "error: %s\n", error.message);
        return exit_status(status);
    }
    for (size_t i = 0; i < source->inputs; i++) {
        tas_tensor_info info;
        tas_step_batch_info(step, i, &info);
        const safetensor *tensor = safetensors_find(&source->file, info.name);
        if (tensor == NULL) {
            fprintf(stderr, "error: %s has no tensor %s; the step takes %s, each stacked over steps as "
                    "[steps, ...] (python -m torch_adreno export --data-out writes such a file)\n", path, info.name,
                    expected);
            return EXIT_BAD_INPUT;
        }
        if (!check_tensor(source, path, &info, tensor, expected)) return EXIT_BAD_INPUT;
        source->rows[i] = tensor->data;
        source->row_bytes[i] = info.bytes;
    }
    if (source->inputs == 0) source->row_count = 1;
    return 0;
}

const void *const *batches_at(batch_source *source, size_t number) {
    size_t row = source->zeros ? 0 : number % source->row_count;
    for (size_t i = 0; i < source->inputs; i++)
        source->current[i] = (const uint8_t *)source->rows[i] + (source->zeros ? 0 : row * source->row_bytes[i]);
    return source->current;
}

void batches_close(batch_source *source) {
    safetensors_free(&source->file);
    free(source->rows);
    free(source->row_bytes);
    free(source->current);
    free(source->zeros);
    memset(source, 0, sizeof *source);
}
