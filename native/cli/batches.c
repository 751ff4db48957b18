/* The batches a run takes from a data file, as torch_adreno/runner/data.py takes them (that module
 * describes the formats and layouts; this follows it byte for byte, so one file gives one run in
 * both runners): safetensors or .npz, told apart by their first bytes; arrays named as the step's
 * batch inputs or x, y, batch_2, ...; stacked batches [S, *shape] (step i takes row i mod S) or
 * examples [N, *shape[1:]] (batches of B rows in an order shuffled each epoch by a splitmix64
 * stream seeded with --seed). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cli.h"
#include "npz.h"
#include "safetensors.h"

struct batch_source {
    tas_tensor_info *inputs; /* the step's batch inputs (their names the step's) */
    size_t input_count;
    safetensors_file file;   /* the data file's arrays (a safetensors file or an .npz archive) */
    const safetensor **arrays; /* per batch input */
    size_t *row_bytes;       /* per batch input: one batch's bytes */
    size_t row_count;        /* S stacked batches, or N examples */
    int examples;            /* the layout: examples (else stacked batches) */
    size_t batch_size;       /* B, with examples */
    uint64_t seed, state;    /* the shuffle's splitmix64 seed and state */
    size_t *order;           /* the examples' order in the last epoch shuffled */
    size_t epochs_shuffled;
    uint8_t **gathered;      /* per batch input: the batch gathered from the examples */
    const void **current;    /* the pointers of the step being run */
    void *zeros;
};

#define FORMATS "safetensors (python -m torch_adreno export --data-out writes one) or .npz (numpy.savez)"

