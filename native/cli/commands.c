/* train and bench. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

enum { OPTION_DATA = 1, OPTION_STEPS, OPTION_OUT, OPTION_DEVICE, OPTION_STATE, OPTION_LR, OPTION_CACHE,
       OPTION_NO_CACHE, OPTION_PRINT_EVERY, OPTION_WARMUP, OPTION_FILL, OPTION_SEED, OPTION_CONTINUE_ON_NONFINITE,
       OPTION_NO_RECORDING };

/* What train and bench share: the step, where its programs are cached, the device. */
typedef struct common_options {
    const char *step_path;
    const char *device;
    const char *cache_dir;  /* NULL: no cache */
    const char *data_path;  /* NULL: zero batches (bench only) */
    long steps;
} common_options;

typedef struct run_options {
    common_options common;
    const char *out_path, *state_path;
    const char *lr;
    long print_every, warmup;
    int no_cache;
    int fill;  /* tas_open_options.fill_uninitialized_memory: 1 with the flag, else 0 (the variable) */
    int no_recording; /* --no-recording: tas_step_set_recording(step, 0) */
    long long seed;  /* of the examples' order */
    int continue_on_nonfinite;
    char cache_buffer[1024];
} run_options;

/* Parses argv (after the command's name); `allowed` lists the option codes the command takes. */
static int parse(int argc, char **argv, const char *command, const int *allowed, size_t allowed_count,
                 run_options *options) {
    static const struct option LONG_OPTIONS[] = {
        {"data", required_argument, NULL, OPTION_DATA},     {"steps", required_argument, NULL, OPTION_STEPS},
        {"out", required_argument, NULL, OPTION_OUT},       {"device", required_argument, NULL, OPTION_DEVICE},
        {"state", required_argument, NULL, OPTION_STATE},   {"lr", required_argument, NULL, OPTION_LR},
        {"cache-dir", required_argument, NULL, OPTION_CACHE}, {"no-cache", no_argument, NULL, OPTION_NO_CACHE},
        {"print-every", required_argument, NULL, OPTION_PRINT_EVERY},
        {"warmup", required_argument, NULL, OPTION_WARMUP},
        {"fill-uninitialized-memory", no_argument, NULL, OPTION_FILL}, {"seed", required_argument, NULL, OPTION_SEED},
        {"continue-on-nonfinite", no_argument, NULL, OPTION_CONTINUE_ON_NONFINITE},
        {"no-recording", no_argument, NULL, OPTION_NO_RECORDING}, {NULL, 0, NULL, 0},
    };
    memset(options, 0, sizeof *options);
    options->print_every = 1;
    opterr = 0;
    int code;
    while ((code = getopt_long(argc, argv, ":", LONG_OPTIONS, NULL)) != -1) {
        int known = 0;
        for (size_t i = 0; i < allowed_count; i++) known |= allowed[i] == code;
        if (code == '?' || code == ':' || !known) {
            fprintf(stderr, "error: %s: option %s %s (see torch-adreno-step --help)\n", command, argv[optind - 1],
                    code == ':' ? "needs a value" : "is not known here");
            return 0;
        }
        switch (code) {
        case OPTION_DATA: options->common.data_path = optarg; break;
        case OPTION_STEPS: if (!parse_count(optarg, "--steps", &options->common.steps)) return 0; break;
        case OPTION_OUT: options->out_path = optarg; break;
        case OPTION_DEVICE: options->common.device = optarg; break;
        case OPTION_STATE: options->state_path = optarg; break;
        case OPTION_LR: options->lr = optarg; break;
        case OPTION_CACHE: options->common.cache_dir = optarg; break;
        case OPTION_NO_CACHE: options->no_cache = 1; break;
        case OPTION_FILL: options->fill = 1; break;
        case OPTION_NO_RECORDING: options->no_recording = 1; break;
        case OPTION_CONTINUE_ON_NONFINITE: options->continue_on_nonfinite = 1; break;
        case OPTION_SEED: if (!parse_integer(optarg, "--seed", &options->seed)) return 0; break;
        case OPTION_PRINT_EVERY: if (!parse_count(optarg, "--print-every", &options->print_every)) return 0; break;
        case OPTION_WARMUP: if (!parse_count(optarg, "--warmup", &options->warmup)) return 0; break;
        default: break;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "error: %s takes one step file (STEP.onnx), got %d\n", command, argc - optind);
        return 0;
    }
    options->common.step_path = argv[optind];
    if (options->no_cache) options->common.cache_dir = NULL;
    else if (options->common.cache_dir == NULL)
        options->common.cache_dir = default_cache_dir(options->cache_buffer, sizeof options->cache_buffer);
    return 1;
}

