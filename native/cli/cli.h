/* torch-adreno-step: the command line over the C API (include/torch_adreno_step.h). */
#ifndef TORCH_ADRENO_STEP_CLI_H
#define TORCH_ADRENO_STEP_CLI_H

#include <stddef.h>

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

/* The batches of a data file (see native/README.md, "Data files"): for each batch input of the
 * step, a tensor of that name stacked over steps, [S, *input shape]; step i uses row i mod S. */
typedef struct batch_source {
    safetensors_file file;
    size_t inputs;
    const void **rows;       /* per batch input: row 0 of its tensor (or the zero batch) */
    size_t *row_bytes;
    size_t row_count;        /* S */
    const void **current;    /* the pointers of the step being run */
    void *zeros;
} batch_source;

/* Opens `path` (NULL: one batch of zeros) and checks it against the step's batch inputs. */
int batches_open(batch_source *source, tas_step *step, const char *path);
/* The batch of step `number` (0-based). */
const void *const *batches_at(batch_source *source, size_t number);
void batches_close(batch_source *source);

int command_train(int argc, char **argv);
int command_bench(int argc, char **argv);
int command_serve(int argc, char **argv);

#endif
