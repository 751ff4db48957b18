/* The .npz reader (src/npz.c): an archive numpy.savez wrote read with its arrays' names, dtypes,
 * shapes and values; a changed byte failing its CRC-32; numpy.savez_compressed refused naming it;
 * every cut of the archive refused with TAS_ERROR_FORMAT. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fixtures.h"
#include "npz.h"

static tas_status read_archive(const uint8_t *data, size_t size, safetensors_file *file, error_record *error) {
    *error = (error_record){TAS_OK, ""};
    return npz_read_memory(data, size, "data.npz", file, error);
}

static void test_an_archive_numpy_wrote_reads_with_its_values(void) {
    CHECK(npz_looks_like(fixture_npz_file, fixture_npz_file_size));
    CHECK(npz_looks_like(fixture_npz_compressed_file, fixture_npz_compressed_file_size));
    CHECK(!npz_looks_like(fixture_safetensors_file, fixture_safetensors_file_size));
    CHECK(!npz_looks_like(fixture_npz_file, 3));
    safetensors_file file;
    error_record error;
    CHECK_INT(read_archive(fixture_npz_file, fixture_npz_file_size, &file, &error), TAS_OK);
    CHECK_INT(file.count, 2);
    const safetensor *x = safetensors_find(&file, "x"), *y = safetensors_find(&file, "y");
    if (CHECK(x != NULL && y != NULL)) {
        CHECK(x->dtype == TAS_FLOAT32 && x->rank == 2 && x->shape[0] == 5 && x->shape[1] == 2 && x->bytes == 40);
        float values[10];
        memcpy(values, x->data, sizeof values);
        for (int row = 0; row < 5; row++)
            CHECK(values[2 * row] == 10.0f * (float)row && values[2 * row + 1] == 10.0f * (float)row + 1);
        CHECK(y->dtype == TAS_INT64 && y->rank == 1 && y->shape[0] == 5 && y->bytes == 40);
        CHECK(y->data == fixture_npz_file + fixture_npz_y_offset); /* not copied: a view of the archive */
        int64_t labels[5];
        memcpy(labels, y->data, sizeof labels);
        for (int row = 0; row < 5; row++) CHECK_INT(labels[row], row);
    }
    safetensors_free(&file);
}

static void test_changed_compressed_and_cut_archives_are_refused(void) {
    uint8_t *changed = malloc(fixture_npz_file_size);
    if (!CHECK(changed != NULL)) return;
    memcpy(changed, fixture_npz_file, fixture_npz_file_size);
    changed[fixture_npz_y_offset + 8] ^= 4; /* y[1] = 1 becomes 5 */
    safetensors_file file;
    error_record error;
    CHECK_INT(read_archive(changed, fixture_npz_file_size, &file, &error), TAS_ERROR_FORMAT);
    CHECK_HAS(error.message, "damaged file: data.npz: array y fails its CRC-32");
    safetensors_free(&file);
    free(changed);

    CHECK_INT(read_archive(fixture_npz_compressed_file, fixture_npz_compressed_file_size, &file, &error),
              TAS_ERROR_FORMAT);
    CHECK_HAS(error.message, "data.npz: array x is compressed (numpy.savez_compressed); the native runtime reads "
                             "uncompressed .npz archives");
    safetensors_free(&file);

    for (size_t size = 0; size < fixture_npz_file_size; size++) {
        uint8_t *cut = malloc(size ? size : 1);
        if (!CHECK(cut != NULL)) return;
        memcpy(cut, fixture_npz_file, size);
        CHECK_INT(read_archive(cut, size, &file, &error), TAS_ERROR_FORMAT);
        CHECK_HAS(error.message, "data.npz is not a valid .npz archive");
        safetensors_free(&file);
        free(cut);
    }
}

int main(void) {
    test_an_archive_numpy_wrote_reads_with_its_values();
    test_changed_compressed_and_cut_archives_are_refused();
    return check_finish("test_npz");
}
