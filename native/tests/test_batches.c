/* The command's batches (cli/batches.c) as torch_adreno.runner.data takes them: examples drawn two
 * to a batch in the order the Python runner draws for each seed (fixtures.c holds it), stacked
 * batches taken in turn under the short names x, y, batch_2, zeros without a data file, and the
 * data files that do not fit the step refused with exit status 2 naming why. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cli.h"
#include "fixtures.h"
#include "safetensors.h"

static tas_tensor_info input(const char *name, tas_dtype dtype, int rank, int64_t first, int64_t second, size_t bytes) {
    tas_tensor_info info = {name, dtype, rank, {first, second}, bytes};
    return info;
}

static void test_examples_come_in_the_python_runners_order(const char *folder) {
    char path[1024];
    path_in(folder, "examples.npz", path);
    if (!write_file(path, fixture_npz_file, fixture_npz_file_size)) return;
    const tas_tensor_info inputs[] = {input("x", TAS_FLOAT32, 2, FIXTURE_BATCH_SIZE, 2, 16),
                                      input("y", TAS_INT64, 1, FIXTURE_BATCH_SIZE, 0, 16)};
    for (int seed = 0; seed < FIXTURE_SEEDS; seed++) {
        batch_source *source = NULL;
        if (!CHECK_INT(batches_open(&source, inputs, 2, path, fixture_shuffle_seeds[seed]), 0)) continue;
        CHECK_INT(batches_rows(source), FIXTURE_EXAMPLES);
        CHECK(batches_bytes(source)[0] == 16 && batches_bytes(source)[1] == 16);
        /* steps 0..5, then 1 again (the stream restarted from the seed) */
        static const size_t STEPS[] = {0, 1, 2, 3, 4, 5, 1};
        for (size_t s = 0; s < sizeof STEPS / sizeof STEPS[0]; s++) {
            const void *const *batch = batches_at(source, STEPS[s]);
            float x[4];
            int64_t y[2];
            memcpy(x, batch[0], sizeof x);
            memcpy(y, batch[1], sizeof y);
            for (int r = 0; r < FIXTURE_BATCH_SIZE; r++) {
                int64_t row = (int64_t)fixture_shuffled_rows[seed][STEPS[s]][r];
                CHECK_INT(y[r], row);
                CHECK(x[2 * r] == 10.0f * (float)row && x[2 * r + 1] == 10.0f * (float)row + 1);
            }
        }
        batches_close(source);
    }
}

typedef struct stacked {
    float a[3][2];
    int64_t b[3];
    uint8_t c[3][4];
} stacked;

static tas_status give_stacked(void *context, size_t index, void *buffer, error_record *error) {
    (void)error;
    const stacked *values = context;
    if (index == 0) memcpy(buffer, values->a, sizeof values->a);
    if (index == 1) memcpy(buffer, values->b, sizeof values->b);
    if (index == 2) memcpy(buffer, values->c, sizeof values->c);
    return TAS_OK;
}

/* Three stacked batches of three inputs, the arrays named x, y, batch_2 (the step's names differ). */
static void test_stacked_batches_under_short_names_come_in_turn(const char *folder) {
    stacked values = {{{1, 2}, {3, 4}, {5, 6}}, {7, 8, 9}, {{1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10, 11, 12}}};
    static const int64_t A_SHAPE[] = {3, 2}, B_SHAPE[] = {3}, C_SHAPE[] = {3, 4};
    const safetensor_output arrays[] = {{"x", TAS_FLOAT32, 2, A_SHAPE, 24}, {"y", TAS_INT64, 1, B_SHAPE, 24},
                                        {"batch_2", TAS_UINT8, 2, C_SHAPE, 12}};
    char path[1024];
    path_in(folder, "stacked.safetensors", path);
    error_record error = {TAS_OK, ""};
    if (!CHECK_INT(safetensors_write(path, arrays, 3, give_stacked, &values, &error), TAS_OK)) return;
    const tas_tensor_info inputs[] = {input("features", TAS_FLOAT32, 1, 2, 0, 8), input("label", TAS_INT64, 0, 0, 0, 8),
                                      input("mask", TAS_UINT8, 1, 4, 0, 4)};
    batch_source *source = NULL;
    if (!CHECK_INT(batches_open(&source, inputs, 3, path, 99), 0)) return;
    CHECK_INT(batches_rows(source), 3);
    for (size_t step = 0; step < 7; step++) { /* step i takes row i mod 3, whatever the seed */
        const void *const *batch = batches_at(source, step);
        CHECK_BYTES(batch[0], values.a[step % 3], 8);
        CHECK_BYTES(batch[1], &values.b[step % 3], 8);
        CHECK_BYTES(batch[2], values.c[step % 3], 4);
    }
    batches_close(source);
}

