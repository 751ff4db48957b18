/* The safetensors reader and writer (src/safetensors.c): a file the safetensors library wrote read
 * with its names, dtypes, shapes and values; a file written here read back the same and laid out
 * as the library lays it out; cut, damaged and foreign files refused with TAS_ERROR_FORMAT naming
 * why. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "fixtures.h"
#include "safetensors.h"

static void test_a_file_the_library_wrote_reads_with_its_values(void) {
    safetensors_file file;
    error_record error = {TAS_OK, ""};
    CHECK_INT(safetensors_read_memory(fixture_safetensors_file, fixture_safetensors_file_size, "data.safetensors",
                                      &file, &error), TAS_OK);
    CHECK_INT(file.count, 2);
    const safetensor *x = safetensors_find(&file, "x"), *y = safetensors_find(&file, "y");
    CHECK(safetensors_find(&file, "__metadata__") == NULL);
    if (CHECK(x != NULL && y != NULL)) {
        CHECK_INT(x->dtype, TAS_FLOAT32);
        CHECK(x->rank == 2 && x->shape[0] == 2 && x->shape[1] == 3);
        CHECK_INT(x->bytes, 24);
        float values[6];
        memcpy(values, x->data, sizeof values);
        for (int i = 0; i < 6; i++) CHECK(values[i] == (float)i - 2.5f);
        CHECK_INT(y->dtype, TAS_INT64);
        CHECK(y->rank == 1 && y->shape[0] == 2);
        int64_t labels[2];
        memcpy(labels, y->data, sizeof labels);
        CHECK(labels[0] == 5 && labels[1] == -7);
    }
    safetensors_free(&file);
}

typedef struct written {
    float a[3];
    uint8_t b[4];
    int32_t c;
} written;

static tas_status give_tensor(void *context, size_t index, void *buffer, error_record *error) {
    (void)error;
    const written *values = context;
    if (index == 0) memcpy(buffer, values->a, sizeof values->a);
    if (index == 1) memcpy(buffer, values->b, sizeof values->b);
    if (index == 2) memcpy(buffer, &values->c, sizeof values->c);
    return TAS_OK;
}

static void test_a_written_file_reads_back_the_same(const char *folder) {
    written values = {{1.5f, -2.0f, 1e-30f}, {0, 1, 254, 255}, -123456};
    static const int64_t A_SHAPE[] = {3}, B_SHAPE[] = {2, 2};
    const safetensor_output tensors[] = {
        {"a.weight", TAS_FLOAT32, 1, A_SHAPE, 12}, {"b", TAS_UINT8, 2, B_SHAPE, 4}, {"lr", TAS_INT32, 0, NULL, 4}};
    char path[1024];
    path_in(folder, "state.safetensors", path);
    error_record error = {TAS_OK, ""};
    CHECK_INT(safetensors_write(path, tensors, 3, give_tensor, &values, &error), TAS_OK);

    safetensors_file file;
    CHECK_INT(safetensors_read_file(path, &file, &error), TAS_OK);
    CHECK_INT(file.count, 3);
    const safetensor *a = safetensors_find(&file, "a.weight"), *b = safetensors_find(&file, "b"),
                     *lr = safetensors_find(&file, "lr");
    if (CHECK(a != NULL && b != NULL && lr != NULL)) {
        CHECK(a->dtype == TAS_FLOAT32 && a->rank == 1 && a->shape[0] == 3 && a->bytes == 12);
        CHECK_BYTES(a->data, values.a, sizeof values.a);
        CHECK(b->dtype == TAS_UINT8 && b->rank == 2 && b->shape[0] == 2 && b->shape[1] == 2);
        CHECK_BYTES(b->data, values.b, sizeof values.b);
        CHECK(lr->dtype == TAS_INT32 && lr->rank == 0 && lr->bytes == 4);
        CHECK_BYTES(lr->data, &values.c, sizeof values.c);
    }
    /* as the library writes: the header's length (little-endian, a multiple of 8, spaces after the
     * JSON), the header, the tensors' bytes in order */
    uint64_t header = 0;
    for (int i = 7; i >= 0; i--) header = header << 8 | file.data[i];
    CHECK_INT(header % 8, 0);
    CHECK_INT(file.size, 8 + header + 20);
    CHECK_INT(file.data[8], '{');
    CHECK_HAS((const char *)file.data + 8, "\"__metadata__\":{\"format\":\"pt\"}");
    CHECK(a != NULL && a->data == file.data + 8 + header);
    safetensors_free(&file);
    struct stat status;
    char temporary[1100];
    snprintf(temporary, sizeof temporary, "%s.%ld.tmp", path, (long)getpid());
    CHECK(stat(temporary, &status) != 0); /* (renamed into place) */
}

