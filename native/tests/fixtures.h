/* Bytes the Python side wrote (native/tests/generate_fixtures.py writes fixtures.c), for the C
 * tests to read as the native runtime must: the same files, the same digests, the same order. */
#ifndef TORCH_ADRENO_STEP_TEST_FIXTURES_H
#define TORCH_ADRENO_STEP_TEST_FIXTURES_H

#include <stddef.h>

/* A step file (format 4) sealed by torch_adreno.runner.integrity: kernels k0 (global [6], local
 * [6], no build options) and k1 (global [1], local [1], options "-cl-fast-relaxed-math -DN=6"), a copy between them (identity 1 to 2, 24 bytes), the
 * initializer w = [0.3f], batch input batch_0 float32[4, 3], a fill [2, 4, 0, 4]. */
extern const unsigned char fixture_step_file[];
extern const size_t fixture_step_file_size;
extern const size_t fixture_step_w_offset;      /* w's 4 bytes in the file */
extern const size_t fixture_step_source_offset; /* a byte of k0's source in the file */

/* safetensors.numpy.save: x float32[2, 3] = arange(6) - 2.5, y int64[2] = [5, -7]. */
extern const unsigned char fixture_safetensors_file[];
extern const size_t fixture_safetensors_file_size;

/* numpy.savez (stored) and numpy.savez_compressed of x float32[5, 2] (row r: 10r, 10r + 1) and
 * y int64[5] (row r: r). */
extern const unsigned char fixture_npz_file[];
extern const size_t fixture_npz_file_size;
extern const size_t fixture_npz_y_offset; /* y's 40 bytes in the archive */
extern const unsigned char fixture_npz_compressed_file[];
extern const size_t fixture_npz_compressed_file_size;

/* torch_adreno.runner.data's batches of those examples, two to a batch: the rows of each of the
 * first 6 batches (3 epochs) for each seed. */
enum { FIXTURE_SEEDS = 2, FIXTURE_BATCHES = 6, FIXTURE_BATCH_SIZE = 2, FIXTURE_EXAMPLES = 5 };
extern const long long fixture_shuffle_seeds[FIXTURE_SEEDS];
extern const size_t fixture_shuffled_rows[FIXTURE_SEEDS][FIXTURE_BATCHES][FIXTURE_BATCH_SIZE];

#endif
