/* The helpers every command of torch-adreno-step shares: exit statuses, errors, option values,
 * the program cache's default folder. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cli.h"

int exit_status(tas_status status) {
    switch (status) {
    case TAS_OK: return 0;
    case TAS_ERROR_OPENCL:
    case TAS_ERROR_MEMORY:
    case TAS_ERROR_INDEX: return EXIT_FAILED;
    default: return EXIT_BAD_INPUT;
    }
}

int report(tas_step *step, tas_status status) {
    fprintf(stderr, "error: %s\n", tas_step_error(step));
    return exit_status(status);
}

double now_seconds(void) {
    struct timespec time;
    clock_gettime(CLOCK_MONOTONIC, &time);
    return (double)time.tv_sec + (double)time.tv_nsec * 1e-9;
}

const char *default_cache_dir(char *buffer, size_t size) {
    const char *chosen = getenv("TORCH_ADRENO_STEP_CACHE");
    if (chosen && *chosen) {
        snprintf(buffer, size, "%s", chosen);
        return buffer;
    }
    const char *cache = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    if (cache && *cache) snprintf(buffer, size, "%s/torch_adreno/native-programs", cache);
    else if (home && *home) snprintf(buffer, size, "%s/.cache/torch_adreno/native-programs", home);
    else return NULL;
    return buffer;
}

/* strtol over the whole text: 0 for no digits, trailing characters or out of long's range. */
static int whole_long(const char *text, long *value) {
    char *end = NULL;
    errno = 0;
    *value = strtol(text, &end, 10);
    return !errno && end != text && !*end;
}

int parse_count(const char *text, const char *option, long *value) {
    long parsed;
    if (!whole_long(text, &parsed) || parsed < 1) {
        fprintf(stderr, "error: %s takes an integer >= 1, got '%s'\n", option, text);
        return 0;
    }
    *value = parsed;
    return 1;
}

int parse_range(const char *text, const char *option, long low, long high, long *value) {
    long parsed;
    if (!whole_long(text, &parsed) || parsed < low || parsed > high) {
        fprintf(stderr, "error: %s takes an integer from %ld to %ld, got '%s'\n", option, low, high, text);
        return 0;
    }
    *value = parsed;
    return 1;
}

int parse_integer(const char *text, const char *option, long long *value) {
    char *end = NULL;
    errno = 0;
    long long parsed = strtoll(text, &end, 10);
    if (errno || end == text || *end) {
        fprintf(stderr, "error: %s takes an integer, got '%s'\n", option, text);
        return 0;
    }
    *value = parsed;
    return 1;
}
