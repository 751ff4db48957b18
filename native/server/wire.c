#include "wire.h"

#include <stdlib.h>
#include <string.h>

static void put_le(uint8_t *out, uint64_t value, int bytes) {
    for (int i = 0; i < bytes; i++) out[i] = (uint8_t)(value >> (8 * i));
}

static uint64_t get_le(const uint8_t *in, int bytes) {
    uint64_t value = 0;
    for (int i = 0; i < bytes; i++) value |= (uint64_t)in[i] << (8 * i);
    return value;
}

void wire_encode_header(uint8_t out[WIRE_HEADER_BYTES], uint16_t type, uint64_t length) {
    memcpy(out, WIRE_MAGIC, 4);
    put_le(out + 4, WIRE_VERSION, 2);
    put_le(out + 6, type, 2);
    put_le(out + 8, length, 8);
}

int wire_decode_header(const uint8_t in[WIRE_HEADER_BYTES], wire_header *header) {
    if (memcmp(in, WIRE_MAGIC, 4) != 0) return 0;
    header->version = (uint16_t)get_le(in + 4, 2);
    header->type = (uint16_t)get_le(in + 6, 2);
    header->length = get_le(in + 8, 8);
    return 1;
}

static const uint8_t *take(wire_reader *reader, size_t count) {
    if (reader->failed || count > reader->size - reader->at) {
        reader->failed = 1;
        return NULL;
    }
    const uint8_t *at = reader->data + reader->at;
    reader->at += count;
    return at;
}

int wire_read_u8(wire_reader *reader, uint8_t *value) {
    const uint8_t *at = take(reader, 1);
    if (at) *value = *at;
    return at != NULL;
}

int wire_read_u32(wire_reader *reader, uint32_t *value) {
    const uint8_t *at = take(reader, 4);
    if (at) *value = (uint32_t)get_le(at, 4);
    return at != NULL;
}

int wire_read_u64(wire_reader *reader, uint64_t *value) {
    const uint8_t *at = take(reader, 8);
    if (at) *value = get_le(at, 8);
    return at != NULL;
}

int wire_read_i64(wire_reader *reader, int64_t *value) {
    uint64_t bits;
    if (!wire_read_u64(reader, &bits)) return 0;
    memcpy(value, &bits, sizeof bits); /* two's complement on every platform this builds for */
    return 1;
}

int wire_read_f64(wire_reader *reader, double *value) {
    uint64_t bits;
    if (!wire_read_u64(reader, &bits)) return 0;
    memcpy(value, &bits, sizeof bits); /* IEEE 754 binary64, little-endian on the wire */
    return 1;
}

int wire_read_bytes(wire_reader *reader, size_t count, const uint8_t **bytes) {
    *bytes = take(reader, count);
    return *bytes != NULL;
}

int wire_read_text(wire_reader *reader, char *out) {
    uint32_t length;
    const uint8_t *bytes;
    if (!wire_read_u32(reader, &length)) return 0;
    if (length > WIRE_MAX_TEXT || !wire_read_bytes(reader, length, &bytes) || memchr(bytes, 0, length) != NULL) {
        reader->failed = 1;
        return 0;
    }
    memcpy(out, bytes, length);
    out[length] = '\0';
    return 1;
}

size_t wire_left(const wire_reader *reader) {
    return reader->failed ? 0 : reader->size - reader->at;
}

uint8_t *wire_reserve(wire_writer *writer, size_t count) {
    if (writer->failed) return NULL;
    if (count > SIZE_MAX / 2 - writer->size) {
        writer->failed = 1;
        return NULL;
    }
    if (writer->size + count > writer->capacity) {
        size_t capacity = writer->capacity ? writer->capacity : 256;
        while (capacity < writer->size + count) capacity *= 2;
        uint8_t *grown = realloc(writer->data, capacity);
        if (grown == NULL) {
            writer->failed = 1;
            return NULL;
        }
        writer->data = grown;
        writer->capacity = capacity;
    }
    uint8_t *at = writer->data + writer->size;
    writer->size += count;
    return at;
}

static void write_le(wire_writer *writer, uint64_t value, int bytes) {
    uint8_t *at = wire_reserve(writer, (size_t)bytes);
    if (at) put_le(at, value, bytes);
}

void wire_write_u8(wire_writer *writer, uint8_t value) { write_le(writer, value, 1); }
void wire_write_u32(wire_writer *writer, uint32_t value) { write_le(writer, value, 4); }
void wire_write_u64(wire_writer *writer, uint64_t value) { write_le(writer, value, 8); }

void wire_write_i64(wire_writer *writer, int64_t value) {
    uint64_t bits;
    memcpy(&bits, &value, sizeof bits);
    write_le(writer, bits, 8);
}

void wire_write_f32(wire_writer *writer, float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    write_le(writer, bits, 4);
}

void wire_write_bytes(wire_writer *writer, const void *bytes, size_t count) {
    uint8_t *at = wire_reserve(writer, count);
    if (at && count) memcpy(at, bytes, count);
}

void wire_write_text(wire_writer *writer, const char *text) {
    size_t length = strlen(text);
    wire_write_u32(writer, (uint32_t)length);
    wire_write_bytes(writer, text, length);
}

void wire_writer_free(wire_writer *writer) {
    free(writer->data);
    memset(writer, 0, sizeof *writer);
}
