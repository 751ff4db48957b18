#include "npz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The zip records this reader uses (PKWARE's APPNOTE.TXT): end of central directory, its zip64
 * locator and record, central directory entries, local file headers. */
#define END_SIGNATURE 0x06054b50u
#define ZIP64_LOCATOR_SIGNATURE 0x07064b50u
#define ZIP64_END_SIGNATURE 0x06064b50u
#define ENTRY_SIGNATURE 0x02014b50u
#define LOCAL_SIGNATURE 0x04034b50u
enum { END_BYTES = 22, ZIP64_LOCATOR_BYTES = 20, ZIP64_END_BYTES = 56, ENTRY_BYTES = 46, LOCAL_BYTES = 30 };
/* A .npy header longer than this is not one numpy wrote for the arrays of a step. */
#define MAX_NPY_HEADER 65536u

static uint64_t little(const uint8_t *at, int bytes) {
    uint64_t value = 0;
    for (int i = bytes - 1; i >= 0; i--) value = value << 8 | at[i];
    return value;
}

static tas_status bad_archive(error_record *error, const char *origin, const char *what, const char *name) {
    return fail(error, TAS_ERROR_FORMAT, "%s is not a valid .npz archive: %s%s%.200s; write it again with numpy.savez",
                origin, what, name ? " " : "", name ? name : "");
}

/* CRC-32 (the zip polynomial, reflected), four bits at a time. */
static uint32_t crc32_of(const uint8_t *data, size_t size) {
    static const uint32_t NIBBLE[16] = {
        0x00000000u, 0x1db71064u, 0x3b6e20c8u, 0x26d930acu, 0x76dc4190u, 0x6b6b51f4u, 0x4db26158u, 0x5005713cu,
        0xedb88320u, 0xf00f9344u, 0xd6d6a3e8u, 0xcb61b38cu, 0x9b64c2b0u, 0x86d3d2d4u, 0xa00ae278u, 0xbdbdf21cu};
    uint32_t crc = 0xffffffffu;
    for (size_t i = 0; i < size; i++) {
        crc ^= data[i];
        crc = (crc >> 4) ^ NIBBLE[crc & 15u];
        crc = (crc >> 4) ^ NIBBLE[crc & 15u];
    }
    return ~crc;
}

int npz_looks_like(const uint8_t *data, size_t size) {
    return size >= 4 && data[0] == 'P' && data[1] == 'K' &&
           ((data[2] == 3 && data[3] == 4) || (data[2] == 5 && data[3] == 6));
}

typedef struct directory {
    uint64_t entries, offset, size;
} directory;

static tas_status find_directory(const uint8_t *data, size_t size, const char *origin, directory *found,
                                 error_record *error) {
    if (size < END_BYTES) return bad_archive(error, origin, "shorter than a zip's end record", NULL);
    size_t end = size - END_BYTES, lowest = size - END_BYTES > 65535u ? size - END_BYTES - 65535u : 0;
    while (little(data + end, 4) != END_SIGNATURE) {
        if (end == lowest) return bad_archive(error, origin, "no end of central directory (truncated?)", NULL);
        end -= 1;
    }
    found->entries = little(data + end + 10, 2);
    found->size = little(data + end + 12, 4);
    found->offset = little(data + end + 16, 4);
    if (found->entries == 0xffffu || found->size == 0xffffffffu || found->offset == 0xffffffffu) {
        if (end < ZIP64_LOCATOR_BYTES || little(data + end - ZIP64_LOCATOR_BYTES, 4) != ZIP64_LOCATOR_SIGNATURE)
            return bad_archive(error, origin, "a zip64 end record without its locator", NULL);
        uint64_t record = little(data + end - ZIP64_LOCATOR_BYTES + 8, 8);
        if (size < ZIP64_END_BYTES || record > size - ZIP64_END_BYTES || little(data + record, 4) != ZIP64_END_SIGNATURE)
            return bad_archive(error, origin, "a zip64 locator pointing at no zip64 end record", NULL);
        found->entries = little(data + record + 32, 8);
        found->size = little(data + record + 40, 8);
        found->offset = little(data + record + 48, 8);
    }
    if (found->offset > size || found->size > size - found->offset || found->entries > found->size / ENTRY_BYTES)
        return bad_archive(error, origin, "a central directory outside the file (truncated?)", NULL);
    return TAS_OK;
}