static void describe(const char *name, tas_dtype dtype, int rank, const int64_t *shape, char *out, size_t size) {
    int used = snprintf(out, size, "%s %s[", name, dtype_name(dtype));
    for (int d = 0; d < rank && used > 0 && (size_t)used < size; d++)
        used += snprintf(out + used, size - (size_t)used, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (used > 0 && (size_t)used < size) snprintf(out + used, size - (size_t)used, "]");
}

/* "batch_0 float32[64, 784], batch_1 int64[64]" */
static void takes(const batch_source *source, char *out, size_t size) {
    out[0] = '\0';
    for (size_t i = 0; i < source->input_count; i++) {
        const tas_tensor_info *info = &source->inputs[i];
        char one[256];
        describe(info->name, info->dtype, info->rank, info->shape, one, sizeof one);
        size_t used = strlen(out);
        snprintf(out + used, size - used, "%s%s", i ? ", " : "", one);
    }
}

/* Reads the data file at `path` in whichever of the two formats it is. */
static int read_data_file(const char *path, safetensors_file *file) {
    error_record error = {TAS_OK, ""};
    const uint8_t *data;
    size_t size;
    tas_status status = map_file(path, &data, &size, &error);
    if (status == TAS_OK && npz_looks_like(data, size)) status = npz_read_memory(data, size, path, file, &error);
    else if (status == TAS_OK && size >= 9 && data[8] == '{')
        status = safetensors_read_memory(data, size, path, file, &error);
    else if (status == TAS_OK)
        status = fail(&error, TAS_ERROR_FORMAT, "%s is neither a safetensors file nor an .npz archive; the runners "
                      "read data as " FORMATS, path);
    if (data != NULL && file->data == NULL) munmap((void *)data, size);
    if (file->data != NULL) file->mapped = 1;
    if (status == TAS_OK) return 0;
    fprintf(stderr, "error: %s\n", error.message);
    return exit_status(status);
}

/* The array for each batch input: by the inputs' names, else by x, y, batch_2, ... */
static int choose_arrays(batch_source *source, const char *path, const char *expected) {
    static const char *const SHORT[] = {"x", "y"};
    for (int short_names = 0; short_names < 2; short_names++) {
        size_t found = 0;
        for (size_t i = 0; i < source->input_count; i++) {
            char name[32];
            if (short_names && i < 2) snprintf(name, sizeof name, "%s", SHORT[i]);
            else if (short_names) snprintf(name, sizeof name, "batch_%zu", i);
            source->arrays[i] = safetensors_find(&source->file, short_names ? name : source->inputs[i].name);
            found += source->arrays[i] != NULL;
        }
        if (found == source->input_count) return 0;
    }
    char has[1024] = "";
    for (size_t i = 0; i < source->file.count; i++) {
        size_t used = strlen(has);
        snprintf(has + used, sizeof has - used, "%s%s", i ? ", " : "", source->file.tensors[i].name);
    }
    fprintf(stderr, "error: %s has no array for every batch input (it has %s); the step takes %s, named so or x, y\n",
            path, source->file.count ? has : "none", expected);
    return EXIT_BAD_INPUT;
}

/* Checks array `i` against its input: its dtype, and one of the two layouts. */
static int check_array(batch_source *source, size_t i, const tas_tensor_info *info, const char *path, int *layout) {
    const safetensor *array = source->arrays[i];
    char wanted[256], found[256];
    describe(info->name, info->dtype, info->rank, info->shape, wanted, sizeof wanted);
    describe(array->name, array->dtype, array->rank, array->shape, found, sizeof found);
    if (array->dtype != info->dtype) {
        fprintf(stderr, "error: %s: array %s is %s; the step takes %s: convert it (numpy: .astype(np.%s))\n", path,
                array->name, dtype_name(array->dtype), wanted, dtype_name(info->dtype));
        return EXIT_BAD_INPUT;
    }
    int stacked = array->rank == info->rank + 1 && array->shape[0] >= 1, examples = info->rank >= 1 &&
                  array->rank == info->rank && array->shape[0] >= info->shape[0];
    for (int d = 0; d < info->rank; d++) {
        stacked = stacked && array->shape[d + 1] == info->shape[d];
        examples = examples && (d == 0 || array->shape[d] == info->shape[d]);
    }
    if (!stacked && !examples) {
        fprintf(stderr, "error: %s: array %s is %s; for %s it holds batches stacked over steps, [steps, *shape], or "
                "at least %lld examples, [N, *shape[1:]]\n", path, array->name, found, wanted,
                (long long)(info->rank ? info->shape[0] : 1));
        return EXIT_BAD_INPUT;
    }
    int this_layout = stacked ? 1 : 2;
    if (*layout && *layout != this_layout) {
        fprintf(stderr, "error: %s: some arrays stack batches over steps and others hold examples; use one layout\n",
                path);
        return EXIT_BAD_INPUT;
    }
    *layout = this_layout;
    size_t rows = (size_t)array->shape[0];
    if (i > 0 && rows != source->row_count) {
        fprintf(stderr, "error: %s: the arrays %s and %s hold %zu and %zu rows: they must hold as many\n", path,
                source->arrays[0]->name, array->name, source->row_count, rows);
        return EXIT_BAD_INPUT;
    }
    source->row_count = rows;
    return 0;
}

static int out_of_memory(void) {
    fprintf(stderr, "error: out of memory\n");
    return EXIT_FAILED;
}

/* Examples: a buffer per input for the batch gathered, and the epoch's order. */
static int prepare_examples(batch_source *source, const char *path, const char *expected) {
    source->examples = 1;
    for (size_t i = 0; i < source->input_count; i++) {
        const tas_tensor_info *info = &source->inputs[i];
        if (i == 0) source->batch_size = (size_t)info->shape[0];
        if ((size_t)info->shape[0] != source->batch_size) {
            fprintf(stderr, "error: %s holds examples, but the step's inputs differ in batch size (%s): stack its "
                    "batches over steps instead, [steps, *input shape]\n", path, expected);
            return EXIT_BAD_INPUT;
        }
        source->gathered[i] = malloc(info->bytes ? info->bytes : 1);
        if (source->gathered[i] == NULL) return out_of_memory();
    }
    source->order = calloc(source->row_count + 1, sizeof *source->order);
    return source->order ? 0 : out_of_memory();
}

/* Reads and checks the data file; the source is left for batches_close on failure. */
static int open_source(batch_source *source, const tas_tensor_info *inputs, size_t count, const char *path,
                       long long seed) {
    source->input_count = count;
    source->seed = (uint64_t)seed;
    source->inputs = calloc(count + 1, sizeof *source->inputs);
    source->arrays = calloc(count + 1, sizeof *source->arrays);
    source->row_bytes = calloc(count + 1, sizeof *source->row_bytes);
    source->current = calloc(count + 1, sizeof *source->current);
    source->gathered = calloc(count + 1, sizeof *source->gathered);
    if (!source->inputs || !source->arrays || !source->row_bytes || !source->current || !source->gathered)
        return out_of_memory();
    for (size_t i = 0; i < count; i++) {
        source->inputs[i] = inputs[i];
        source->row_bytes[i] = inputs[i].bytes;
    }
    source->row_count = 1;
    if (path == NULL) { /* one batch of zeros (bench without data: labels 0, token 0) */
        size_t largest = 1;
        for (size_t i = 0; i < count; i++)
            if (source->row_bytes[i] > largest) largest = source->row_bytes[i];
        source->zeros = calloc(largest, 1);
        return source->zeros ? 0 : out_of_memory();
    }
    int result = read_data_file(path, &source->file);
    char expected[2048];
    takes(source, expected, sizeof expected);
    if (result == 0 && count) result = choose_arrays(source, path, expected);
    int layout = 0;
    for (size_t i = 0; i < count && result == 0; i++) result = check_array(source, i, &inputs[i], path, &layout);
    if (result == 0 && layout == 2) result = prepare_examples(source, path, expected);
    return result;
}

int batches_open(batch_source **source, const tas_tensor_info *inputs, size_t count, const char *path,
                 long long seed) {
    *source = calloc(1, sizeof **source);
    if (*source == NULL) return out_of_memory();
    int result = open_source(*source, inputs, count, path, seed);
    if (result != 0) {
        batches_close(*source);
        *source = NULL;
    }
    return result;
}

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The examples' order in the epoch after the last one shuffled. */
static void shuffle_next_epoch(batch_source *source) {
    size_t rows = source->row_count;
    for (size_t i = 0; i < rows; i++) source->order[i] = i;
    for (size_t i = rows - 1; i >= 1 && rows > 1; i--) {
        size_t j = (size_t)(splitmix64(&source->state) % (uint64_t)(i + 1));
        size_t kept = source->order[i];
        source->order[i] = source->order[j];
        source->order[j] = kept;
    }
    source->epochs_shuffled += 1;
}

const void *const *batches_at(batch_source *source, size_t number) {
    if (!source->examples) {
        size_t row = source->zeros ? 0 : number % source->row_count;
        for (size_t i = 0; i < source->input_count; i++)
            source->current[i] = source->zeros ? source->zeros : source->arrays[i]->data + row * source->row_bytes[i];
        return source->current;
    }
    size_t per_epoch = source->row_count / source->batch_size, epoch = number / per_epoch;
    if (source->epochs_shuffled > epoch + 1 || source->epochs_shuffled == 0) { /* from the stream's start */
        source->state = source->seed;
        source->epochs_shuffled = 0;
    }
    while (source->epochs_shuffled < epoch + 1) shuffle_next_epoch(source);
    const size_t *rows = source->order + (number % per_epoch) * source->batch_size;
    for (size_t i = 0; i < source->input_count; i++) {
        size_t example_bytes = source->row_bytes[i] / source->batch_size;
        for (size_t r = 0; r < source->batch_size; r++)
            memcpy(source->gathered[i] + r * example_bytes, source->arrays[i]->data + rows[r] * example_bytes,
                   example_bytes);
        source->current[i] = source->gathered[i];
    }
    return source->current;
}

const size_t *batches_bytes(const batch_source *source) {
    return source->row_bytes;
}

size_t batches_rows(const batch_source *source) {
    return source->row_count;
}

void batches_close(batch_source *source) {
    if (source == NULL) return;
    safetensors_free(&source->file);
    for (size_t i = 0; source->gathered && i < source->input_count; i++) free(source->gathered[i]);
    free(source->gathered);
    free(source->inputs);
    free(source->arrays);
    free(source->row_bytes);
    free(source->current);
    free(source->order);
    free(source->zeros);
    free(source);
}
