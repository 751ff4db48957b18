/* The fuzz target of the ONNX step-file reader (with the integrity and plan checks), the safetensors
 * reader and the .npz reader.
 *
 * LLVMFuzzerTestOneInput is libFuzzer's entry (clang -fsanitize=fuzzer,address fuzz_readers.c
 * with -DTAS_LIBFUZZER, linked with the library). Without libFuzzer, main() is a deterministic
 * mutation loop: `fuzz-readers onnx|safetensors|npz SEED_FILE ITERATIONS [RANDOM_SEED]` mutates the seed
 * file (bit flips, byte sets, truncations, cut-and-repeat, length fields pushed to extremes) and
 * reads each mutant; a crash, a sanitizer report or a hang is the failure, an error status is
 * the expected outcome. Built with -fsanitize=address,undefined in the test suite. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "integrity.h"
#include "npz.h"
#include "onnx_reader.h"
#include "safetensors.h"
#include "step_plan.h"

static int read_step_bytes(const uint8_t *data, size_t size) {
    error_record error = {TAS_OK, ""};
    onnx_model model;
    step_plan plan;
    memset(&plan, 0, sizeof plan);
    tas_status status = onnx_read_memory(data, size, "the input", &model, &error);
    /* The integrity check runs on every mutant, but does not gate the plan's reader: a mutant
     * almost never matches its record, and the plan's checks are what is fuzzed behind it. */
    if (status == TAS_OK) integrity_verify(&model, "the input", &error);
    if (status == TAS_OK) status = plan_read(&model, "the input", &plan, &error);
    plan_free(&plan);
    onnx_free(&model);
    return status == TAS_OK;
}

static int read_safetensors_bytes(const uint8_t *data, size_t size) {
    error_record error = {TAS_OK, ""};
    safetensors_file file;
    tas_status status = safetensors_read_memory(data, size, "the input", &file, &error);
    safetensors_free(&file);
    return status == TAS_OK;
}

static int read_npz_bytes(const uint8_t *data, size_t size) {
    error_record error = {TAS_OK, ""};
    safetensors_file file;
    tas_status status = npz_read_memory(data, size, "the input", &file, &error);
    safetensors_free(&file);
    return status == TAS_OK;
}

/* libFuzzer: the first byte picks the reader. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    switch (data[0] % 3) {
    case 0: read_step_bytes(data + 1, size - 1); break;
    case 1: read_safetensors_bytes(data + 1, size - 1); break;
    default: read_npz_bytes(data + 1, size - 1); break;
    }
    return 0;
}

#ifndef TAS_LIBFUZZER
static uint64_t next_random(uint64_t *state) { /* splitmix64 */
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* One to four mutations of `seed` into `out` (room for 2 * size + 16); returns the new size. */
static size_t mutate(const uint8_t *seed, size_t size, uint8_t *out, uint64_t *random) {
    memcpy(out, seed, size);
    size_t length = size;
    int rounds = 1 + (int)(next_random(random) % 4);
    for (int r = 0; r < rounds && length > 0; r++) {
        size_t at = (size_t)(next_random(random) % length);
        switch (next_random(random) % 6) {
        case 0: out[at] ^= (uint8_t)(1u << (next_random(random) % 8)); break;            /* a bit flip */
        case 1: out[at] = (uint8_t)next_random(random); break;                           /* a random byte */
        case 2: out[at] = (next_random(random) & 1) ? 0xff : 0x00; break;                /* an extreme byte */
        case 3: length = at; break;                                                       /* truncation */
        case 4: {                                                                         /* a varint made huge */
            size_t n = 1 + (size_t)(next_random(random) % 9);
            for (size_t i = 0; i < n && at + i < length; i++) out[at + i] |= 0x80;
            break;
        }
        default: {                                                                        /* a span repeated */
            size_t span = 1 + (size_t)(next_random(random) % 64);
            if (at + span > length) span = length - at;
            if (length + span <= 2 * size + 16) {
                memmove(out + at + span, out + at, length - at);
                length += span;
            }
        }
        }
    }
    return length;
}

int main(int argc, char **argv) {
    if (argc < 4 || (strcmp(argv[1], "onnx") != 0 && strcmp(argv[1], "safetensors") != 0 && strcmp(argv[1], "npz") != 0)) {
        fprintf(stderr, "usage: fuzz-readers onnx|safetensors|npz SEED_FILE ITERATIONS [RANDOM_SEED]\n");
        return 2;
    }
    FILE *file = fopen(argv[2], "rb");
    if (file == NULL) {
        fprintf(stderr, "error: cannot open %s\n", argv[2]);
        return 2;
    }
    fseek(file, 0, SEEK_END);
    long size = ftell(file);
    fseek(file, 0, SEEK_SET);
    uint8_t *seed = malloc((size_t)size + 1), *mutant = malloc(2 * (size_t)size + 16);
    if (seed == NULL || mutant == NULL || fread(seed, 1, (size_t)size, file) != (size_t)size) {
        fprintf(stderr, "error: cannot read %s\n", argv[2]);
        return 2;
    }
    fclose(file);
    long iterations = atol(argv[3]);
    uint64_t random = argc > 4 ? strtoull(argv[4], NULL, 10) : 1;
    int (*reader)(const uint8_t *, size_t) = strcmp(argv[1], "onnx") == 0          ? read_step_bytes
                                             : strcmp(argv[1], "safetensors") == 0 ? read_safetensors_bytes
                                                                                   : read_npz_bytes;
    if (!reader(seed, (size_t)size)) {
        fprintf(stderr, "error: the seed file %s itself is refused: pick a valid one\n", argv[2]);
        return 2;
    }
    long accepted = 0;
    for (long i = 0; i < iterations; i++) {
        size_t length = mutate(seed, (size_t)size, mutant, &random);
        /* an exact-size copy, so that a read past the end is a sanitizer report */
        uint8_t *exact = malloc(length ? length : 1);
        memcpy(exact, mutant, length);
        accepted += reader(exact, length);
        free(exact);
    }
    printf("%ld mutants of %s read: %ld accepted, %ld refused, no crash\n", iterations, argv[2], accepted,
           iterations - accepted);
    free(seed);
    free(mutant);
    return 0;
}
#endif