/* The sizes and offset a zip64 extra field holds in place of those set to all ones. */
static int read_zip64_extra(const uint8_t *extra, size_t length, uint64_t *uncompressed, uint64_t *compressed,
                            uint64_t *local) {
    uint64_t *fields[3] = {uncompressed, compressed, local};
    for (size_t at = 0; at + 4 <= length;) {
        uint64_t id = little(extra + at, 2), bytes = little(extra + at + 2, 2);
        if (bytes > length - at - 4) return 0;
        if (id == 1) {
            size_t position = at + 4;
            for (int i = 0; i < 3; i++) {
                if (*fields[i] != 0xffffffffu) continue;
                if (position + 8 > at + 4 + bytes) return 0;
                *fields[i] = little(extra + position, 8);
                position += 8;
            }
        }
        at += 4 + (size_t)bytes;
    }
    return *uncompressed != 0xffffffffu && *compressed != 0xffffffffu && *local != 0xffffffffu;
}

/* The value after `'key':` in a .npy header (a Python dict literal), or NULL. */
static const char *header_value(const char *header, const char *key) {
    const char *at = strstr(header, key);
    if (at == NULL) return NULL;
    at += strlen(key);
    while (*at == ' ') at++;
    return at;
}

/* The dtype, order and shape of a .npy header: a Python dict literal, NUL-terminated. */
static tas_status read_npy_header(const char *header, const char *origin, safetensor *tensor, error_record *error) {
    const char *name = tensor->name;
    const char *descr = header_value(header, "'descr':"), *order = header_value(header, "'fortran_order':");
    const char *shape = header_value(header, "'shape':");
    if (descr == NULL || order == NULL || shape == NULL || *descr != '\'' || *shape != '(')
        return bad_archive(error, origin, "a .npy header without descr, fortran_order and shape for array", name);
    static const struct { const char *descr; tas_dtype dtype; } DTYPES[] = {
        {"'<f4'", TAS_FLOAT32}, {"'<i8'", TAS_INT64}, {"'<i4'", TAS_INT32}, {"'|b1'", TAS_BOOL}, {"'|u1'", TAS_UINT8}};
    size_t kind = 0;
    while (kind < sizeof DTYPES / sizeof DTYPES[0] && strncmp(descr, DTYPES[kind].descr, 5) != 0) kind++;
    if (kind == sizeof DTYPES / sizeof DTYPES[0]) {
        const char *close = strchr(descr + 1, '\'');
        return fail(error, TAS_ERROR_FORMAT,
                    "%s: array %s has dtype %.*s; the runners read float32, int64, int32, bool and uint8 (little-endian): "
                    "convert it (numpy: .astype)", origin, name, close ? (int)(close - descr + 1) : 8, descr);
    }
    tensor->dtype = DTYPES[kind].dtype;
    if (strncmp(order, "False", 5) != 0)
        return fail(error, TAS_ERROR_FORMAT, "%s: array %s is in Fortran order; save it C-contiguous "
                    "(numpy.ascontiguousarray)", origin, name);
    tensor->rank = 0;
    const char *at = shape + 1;
    for (;;) {
        while (*at == ' ' || *at == ',') at++;
        if (*at == ')') break;
        char *end = NULL;
        long long value = strtoll(at, &end, 10);
        if (end == at || value < 0 || tensor->rank == TAS_MAX_RANK)
            return bad_archive(error, origin, "a shape of at most 8 sizes >= 0 expected for array", name);
        tensor->shape[tensor->rank++] = value;
        at = end;
        if (*at != ',' && *at != ')' && *at != ' ')
            return bad_archive(error, origin, "a malformed shape for array", name);
    }
    return TAS_OK;
}

static tas_status read_npy(const uint8_t *data, size_t size, const char *origin, safetensor *tensor,
                           error_record *error) {
    const char *name = tensor->name;
    if (size < 10 || memcmp(data, "\x93NUMPY", 6) != 0 || data[6] < 1 || data[6] > 3)
        return bad_archive(error, origin, "no .npy format 1.0 to 3.0 header for array", name);
    size_t prefix = data[6] == 1 ? 10 : 12;
    uint64_t length = size >= prefix ? little(data + 8, data[6] == 1 ? 2 : 4) : UINT64_MAX;
    if (length > MAX_NPY_HEADER || length > size - prefix)
        return bad_archive(error, origin, "a .npy header longer than its entry for array", name);
    char *header = malloc((size_t)length + 1);
    if (header == NULL) return fail(error, TAS_ERROR_MEMORY, "out of memory");
    memcpy(header, data + prefix, (size_t)length);
    header[length] = '\0';
    tas_status status = read_npy_header(header, origin, tensor, error);
    free(header);
    if (status != TAS_OK) return status;
    size_t elements;
    if (!shape_elements(tensor->shape, tensor->rank, &elements) ||
        !multiply_size(elements, dtype_size(tensor->dtype), &tensor->bytes) || tensor->bytes != size - prefix - length)
        return bad_archive(error, origin, "an entry whose size is not its shape's for array", name);
    tensor->data = data + prefix + length;
    return TAS_OK;
}

