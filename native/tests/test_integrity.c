/* SHA-256 (third_party/sha256) against FIPS 180-2's test vectors, and the integrity check of a step
 * file (src/integrity.c) against the record torch_adreno.runner.integrity sealed into it: the
 * file as sealed passes; a changed initializer, kernel source or plan is refused naming the part;
 * a missing or unreadable record is refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fixtures.h"
#include "integrity.h"
#include "sha256.h"
#include "step_plan.h"

static void hex_of(const uint8_t digest[TAS_SHA256_BYTES], char hex[2 * TAS_SHA256_BYTES + 1]) {
    for (int i = 0; i < TAS_SHA256_BYTES; i++) snprintf(hex + 2 * i, 3, "%02x", digest[i]);
}

/* The digest of `size` bytes fed to tas_sha256_update `piece` bytes at a time. */
static void digest_in_pieces(const void *data, size_t size, size_t piece, char hex[2 * TAS_SHA256_BYTES + 1]) {
    tas_sha256 state;
    uint8_t digest[TAS_SHA256_BYTES];
    tas_sha256_init(&state);
    for (size_t at = 0; at < size; at += piece)
        tas_sha256_update(&state, (const uint8_t *)data + at, size - at < piece ? size - at : piece);
    tas_sha256_final(&state, digest);
    hex_of(digest, hex);
}

static void test_sha256_vectors(void) {
    static const struct { const char *message, *digest; } VECTORS[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrst"
         "nopqrstu", "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    };
    char hex[2 * TAS_SHA256_BYTES + 1];
    for (size_t v = 0; v < sizeof VECTORS / sizeof VECTORS[0]; v++) {
        size_t size = strlen(VECTORS[v].message);
        /* whole, a byte at a time, and in pieces that straddle the 64-byte blocks */
        static const size_t PIECES[] = {1, 3, 63, 65, 1000};
        for (size_t p = 0; p < sizeof PIECES / sizeof PIECES[0]; p++) {
            digest_in_pieces(VECTORS[v].message, size, PIECES[p], hex);
            CHECK_TEXT(hex, VECTORS[v].digest);
        }
    }
    char *million = malloc(1000000);
    CHECK(million != NULL);
    if (million == NULL) return;
    memset(million, 'a', 1000000);
    digest_in_pieces(million, 1000000, 4096, hex);
    CHECK_TEXT(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(million);
}

/* Reads `bytes` (the fixture, maybe changed) and checks its integrity; the message in `error`. */
static tas_status verify_bytes(const uint8_t *bytes, error_record *error) {
    onnx_model model;
    tas_status status = onnx_read_memory(bytes, fixture_step_file_size, "step.onnx", &model, error);
    CHECK_INT(status, TAS_OK);
    if (status == TAS_OK) status = integrity_verify(&model, "step.onnx", error);
    onnx_free(&model);
    return status;
}

static uint8_t *copy_of_step_file(void) {
    uint8_t *copy = malloc(fixture_step_file_size);
    if (copy != NULL) memcpy(copy, fixture_step_file, fixture_step_file_size);
    return copy;
}

static void test_the_sealed_file_passes_and_a_changed_part_is_named(void) {
    error_record error = {TAS_OK, ""};
    CHECK_INT(verify_bytes(fixture_step_file, &error), TAS_OK);

    uint8_t *changed = copy_of_step_file();
    if (!CHECK(changed != NULL)) return;
    /* w = 0.3f: the record holds hashlib's SHA-256 of these 4 bytes */
    float w;
    memcpy(&w, changed + fixture_step_w_offset, sizeof w);
    CHECK(w == 0.3f);
    changed[fixture_step_w_offset] ^= 1; /* one bit of the parameter */
    error = (error_record){TAS_OK, ""};
    CHECK_INT(verify_bytes(changed, &error), TAS_ERROR_FORMAT);
    CHECK_HAS(error.message, "damaged file: step.onnx: the data of initializer w: not as exported");
    CHECK_LACKS(error.message, "kernel sources");
    changed[fixture_step_w_offset] ^= 1;

    CHECK_INT(changed[fixture_step_source_offset + 9], '2'); /* "in0[i] * 2.0f" */
    changed[fixture_step_source_offset + 9] = '3';
    error = (error_record){TAS_OK, ""};
    CHECK_INT(verify_bytes(changed, &error), TAS_ERROR_FORMAT);
    CHECK_HAS(error.message, "damaged file: step.onnx: the kernel sources: not as exported");
    CHECK_LACKS(error.message, "initializer");
    free(changed);
}

/* The model's metadata value of `key` (heap text the reader made), or NULL. */
static char **metadata_slot(onnx_model *model, const char *key) {
    for (size_t i = 0; i < model->metadata_keys.count; i++)
        if (strcmp(model->metadata_keys.items[i], key) == 0) return &model->metadata_values.items[i];
    return NULL;
}

static void test_a_changed_plan_and_a_missing_or_unreadable_record_are_refused(void) {
    onnx_model model;
    error_record error = {TAS_OK, ""};
    if (!CHECK_INT(onnx_read_memory(fixture_step_file, fixture_step_file_size, "step.onnx", &model, &error), TAS_OK))
        return;
    char **plan = metadata_slot(&model, STEP_PLAN_KEY), **record = metadata_slot(&model, STEP_INTEGRITY_KEY);
    CHECK(plan != NULL && record != NULL);
    if (plan == NULL || record == NULL) {
        onnx_free(&model);
        return;
    }
    char *kept = *plan;
    *plan = copy_text(kept, strlen(kept) - 1); /* the plan's JSON without its closing brace */
    CHECK_INT(integrity_verify(&model, "step.onnx", &error), TAS_ERROR_FORMAT);
    CHECK_HAS(error.message, "the operations and memory plan: not as exported");
    free(*plan);
    *plan = kept;
    CHECK_INT(integrity_verify(&model, "step.onnx", &error), TAS_OK);

    kept = *record;
    const char *other = "{\"algorithm\": \"md5\"}";
    *record = copy_text(other, strlen(other));
    CHECK_INT(integrity_verify(&model, "step.onnx", &error), TAS_ERROR_FORMAT);
    CHECK_HAS(error.message, "damaged file: step.onnx: its integrity record (metadata torch_adreno.integrity) is "
                             "unreadable");
    free(*record);
    *record = kept;

    char **key = NULL;
    for (size_t i = 0; i < model.metadata_keys.count; i++)
        if (strcmp(model.metadata_keys.items[i], STEP_INTEGRITY_KEY) == 0) key = &model.metadata_keys.items[i];
    (*key)[0] = 'T'; /* the record under another key: none */
    CHECK_INT(integrity_verify(&model, "step.onnx", &error), TAS_ERROR_FORMAT);
    CHECK_HAS(error.message, "damaged file: step.onnx has no integrity record");
    onnx_free(&model);
}

int main(void) {
    test_sha256_vectors();
    test_the_sealed_file_passes_and_a_changed_part_is_named();
    test_a_changed_plan_and_a_missing_or_unreadable_record_are_refused();
    return check_finish("test_integrity");
}