static int open_step(const run_options *options, int profile, tas_step **step) {
    tas_open_options open_options = {options->common.device, NULL, options->common.cache_dir, profile, options->fill};
    tas_status status = tas_step_open(options->common.step_path, &open_options, step);
    if (status != TAS_OK) return report(*step, status);
    if (options->no_recording) tas_step_set_recording(*step, 0);
    tas_step_summary summary;
    tas_step_summarize(*step, &summary);
    printf("%s: %zu operations (%zu kernels) on %s, driver %s\n", options->common.step_path, summary.operations,
           summary.kernels, summary.device, summary.driver);
    if (!profile) { /* (a profiled step enqueues operation by operation: bench says so itself) */
        const char *path = NULL;
        status = tas_step_enqueue_path(*step, &path);
        if (status != TAS_OK) return report(*step, status);
        printf("enqueue: %s\n", path);
    }
    if (options->common.cache_dir)
        printf("programs: %zu built, %zu from the cache %s\n", summary.programs_built, summary.programs_cached,
               options->common.cache_dir);
    else
        printf("programs: %zu built (no cache: %s)\n", summary.programs_built,
               options->no_cache ? "--no-cache" : "no HOME, XDG_CACHE_HOME or TORCH_ADRENO_STEP_CACHE to put one in");
    return 0;
}