/* One central directory entry at `at`: its array read into `tensor` (its name set first). */
static tas_status read_entry(const uint8_t *data, size_t size, size_t at, const char *origin, safetensors_file *file,
                             size_t *next, error_record *error) {
    if (size < ENTRY_BYTES || at > size - ENTRY_BYTES || little(data + at, 4) != ENTRY_SIGNATURE)
        return bad_archive(error, origin, "a malformed central directory", NULL);
    uint64_t flags = little(data + at + 8, 2), method = little(data + at + 10, 2), crc = little(data + at + 16, 4);
    uint64_t compressed = little(data + at + 20, 4), uncompressed = little(data + at + 24, 4);
    size_t name_length = (size_t)little(data + at + 28, 2), extra_length = (size_t)little(data + at + 30, 2);
    size_t comment_length = (size_t)little(data + at + 32, 2);
    uint64_t local = little(data + at + 42, 4);
    size_t variable = name_length + extra_length + comment_length;
    if (variable > size - at - ENTRY_BYTES) return bad_archive(error, origin, "a central directory past the file", NULL);
    *next = at + ENTRY_BYTES + variable;
    const char *name = (const char *)data + at + ENTRY_BYTES;
    if (name_length < 5 || memcmp(name + name_length - 4, ".npy", 4) != 0)
        return bad_archive(error, origin, "an entry that is not a .npy file:", NULL);
    safetensor *tensor = &file->tensors[file->count];
    tensor->name = copy_text(name, name_length - 4);
    if (tensor->name == NULL) return fail(error, TAS_ERROR_MEMORY, "out of memory");
    file->count += 1;
    if (strlen(tensor->name) != name_length - 4) return bad_archive(error, origin, "a NUL in an entry's name", NULL);
    for (size_t i = 0; i + 1 < file->count; i++)
        if (strcmp(file->tensors[i].name, tensor->name) == 0) return bad_archive(error, origin, "two arrays named", tensor->name);
    if (!read_zip64_extra(data + at + ENTRY_BYTES + name_length, extra_length, &uncompressed, &compressed, &local))
        return bad_archive(error, origin, "a malformed zip64 field for array", tensor->name);
    if (flags & 1u) return bad_archive(error, origin, "an encrypted entry for array", tensor->name);
    if (method != 0)
        return fail(error, TAS_ERROR_FORMAT,
                    "%s: array %s is compressed (numpy.savez_compressed); the native runtime reads uncompressed .npz "
                    "archives: write it with numpy.savez, or as safetensors", origin, tensor->name);
    if (compressed != uncompressed || size < LOCAL_BYTES || local > size - LOCAL_BYTES || little(data + local, 4) != LOCAL_SIGNATURE)
        return bad_archive(error, origin, "a malformed local header for array", tensor->name);
    uint64_t start = local + LOCAL_BYTES + little(data + local + 26, 2) + little(data + local + 28, 2);
    if (start > size || uncompressed > size - start)
        return bad_archive(error, origin, "data past the end of the file (truncated?) for array", tensor->name);
    if (crc32_of(data + start, (size_t)uncompressed) != crc)
        return fail(error, TAS_ERROR_FORMAT, "damaged file: %s: array %s fails its CRC-32 (changed or corrupted since "
                    "it was written): write it again", origin, tensor->name);
    return read_npy(data + start, (size_t)uncompressed, origin, tensor, error);
}

tas_status npz_read_memory(const uint8_t *data, size_t size, const char *origin, safetensors_file *file,
                           error_record *error) {
    memset(file, 0, sizeof *file);
    file->data = data;
    file->size = size;
    directory found = {0, 0, 0};
    tas_status status = find_directory(data, size, origin, &found, error);
    if (status != TAS_OK) return status;
    file->tensors = calloc((size_t)found.entries + 1, sizeof *file->tensors);
    if (file->tensors == NULL) return fail(error, TAS_ERROR_MEMORY, "out of memory");
    size_t at = (size_t)found.offset;
    for (uint64_t i = 0; i < found.entries && status == TAS_OK; i++)
        status = read_entry(data, size, at, origin, file, &at, error);
    return status;
}
