/* The step server's wire format (native/PROTOCOL.md): a 16-byte frame header, then the payload,
 * little-endian throughout. A bounded reader for payloads that come from the network (every read
 * checks what is left: a short or lying payload is an error, never a read past its end) and a
 * growable writer for replies. */
#ifndef TORCH_ADRENO_STEP_WIRE_H
#define TORCH_ADRENO_STEP_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define WIRE_MAGIC "TASP"
#define WIRE_VERSION 1
#define WIRE_HEADER_BYTES 16
/* Names and tokens: at most this many bytes on the wire (a state name is far shorter). */
#define WIRE_MAX_TEXT 4096

/* Request types; a reply carries the request's type | WIRE_REPLY, or WIRE_ERROR. */
enum wire_type {
    WIRE_HELLO = 1,
    WIRE_PROPERTIES = 2,
    WIRE_LOAD_STEP = 3,
    WIRE_RUN = 4,
    WIRE_READ_STATE = 5,
    WIRE_WRITE_STATE = 6,
    WIRE_SET_INPUT = 7,
    WIRE_PROFILE = 8,
    WIRE_CLOSE = 9,
    WIRE_REPLY = 0x8000,
    WIRE_ERROR = 0xFFFF
};

/* Error codes of an error reply: 1-7 are the C API's tas_status; these are the protocol's. */
enum wire_error {
    WIRE_ERROR_MALFORMED = 100,    /* the payload does not decode as its type says */
    WIRE_ERROR_TOO_LARGE = 101,    /* over a limit of this server (the connection is closed) */
    WIRE_ERROR_BAD_FRAME = 102,    /* not a frame of this protocol (the connection is closed) */
    WIRE_ERROR_VERSION = 103,      /* another protocol version (the connection is closed) */
    WIRE_ERROR_UNAUTHORIZED = 104, /* no HELLO first, or a wrong token (the connection is closed) */
    WIRE_ERROR_NO_STEP = 105,      /* a message that needs a loaded step before LOAD_STEP */
    WIRE_ERROR_UNKNOWN_TYPE = 106, /* a message type this server does not know */
    WIRE_ERROR_BUSY = 107          /* another client is being served (one at a time) */
};

typedef struct wire_header {
    uint16_t version;
    uint16_t type;
    uint64_t length;
} wire_header;

void wire_encode_header(uint8_t out[WIRE_HEADER_BYTES], uint16_t type, uint64_t length);
/* 0 when the first four bytes are not the magic. */
int wire_decode_header(const uint8_t in[WIRE_HEADER_BYTES], wire_header *header);

/* Reading a payload: each call fails (returns 0, sets failed) rather than read past the end. */
typedef struct wire_reader {
    const uint8_t *data;
    size_t size, at;
    int failed;
} wire_reader;

int wire_read_u8(wire_reader *reader, uint8_t *value);
int wire_read_u32(wire_reader *reader, uint32_t *value);
int wire_read_u64(wire_reader *reader, uint64_t *value);
int wire_read_i64(wire_reader *reader, int64_t *value);
int wire_read_f64(wire_reader *reader, double *value);
/* `count` bytes in place (*bytes points into the payload). */
int wire_read_bytes(wire_reader *reader, size_t count, const uint8_t **bytes);
/* A u32-length text of at most WIRE_MAX_TEXT bytes without NUL, copied NUL-terminated into `out`
 * (WIRE_MAX_TEXT + 1 bytes). */
int wire_read_text(wire_reader *reader, char *out);
size_t wire_left(const wire_reader *reader);

/* Building a reply: on a failed allocation the writer keeps failed set and ignores the rest. */
typedef struct wire_writer {
    uint8_t *data;
    size_t size, capacity;
    int failed;
} wire_writer;

void wire_write_u8(wire_writer *writer, uint8_t value);
void wire_write_u32(wire_writer *writer, uint32_t value);
void wire_write_u64(wire_writer *writer, uint64_t value);
void wire_write_i64(wire_writer *writer, int64_t value);
void wire_write_f32(wire_writer *writer, float value);
void wire_write_bytes(wire_writer *writer, const void *bytes, size_t count);
void wire_write_text(wire_writer *writer, const char *text);
/* Room for `count` more bytes, returned for the caller to fill (NULL when out of memory). */
uint8_t *wire_reserve(wire_writer *writer, size_t count);
void wire_writer_free(wire_writer *writer);

#endif