/* The batches of the data file (or of zeros) for the step's batch inputs. */
static int open_batches(tas_step *step, const run_options *options, batch_source **batches) {
    size_t count = tas_step_batch_count(step);
    tas_tensor_info *inputs = calloc(count + 1, sizeof *inputs);
    if (inputs == NULL) {
        fprintf(stderr, "error: out of memory\n");
        return EXIT_FAILED;
    }
    for (size_t i = 0; i < count; i++) tas_step_batch_info(step, i, &inputs[i]);
    int result = batches_open(batches, inputs, count, options->common.data_path, options->seed);
    free(inputs);
    return result;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int train(tas_step *step, const run_options *options, batch_source *batches) {
    tas_status status;
    if (options->state_path && (status = tas_step_load_state(step, options->state_path)) != TAS_OK)
        return report(step, status);
    if (options->lr) {
        char *end = NULL;
        double lr = strtod(options->lr, &end);
        if (end == options->lr || *end) {
            fprintf(stderr, "error: --lr takes a number, got '%s'\n", options->lr);
            return EXIT_BAD_INPUT;
        }
        if ((status = tas_step_set_scalar(step, "lr", lr)) != TAS_OK) return report(step, status);
    }
    size_t steps = (size_t)options->common.steps, inputs = tas_step_batch_count(step);
    double *times = calloc(steps * 4, sizeof *times); /* step times, then each phase's */
    if (times == NULL) return EXIT_FAILED;
    double *uploads = times + steps, *enqueues = times + 2 * steps, *waits = times + 3 * steps;
    double started = now_seconds();
    for (size_t i = 0; i < steps; i++) {
        float loss;
        double begun = now_seconds();
        status = tas_step_run(step, batches_at(batches, i), batches_bytes(batches), &loss);
        times[i] = now_seconds() - begun;
        tas_step_phases phases = {0, 0, 0};
        tas_step_last_phases(step, &phases);
        uploads[i] = phases.upload_ms, enqueues[i] = phases.enqueue_ms, waits[i] = phases.wait_ms;
        if (status != TAS_OK) {
            free(times);
            fprintf(stderr, "step %zu: ", i + 1);
            return report(step, status);
        }
        int finite = isfinite(loss);
        if ((long)(i + 1) % options->print_every == 0 || i + 1 == steps || !finite)
            printf("step %zu loss %.9g time %.3f ms\n", i + 1, (double)loss, times[i] * 1e3);
        if (!finite && !options->continue_on_nonfinite) {
            free(times);
            fflush(stdout);
            fprintf(stderr, "error: step %zu: the loss is %s, not finite: training diverged (a learning rate too "
                    "high?) or the data holds non-finite values; stopped without writing the state "
                    "(--continue-on-nonfinite trains on)\n", i + 1, isnan(loss) ? "nan" : loss > 0 ? "inf" : "-inf");
            return EXIT_FAILED;
        }
    }
    double elapsed = now_seconds() - started;
    for (int part = 0; part < 4; part++) qsort(times + part * steps, steps, sizeof *times, compare_doubles);
    tas_step_summary summary;
    tas_step_summarize(step, &summary);
    printf("%zu steps in %.3f s: %.1f steps/s, median step %.3f ms; device memory %.1f MiB; batch inputs %zu, "
           "%zu batches in the data file\n", steps, elapsed, (double)steps / elapsed, times[steps / 2] * 1e3,
           (double)summary.device_bytes / (1 << 20), inputs, batches_rows(batches));
    printf("median phases: upload %.3f ms, enqueue %.3f ms, wait for the device %.3f ms\n", uploads[steps / 2],
           enqueues[steps / 2], waits[steps / 2]);
    free(times);
    if ((status = tas_step_save_state(step, options->out_path)) != TAS_OK) return report(step, status);
    printf("trained state written to %s\n", options->out_path);
    return 0;
}

int command_train(int argc, char **argv) {
    static const int ALLOWED[] = {OPTION_DATA, OPTION_STEPS, OPTION_OUT, OPTION_DEVICE, OPTION_STATE, OPTION_LR,
                                  OPTION_CACHE, OPTION_NO_CACHE, OPTION_PRINT_EVERY, OPTION_FILL, OPTION_SEED,
                                  OPTION_CONTINUE_ON_NONFINITE, OPTION_NO_RECORDING};
    run_options options;
    if (!parse(argc, argv, "train", ALLOWED, sizeof ALLOWED / sizeof ALLOWED[0], &options)) return EXIT_BAD_INPUT;
    if (!options.common.data_path || !options.common.steps || !options.out_path) {
        fprintf(stderr, "error: train needs --data FILE (.safetensors or .npz), --steps N and --out STATE.safetensors\n");
        return EXIT_BAD_INPUT;
    }
    tas_step *step = NULL;
    batch_source *batches = NULL;
    int result = open_step(&options, 0, &step);
    if (result == 0) result = open_batches(step, &options, &batches);
    if (result == 0) result = train(step, &options, batches);
    batches_close(batches);
    tas_step_close(step);
    return result;
}

typedef struct kernel_row {
    const char *name;
    double milliseconds;
    size_t runs;
} kernel_row;

static int by_time(const void *a, const void *b) {
    const kernel_row *x = a, *y = b;
    return x->milliseconds > y->milliseconds ? -1 : x->milliseconds < y->milliseconds;
}

static int bench(tas_step *step, const run_options *options, batch_source *batches) {
    size_t steps = options->common.steps ? (size_t)options->common.steps : 20, warmup = options->warmup ? (size_t)options->warmup : 2;
    float loss;
    tas_status status = TAS_OK;
    for (size_t i = 0; i < warmup + steps && status == TAS_OK; i++) {
        if (i == warmup) tas_step_reset_times(step); /* the warm-up steps are not timed */
        status = tas_step_run(step, batches_at(batches, i), batches_bytes(batches), &loss);
    }
    if (status != TAS_OK) return report(step, status);
    tas_step_summary summary;
    tas_step_summarize(step, &summary);
    kernel_row *rows = calloc(summary.operations + 1, sizeof *rows);
    if (rows == NULL) return EXIT_FAILED;
    double total = 0;
    for (size_t i = 0; i < summary.operations; i++) {
        tas_step_kernel_time(step, i, &rows[i].name, &rows[i].milliseconds, &rows[i].runs);
        total += rows[i].milliseconds;
    }
    qsort(rows, summary.operations, sizeof *rows, by_time);
    printf("%zu timed steps after %zu warm-up steps, batches %s\n", steps, warmup,
           options->common.data_path ? options->common.data_path : "of zeros (no --data)");
    printf("%-48s %6s %12s %10s %7s\n", "operation", "runs", "total ms", "mean ms", "share");
    for (size_t i = 0; i < summary.operations; i++)
        printf("%-48s %6zu %12.3f %10.4f %6.1f%%\n", rows[i].name, rows[i].runs, rows[i].milliseconds,
               rows[i].runs ? rows[i].milliseconds / (double)rows[i].runs : 0.0,
               total > 0 ? 100.0 * rows[i].milliseconds / total : 0.0);
    printf("%-48s %6s %12.3f %10.4f  per step (device time of %zu operations)\n", "total", "", total,
           total / (double)steps, summary.operations);
    free(rows);
    return 0;
}

/* The host's enqueue per step without profiling (which enqueues operation by operation): the step
 * opened again, `warmup` then `steps` runs each way (the recording, where there is one and
 * --no-recording is not given, then operation by operation), the median phases of each. */
static int bench_enqueue(const run_options *options, batch_source *batches, size_t steps, size_t warmup) {
    tas_open_options open_options = {options->common.device, NULL, options->common.cache_dir, 0, options->fill};
    tas_step *step = NULL;
    tas_status status = tas_step_open(options->common.step_path, &open_options, &step);
    if (status != TAS_OK) {
        int result = report(step, status);
        tas_step_close(step);
        return result;
    }
    double *times = calloc(steps * 3, sizeof *times);
    int result = times == NULL ? EXIT_FAILED : 0;
    for (int recorded = options->no_recording ? 0 : 1; recorded >= 0 && result == 0; recorded--) {
        tas_step_set_recording(step, recorded);
        const char *described = NULL;
        if ((status = tas_step_enqueue_path(step, &described)) != TAS_OK) {
            result = report(step, status);
            break;
        }
        char path[512];
        snprintf(path, sizeof path, "%s", described);
        float loss;
        for (size_t i = 0; i < warmup + steps && result == 0; i++) {
            if ((status = tas_step_run(step, batches_at(batches, i), batches_bytes(batches), &loss)) != TAS_OK) {
                result = report(step, status);
                break;
            }
            tas_step_phases phases;
            tas_step_last_phases(step, &phases);
            if (i >= warmup) {
                times[i - warmup] = phases.enqueue_ms;
                times[steps + i - warmup] = phases.upload_ms;
                times[2 * steps + i - warmup] = phases.wait_ms;
            }
        }
        if (result != 0) break;
        for (int part = 0; part < 3; part++) qsort(times + part * steps, steps, sizeof *times, compare_doubles);
        printf("enqueue, unprofiled (median of %zu steps): %.4f ms per step, upload %.4f ms, wait for the device "
               "%.3f ms: %s\n", steps, times[steps / 2], times[steps + steps / 2], times[2 * steps + steps / 2], path);
        if (strncmp(path, "operation by operation", 22) == 0) break; /* (nothing recorded: the loop was the run) */
    }
    free(times);
    tas_step_close(step);
    return result;
}

int command_bench(int argc, char **argv) {
    static const int ALLOWED[] = {OPTION_DATA, OPTION_STEPS, OPTION_DEVICE, OPTION_CACHE, OPTION_NO_CACHE,
                                  OPTION_WARMUP, OPTION_FILL, OPTION_SEED, OPTION_NO_RECORDING};
    run_options options;
    if (!parse(argc, argv, "bench", ALLOWED, sizeof ALLOWED / sizeof ALLOWED[0], &options)) return EXIT_BAD_INPUT;
    tas_step *step = NULL;
    batch_source *batches = NULL;
    int result = open_step(&options, 1, &step);
    if (result == 0) result = open_batches(step, &options, &batches);
    if (result == 0) result = bench(step, &options, batches);
    if (result == 0)
        result = bench_enqueue(&options, batches, options.common.steps ? (size_t)options.common.steps : 20,
                               options.warmup ? (size_t)options.warmup : 2);
    batches_close(batches);
    tas_step_close(step);
    return result;
}