static void test_without_a_data_file_every_batch_is_zeros(void) {
    const tas_tensor_info inputs[] = {input("x", TAS_FLOAT32, 2, 4, 8, 128), input("y", TAS_INT64, 1, 4, 0, 32)};
    batch_source *source = NULL;
    if (!CHECK_INT(batches_open(&source, inputs, 2, NULL, 0), 0)) return;
    CHECK_INT(batches_rows(source), 1);
    static const uint8_t ZEROS[128];
    const void *const *batch = batches_at(source, 5);
    CHECK_BYTES(batch[0], ZEROS, 128);
    CHECK_BYTES(batch[1], ZEROS, 32);
    batches_close(source);
}

/* batches_open of `path` for `inputs`: its exit status; the message printed in *message. */
static int open_failing(const char *path, const tas_tensor_info *inputs, size_t count, const char **message) {
    batch_source *source = (batch_source *)inputs; /* (must come back NULL) */
    capture_begin();
    int result = batches_open(&source, inputs, count, path, 0);
    *message = capture_end();
    CHECK(source == NULL);
    batches_close(source);
    return result;
}

static void test_data_files_that_do_not_fit_are_refused_naming_why(const char *folder) {
    char path[1024], text_path[1024];
    path_in(folder, "examples.npz", path); /* (x float32[5, 2], y int64[5]) */
    const char *message = NULL;
    const tas_tensor_info wrong_dtype[] = {input("x", TAS_FLOAT32, 2, 2, 2, 16), input("y", TAS_INT32, 1, 2, 0, 8)};
    CHECK_INT(open_failing(path, wrong_dtype, 2, &message), EXIT_BAD_INPUT);
    CHECK_HAS(message, "array y is int64; the step takes y int32[2]: convert it (numpy: .astype(np.int32))");

    const tas_tensor_info missing[] = {input("x", TAS_FLOAT32, 2, 2, 2, 16), input("y", TAS_INT64, 1, 2, 0, 16),
                                       input("z", TAS_INT64, 1, 2, 0, 16)};
    CHECK_INT(open_failing(path, missing, 3, &message), EXIT_BAD_INPUT);
    CHECK_HAS(message, "has no array for every batch input (it has x, y); the step takes x float32[2, 2], y "
                       "int64[2], z int64[2], named so or x, y");

    const tas_tensor_info mixed[] = {input("x", TAS_FLOAT32, 1, 2, 0, 8), input("y", TAS_INT64, 1, 2, 0, 16)};
    CHECK_INT(open_failing(path, mixed, 2, &message), EXIT_BAD_INPUT); /* x stacked [5][2], y examples */
    CHECK_HAS(message, "some arrays stack batches over steps and others hold examples; use one layout");

    const tas_tensor_info too_few[] = {input("x", TAS_FLOAT32, 2, 8, 2, 64), input("y", TAS_INT64, 1, 8, 0, 64)};
    CHECK_INT(open_failing(path, too_few, 2, &message), EXIT_BAD_INPUT);
    CHECK_HAS(message, "array x is x float32[5, 2]; for x float32[8, 2] it holds batches stacked over steps");

    const tas_tensor_info sizes[] = {input("x", TAS_FLOAT32, 2, 2, 2, 16), input("y", TAS_INT64, 1, 1, 0, 8)};
    CHECK_INT(open_failing(path, sizes, 2, &message), EXIT_BAD_INPUT);
    CHECK_HAS(message, "holds examples, but the step's inputs differ in batch size");

    path_in(folder, "notes.txt", text_path);
    if (!write_file(text_path, "just some text, not data\n", 25)) return;
    CHECK_INT(open_failing(text_path, wrong_dtype, 2, &message), EXIT_BAD_INPUT);
    CHECK_HAS(message, "notes.txt is neither a safetensors file nor an .npz archive");

    path_in(folder, "absent.npz", text_path);
    CHECK_INT(open_failing(text_path, wrong_dtype, 2, &message), EXIT_BAD_INPUT);
    CHECK_HAS(message, "cannot open");
}

int main(void) {
    const char *folder = make_folder();
    test_examples_come_in_the_python_runners_order(folder);
    test_stacked_batches_under_short_names_come_in_turn(folder);
    test_without_a_data_file_every_batch_is_zeros();
    test_data_files_that_do_not_fit_are_refused_naming_why(folder);
    remove_folder(folder);
    return check_finish("test_batches");
}
