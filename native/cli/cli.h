/* torch-adreno-step: the command line over the C API (include/torch_adreno_step.h). */
#ifndef TORCH_ADRENO_STEP_CLI_H
#define TORCH_ADRENO_STEP_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "safetensors.h"
#include "torch_adreno_step.h"

/* Exit statuses: 2 for bad input (arguments, files, a device lacking what the step needs), as
 * `python -m torch_adreno.runner`; 1 for a failure while running. */
enum { EXIT_BAD_INPUT = 2, EXIT_FAILED = 1 };

/* What train and bench share: the step, where its programs are cached, the device. */
typedef struct common_options {
    const char *step_path;
    const char *device;
    const char *cache_dir;  /* NULL: no cache */
    const char *data_path;  /* NULL: zero batches (bench only) */
    long steps;
} common_options;

int exit_status(tas_status status);
/* Prints "error: <message>" for a failed call on `step` and returns the exit status. */
int report(tas_step *step, tas_status status);
double now_seconds(void);
/* The default cache folder: $TORCH_ADRENO_STEP_CACHE, else $XDG_CACHE_HOME or ~/.cache, then
 * torch_adreno/native-programs; NULL when none can be named. `buffer` holds the result. */
const char *default_cache_dir(char *buffer, size_t size);
int parse_count(const char *text, const char *option, long *value);

/* The batches of a data file (torch_adreno/runner/data.py: safetensors or .npz; stacked batches,
 * [S, *input shape], step i taking row i mod S; or examples, [N, *input shape[1:]], drawn B at a
 * time in an order shuffled each epoch from --seed). */
typedef struct batch_source {
    safetensors_file file;   /* the data file's arrays (a safetensors file or an .npz archive) */
    size_t inputs;
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
} batch_source;

/* Opens `path` (NULL: one batch of zeros) and checks it against the step's batch inputs; `seed`
 * orders the examples. Returns 0 or the exit status (the error printed). */
int batches_open(batch_source *source, tas_step *step, const char *path, long long seed);
/* The batch of step `number` (0-based). */
const void *const *batches_at(batch_source *source, size_t number);
void batches_close(batch_source *source);

int command_train(int argc, char **argv);
int command_bench(int argc, char **argv);
int command_serve(int argc, char **argv);

#endif