/* A file of `header` (its length prefixed) then `data_size` bytes; its status, the message in `error`. */
static tas_status read_made(const char *header, size_t data_size, error_record *error) {
    size_t length = strlen(header), size = 8 + length + data_size;
    uint8_t *bytes = calloc(size, 1);
    if (bytes == NULL) return TAS_ERROR_MEMORY;
    for (int i = 0; i < 8; i++) bytes[i] = (uint8_t)((uint64_t)length >> (8 * i));
    memcpy(bytes + 8, header, length);
    safetensors_file file;
    *error = (error_record){TAS_OK, ""};
    tas_status status = safetensors_read_memory(bytes, size, "made.safetensors", &file, error);
    safetensors_free(&file);
    free(bytes);
    return status;
}

static void test_damaged_and_foreign_files_are_refused_naming_why(void) {
    static const struct { const char *header; size_t data; const char *message; } CASES[] = {
        {"{\"x\": {\"dtype\": \"F16\", \"shape\": [2], \"data_offsets\": [0, 4]}}", 4,
         "made.safetensors: tensor x is F16; this runtime reads F32, I64, I32, BOOL and U8"},
        {"{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4]}}", 4,
         "data_offsets that do not match the dtype and shape of x"},
        {"{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 7,
         "data past the end of the file (truncated?) for x"},
        {"{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 9, "bytes after the last tensor's data"},
        {"{\"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
         "\"y\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}", 12,
         "tensors whose bytes overlap or leave gaps"},
        {"{\"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
         "\"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 8, "two entries for tensor x"},
        {"{\"x\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", 4,
         "a size that is not a whole number >= 0 in the shape of x"},
        {"{\"x\": {\"dtype\": \"F32\", \"shape\": [1, 1, 1, 1, 1, 1, 1, 1, 1], \"data_offsets\": [0, 4]}}", 4,
         "no shape of at most 8 sizes for tensor x"},
        {"{\"x\": [1, 2]}", 0, "the header's entry is not an object: x"},
        {"{\"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\"", 0, "a header that is not a JSON object"},
        {"[]", 0, "a header that is not a JSON object"},
    };
    error_record error;
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        CHECK_INT(read_made(CASES[i].header, CASES[i].data, &error), TAS_ERROR_FORMAT);
        CHECK_HAS(error.message, "made.safetensors");
        CHECK_HAS(error.message, CASES[i].message);
    }
    /* every cut of the library's file: a format error, never a read past the cut */
    for (size_t size = 0; size < fixture_safetensors_file_size; size++) {
        uint8_t *cut = malloc(size ? size : 1);
        if (!CHECK(cut != NULL)) return;
        memcpy(cut, fixture_safetensors_file, size);
        safetensors_file file;
        error = (error_record){TAS_OK, ""};
        CHECK_INT(safetensors_read_memory(cut, size, "cut.safetensors", &file, &error), TAS_ERROR_FORMAT);
        CHECK_HAS(error.message, size < 8 ? "shorter than its 8-byte header length" : "(truncated?)");
        safetensors_free(&file);
        free(cut);
    }
}

static void test_a_missing_file_is_a_file_error(const char *folder) {
    char path[1024];
    safetensors_file file;
    error_record error = {TAS_OK, ""};
    CHECK_INT(safetensors_read_file(path_in(folder, "absent.safetensors", path), &file, &error), TAS_ERROR_FILE);
    CHECK_HAS(error.message, "cannot open");
    CHECK_HAS(error.message, "absent.safetensors");
    safetensors_free(&file);
}

int main(void) {
    const char *folder = make_folder();
    test_a_file_the_library_wrote_reads_with_its_values();
    test_a_written_file_reads_back_the_same(folder);
    test_damaged_and_foreign_files_are_refused_naming_why();
    test_a_missing_file_is_a_file_error(folder);
    remove_folder(folder);
    return check_finish("test_safetensors");
}
