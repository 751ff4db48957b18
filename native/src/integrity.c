#include "integrity.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "sha256.h"
#include "step_plan.h"

#define SOURCE_ATTRIBUTE "opencl_source"
/* At most this many damaged parts are named in one message (runner/integrity.py NAMED_PARTS). */
enum { NAMED_PARTS = 4 };

static void update_u64(tas_sha256 *digest, uint64_t value) {
    uint8_t bytes[8];
    for (int i = 0; i < 8; i++) bytes[i] = (uint8_t)(value >> (8 * i));
    tas_sha256_update(digest, bytes, sizeof bytes);
}

static void update_text(tas_sha256 *digest, const char *text) {
    size_t length = text ? strlen(text) : 0;
    update_u64(digest, length);
    if (length) tas_sha256_update(digest, text, length);
}

static void finish_hex(tas_sha256 *digest, char hex[2 * TAS_SHA256_BYTES + 1]) {
    uint8_t bytes[TAS_SHA256_BYTES];
    tas_sha256_final(digest, bytes);
    for (int i = 0; i < TAS_SHA256_BYTES; i++) snprintf(hex + 2 * i, 3, "%02x", bytes[i]);
}

static int is_step_node(const onnx_node *node) {
    return node->domain != NULL && strcmp(node->domain, STEP_DOMAIN) == 0;
}

static void kernel_sources_digest(const onnx_model *model, char hex[2 * TAS_SHA256_BYTES + 1]) {
    tas_sha256 digest;
    tas_sha256_init(&digest);
    for (size_t n = 0; n < model->node_count; n++) {
        const onnx_node *node = &model->nodes[n];
        if (!is_step_node(node) || (node->op_type && strcmp(node->op_type, STEP_COPY_OP) == 0)) continue;
        for (size_t a = 0; a < node->attribute_count; a++)
            if (node->attributes[a].name && strcmp(node->attributes[a].name, SOURCE_ATTRIBUTE) == 0)
                update_text(&digest, node->attributes[a].s);
    }
    finish_hex(&digest, hex);
}

static void update_attribute(tas_sha256 *digest, const onnx_attribute *attribute) {
    update_text(digest, attribute->name);
    update_u64(digest, (uint64_t)(int64_t)attribute->type);
    switch (attribute->type) {
    case ONNX_ATTRIBUTE_INT: update_u64(digest, (uint64_t)attribute->i); break;
    case ONNX_ATTRIBUTE_INTS:
        update_u64(digest, attribute->ints.count);
        for (size_t i = 0; i < attribute->ints.count; i++) update_u64(digest, (uint64_t)attribute->ints.items[i]);
        break;
    case ONNX_ATTRIBUTE_STRING: update_text(digest, attribute->s); break;
    case ONNX_ATTRIBUTE_STRINGS:
        update_u64(digest, attribute->strings.count);
        for (size_t i = 0; i < attribute->strings.count; i++) update_text(digest, attribute->strings.items[i]);
        break;
    default: break;
    }
}

static void operations_digest(const onnx_model *model, char hex[2 * TAS_SHA256_BYTES + 1]) {
    tas_sha256 digest;
    tas_sha256_init(&digest);
    update_text(&digest, onnx_metadata(model, STEP_PLAN_KEY));
    for (size_t n = 0; n < model->node_count; n++) {
        const onnx_node *node = &model->nodes[n];
        if (!is_step_node(node)) continue;
        update_text(&digest, node->name);
        update_text(&digest, node->op_type);
        for (size_t a = 0; a < node->attribute_count; a++)
            if (!(node->attributes[a].name && strcmp(node->attributes[a].name, SOURCE_ATTRIBUTE) == 0))
                update_attribute(&digest, &node->attributes[a]);
    }
    finish_hex(&digest, hex);
}

/* The digest of an initializer's values as a runner uploads them, little-endian (the hosts this
 * runs on are; the upload copies the same bytes): raw_data as it is; typed fields as their
 * element type's bytes, bool and uint8 narrowed from int32_data to one byte each. 0 for an
 * element type the step format does not use held in int32_data. */
