/* torch-adreno-step: the command line over the C API. The helpers its commands share (common.c),
 * the batches of a data file (batches.c) and the commands (main.c: devices; commands.c: train and
 * bench; serve.c). Only the public header: the command is a client of the C API like any other
 * (batches.c alone reads data files with the runtime's readers, behind batch_source). */
#ifndef TORCH_ADRENO_STEP_CLI_H
#define TORCH_ADRENO_STEP_CLI_H

#include <stddef.h>

#include "torch_adreno_step.h"

/* Exit statuses: 2 for bad input (arguments, files, a device lacking what the step needs), as
 * `python -m torch_adreno.runner`; 1 for a failure while running. */
enum { EXIT_BAD_INPUT = 2, EXIT_FAILED = 1 };

/* common.c */
int exit_status(tas_status status);
/* Prints "error: <message>" for a failed call on `step` and returns the exit status. */
int report(tas_step *step, tas_status status);
double now_seconds(void);
/* The default cache folder: $TORCH_ADRENO_STEP_CACHE, else $XDG_CACHE_HOME or ~/.cache, then
 * torch_adreno/native-programs; NULL when none can be named. `buffer` holds the result. */
const char *default_cache_dir(char *buffer, size_t size);
/* An option's integer >= 1 ("takes an integer >= 1"); 0 with the error printed otherwise. */
int parse_count(const char *text, const char *option, long *value);
/* An option's integer in [low, high]; 0 with the error printed otherwise. */
int parse_range(const char *text, const char *option, long low, long high, long *value);
/* An option's integer of any value; 0 with the error printed otherwise. */
int parse_integer(const char *text, const char *option, long long *value);

/* batches.c: the batches of a data file (torch_adreno/runner/data.py: safetensors or .npz; stacked
 * batches, [S, *input shape], step i taking row i mod S; or examples, [N, *input shape[1:]],
 * drawn B at a time in an order shuffled each epoch from the seed). */
typedef struct batch_source batch_source;

/* Opens the data file at `path` (NULL: one batch of zeros) for the `count` batch inputs `inputs`
 * (tas_step_batch_info of each; the names must outlive the source) and checks it against them;
 * `seed` orders the examples. Returns 0 with *source set, or the exit status with the error
 * printed and *source NULL. */
int batches_open(batch_source **source, const tas_tensor_info *inputs, size_t count, const char *path,
                 long long seed);
/* The batch of step `number` (0-based): one pointer per input, valid until the next call. */
const void *const *batches_at(batch_source *source, size_t number);
/* Per input, one batch's bytes (tas_step_run's `bytes`). */
const size_t *batches_bytes(const batch_source *source);
/* The file's stacked batches (S) or examples (N); 1 for the batch of zeros. */
size_t batches_rows(const batch_source *source);
void batches_close(batch_source *source); /* (NULL: nothing to close) */

/* The commands: argv after the command's name (argv[0] is the name). */
int command_devices(int argc, char **argv);
int command_train(int argc, char **argv);
int command_bench(int argc, char **argv);
int command_serve(int argc, char **argv);

#endif