static int tensor_digest(const onnx_initializer *tensor, char hex[2 * TAS_SHA256_BYTES + 1]) {
    tas_sha256 digest;
    tas_sha256_init(&digest);
    switch (tensor->storage) {
    case STORAGE_NONE: break;
    case STORAGE_RAW: tas_sha256_update(&digest, tensor->raw, tensor->raw_length); break;
    case STORAGE_FLOATS: tas_sha256_update(&digest, tensor->values, tensor->value_count * sizeof(float)); break;
    case STORAGE_INT64S: tas_sha256_update(&digest, tensor->values, tensor->value_count * sizeof(int64_t)); break;
    case STORAGE_INT32S: {
        tas_dtype dtype;
        if (!dtype_from_onnx(tensor->data_type, &dtype) || dtype == TAS_FLOAT32 || dtype == TAS_INT64) return 0;
        const int32_t *values = tensor->values;
        for (size_t i = 0; i < tensor->value_count; i++) {
            uint8_t narrow = (uint8_t)values[i];
            if (dtype == TAS_INT32) tas_sha256_update(&digest, &values[i], sizeof values[i]);
            else tas_sha256_update(&digest, &narrow, 1);
        }
        break;
    }
    }
    finish_hex(&digest, hex);
    return 1;
}

typedef struct damage {
    char named[1200];
    size_t count;
} damage;

static void add_damage(damage *found, const char *part, const char *name) {
    if (found->count++ >= NAMED_PARTS) return;
    size_t used = strlen(found->named);
    snprintf(found->named + used, sizeof found->named - used, "%s%s%.200s", used ? ", " : "", part, name ? name : "");
}

static const char *record_text(const cJSON *record, const char *key) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(record, key);
    return cJSON_IsString(item) ? item->valuestring : NULL;
}

static tas_status unreadable(const char *origin, error_record *error) {
    return fail(error, TAS_ERROR_FORMAT,
                "damaged file: %s: its integrity record (metadata " STEP_INTEGRITY_KEY ") is unreadable: copy or export "
                "the file again", origin);
}

static tas_status compare(const onnx_model *model, const char *origin, const cJSON *record, error_record *error) {
    if (record == NULL) return unreadable(origin, error);
    const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(record, "tensors");
    const char *algorithm = record_text(record, "algorithm");
    const char *kernels = record_text(record, "kernel_sources"), *operations = record_text(record, "operations");
    int readable = cJSON_IsObject(tensors) && algorithm && strcmp(algorithm, "sha256") == 0 && kernels && operations;
    for (const cJSON *entry = readable ? tensors->child : NULL; entry; entry = entry->next)
        readable &= cJSON_IsString(entry) && entry->string != NULL;
    if (!readable) return unreadable(origin, error);
    damage found;
    memset(&found, 0, sizeof found);
    char hex[2 * TAS_SHA256_BYTES + 1];
    kernel_sources_digest(model, hex);
    if (strcmp(hex, kernels) != 0) add_damage(&found, "the kernel sources", NULL);
    operations_digest(model, hex);
    if (strcmp(hex, operations) != 0) add_damage(&found, "the operations and memory plan", NULL);
    for (size_t i = 0; i < model->initializer_count; i++) {
        const onnx_initializer *tensor = &model->initializers[i];
        const char *name = tensor->name ? tensor->name : "";
        const char *expected = record_text(tensors, name);
        if (expected == NULL) {
            char part[260];
            snprintf(part, sizeof part, "initializer %.200s (not in the record)", name);
            add_damage(&found, part, NULL);
        } else if (!tensor_digest(tensor, hex) || strcmp(hex, expected) != 0) {
            add_damage(&found, "the data of initializer ", name);
        }
    }
    for (const cJSON *entry = tensors->child; entry; entry = entry->next)
        if (onnx_find_initializer(model, entry->string) == NULL) {
            char part[260];
            snprintf(part, sizeof part, "initializer %.200s (missing)", entry->string);
            add_damage(&found, part, NULL);
        }
    if (found.count == 0) return TAS_OK;
    char more[48] = "";
    if (found.count > NAMED_PARTS) snprintf(more, sizeof more, " and %zu more", found.count - NAMED_PARTS);
    return fail(error, TAS_ERROR_FORMAT,
                "damaged file: %s: %s%s: not as exported (its SHA-256 differs from the file's integrity record: "
                "changed or corrupted since): copy or export the file again", origin, found.named, more);
}

tas_status integrity_verify(const onnx_model *model, const char *origin, error_record *error) {
    const char *text = onnx_metadata(model, STEP_INTEGRITY_KEY);
    if (text == NULL)
        return fail(error, TAS_ERROR_FORMAT,
                    "damaged file: %s has no integrity record (metadata " STEP_INTEGRITY_KEY "); a step file holds one "
                    "from its export: export it again", origin);
    cJSON *record = cJSON_Parse(text);
    tas_status status = compare(model, origin, record, error); /* (NULL: not JSON, unreadable) */
    cJSON_Delete(record);
    return status;
}
