/* One client's requests, decoded from their payloads and run through the C API (PROTOCOL.md says
 * what each carries). Every field is read through wire_reader's bounds; every count and size is
 * checked against the loaded step or the server's limits before anything is allocated or run. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_replies.h"
#include "server.h"

void session_error(wire_writer *reply, uint16_t *reply_type, uint32_t code, const char *format, ...) {
    char message[2560];
    va_list arguments;
    va_start(arguments, format);
    vsnprintf(message, sizeof message, format, arguments);
    va_end(arguments);
    wire_writer_free(reply);
    wire_write_u32(reply, code);
    wire_write_text(reply, message);
    *reply_type = WIRE_ERROR;
}

static int step_failure(session *s, wire_writer *reply, uint16_t *reply_type, tas_status status, const char *doing) {
    session_error(reply, reply_type, (uint32_t)status, "%s: %s", doing, tas_step_error(s->step));
    return 1;
}

static int json_reply(wire_writer *reply, uint16_t *reply_type, char *json) {
    if (json == NULL) {
        session_error(reply, reply_type, TAS_ERROR_MEMORY, "the server ran out of memory");
        return 1;
    }
    wire_write_bytes(reply, json, strlen(json));
    free(json);
    return 1;
}

/* The payload was read to its end: anything after the fields is an error, as is a short payload. */
static int malformed(wire_reader *reader, wire_writer *reply, uint16_t *reply_type, const char *what) {
    if (reader->failed)
        session_error(reply, reply_type, WIRE_ERROR_MALFORMED,
                      "%s: the payload ends inside its fields (%zu bytes): see native/PROTOCOL.md", what, reader->size);
    else if (wire_left(reader))
        session_error(reply, reply_type, WIRE_ERROR_MALFORMED, "%s: %zu bytes after its fields: see native/PROTOCOL.md",
                      what, wire_left(reader));
    else
        return 0;
    return 1;
}

/* Equal texts, in a time that does not depend on where they differ. */
static int same_secret(const char *given, const char *expected) {
    size_t a = strlen(given), b = strlen(expected), longest = a > b ? a : b;
    unsigned difference = (unsigned)(a != b);
    for (size_t i = 0; i < longest; i++)
        difference |= (unsigned)((i < a ? (uint8_t)given[i] : 0) ^ (i < b ? (uint8_t)expected[i] : 0));
    return difference == 0;
}

static int hello(session *s, wire_reader *reader, wire_writer *reply, uint16_t *reply_type) {
    char token[WIRE_MAX_TEXT + 1];
    wire_read_text(reader, token);
    if (malformed(reader, reply, reply_type, "HELLO")) return 0;
    const char *expected = s->config->token && *s->config->token ? s->config->token : NULL;
    if (expected && !same_secret(token, expected)) {
        session_error(reply, reply_type, WIRE_ERROR_UNAUTHORIZED,
                      "%s: this server needs the token it was started with (RemoteDevice(..., token=...))",
                      *token ? "wrong token" : "no token given");
        return 0;
    }
    s->greeted = 1;
    return json_reply(reply, reply_type, hello_json(s->device, SERVER_NAME, s->config->max_message_bytes,
                                                    s->config->max_steps_per_run, WIRE_MAX_TEXT));
}

static int load_step(session *s, wire_reader *reader, wire_writer *reply, uint16_t *reply_type) {
    uint32_t flags = 0;
    const uint8_t *bytes = NULL;
    wire_read_u32(reader, &flags);
    size_t size = wire_left(reader);
    wire_read_bytes(reader, size, &bytes);
    if (malformed(reader, reply, reply_type, "LOAD_STEP")) return 1;
    if (flags & ~1u) {
        session_error(reply, reply_type, WIRE_ERROR_MALFORMED,
                      "LOAD_STEP: flags 0x%x: this server knows bit 0 (profile) only", (unsigned)flags);
        return 1;
    }
    tas_step_close(s->step); /* one step per client: a new one replaces it */
    s->step = NULL;
    s->profile = (int)(flags & 1u);
    char origin[160];
    snprintf(origin, sizeof origin, "the step file from %s", s->peer);
    tas_open_options options = {s->config->device, s->config->opencl_library, s->config->cache_dir, s->profile,
                                s->config->fill_uninitialized_memory};
    tas_status status = tas_step_open_memory(bytes, size, origin, &options, &s->step);
    if (status != TAS_OK) {
        session_error(reply, reply_type, (uint32_t)status, "%s", tas_step_error(s->step));
        tas_step_close(s->step);
        s->step = NULL;
        return 1;
    }
    return json_reply(reply, reply_type, layout_json(s->step, s->profile));
}

static int run(session *s, wire_reader *reader, wire_writer *reply, uint16_t *reply_type) {
    uint32_t steps = 0;
    wire_read_u32(reader, &steps);
    size_t inputs = tas_step_batch_count(s->step), per_step = 0;
    const void *batch[64];
    size_t bytes[64];
    if (inputs > 64) {
        session_error(reply, reply_type, TAS_ERROR_ARGUMENT, "RUN: the step takes %zu batch inputs; this server "
                      "passes at most 64", inputs);
        return 1;
    }
    for (size_t i = 0; i < inputs; i++) {
        tas_tensor_info info;
        tas_step_batch_info(s->step, i, &info);
        bytes[i] = info.bytes;
        per_step += info.bytes; /* (each fits in memory the step allocated: no overflow) */
    }
    if (reader->failed || steps == 0 || steps > s->config->max_steps_per_run) {
        session_error(reply, reply_type, WIRE_ERROR_MALFORMED, "RUN: %u steps: send 1 to %u per message", (unsigned)steps,
                      (unsigned)s->config->max_steps_per_run);
        return 1;
    }
    if (wire_left(reader) / steps != per_step || wire_left(reader) % steps != 0) {
        session_error(reply, reply_type, WIRE_ERROR_MALFORMED,
                      "RUN: %u steps of %zu batch bytes each (the step's batch inputs, in order) make %llu bytes; got "
                      "%zu", (unsigned)steps, per_step, (unsigned long long)steps * per_step, wire_left(reader));
        return 1;
    }
    wire_write_u32(reply, steps);
    for (uint32_t k = 0; k < steps; k++) {
        for (size_t i = 0; i < inputs; i++) {
            const uint8_t *data = NULL;
            wire_read_bytes(reader, bytes[i], &data);
            batch[i] = data;
        }
        float loss = 0;
        tas_status status = tas_step_run(s->step, batch, bytes, &loss);
        if (status != TAS_OK) {
            char doing[96];
            snprintf(doing, sizeof doing, "RUN: step %u of %u (the %u before it ran)", (unsigned)k + 1, (unsigned)steps,
                     (unsigned)k);
            return step_failure(s, reply, reply_type, status, doing);
        }
        wire_write_f32(reply, loss);
    }
    return 1;
}

static int find_state(tas_step *step, const char *name, tas_tensor_info *info) {
    for (size_t i = 0; i < tas_step_state_count(step); i++)
        if (tas_step_state_info(step, i, info) == TAS_OK && strcmp(info->name, name) == 0) return 1;
    return 0;
}

static void write_tensor(wire_writer *reply, tas_step *step, const tas_tensor_info *info, tas_status *status) {
    wire_write_text(reply, info->name);
    wire_write_u8(reply, (uint8_t)info->dtype);
    wire_write_u8(reply, (uint8_t)info->rank);
    for (int d = 0; d < info->rank; d++) wire_write_i64(reply, info->shape[d]);
    wire_write_u64(reply, info->bytes);
    uint8_t *data = wire_reserve(reply, info->bytes);
    if (data == NULL) *status = TAS_ERROR_MEMORY;
    else *status = tas_step_read_state(step, info->name, data, info->bytes);
}

static int read_state(session *s, wire_reader *reader, wire_writer *reply, uint16_t *reply_type) {
    uint32_t count = 0;
    wire_read_u32(reader, &count);
    size_t available = tas_step_state_count(s->step);
    if (!reader->failed && count > available) {
        session_error(reply, reply_type, WIRE_ERROR_MALFORMED, "READ_STATE: %u names; the step has %zu state tensors",
                      (unsigned)count, available);
        return 1;
    }
    wire_write_u32(reply, count ? count : (uint32_t)available);
    tas_status status = TAS_OK;
    tas_tensor_info info;
    for (size_t i = 0; i < (count ? count : available) && status == TAS_OK && !reader->failed; i++) {
        char name[WIRE_MAX_TEXT + 1];
        if (count && !wire_read_text(reader, name)) break;
        if (count && !find_state(s->step, name, &info)) {
            session_error(reply, reply_type, TAS_ERROR_ARGUMENT, "READ_STATE: the step has no state tensor '%s' (the "
                          "layout LOAD_STEP returned lists them)", name);
            return 1;
        }
        if (!count) tas_step_state_info(s->step, i, &info);
        write_tensor(reply, s->step, &info, &status);
    }
    if (malformed(reader, reply, reply_type, "READ_STATE")) return 1;
    if (status != TAS_OK) return step_failure(s, reply, reply_type, status, "READ_STATE");
    if (reply->failed) session_error(reply, reply_type, TAS_ERROR_MEMORY, "READ_STATE: the server ran out of memory");
    return 1;
}

typedef struct received_tensor {
    char name[WIRE_MAX_TEXT + 1];
    const uint8_t *data;
    size_t bytes;
} received_tensor;

/* A tensor of WRITE_STATE, checked against the state tensor of its name; 0 with the error replied. */
static int read_tensor(session *s, wire_reader *reader, received_tensor *tensor, wire_writer *reply,
                       uint16_t *reply_type) {
    uint8_t dtype = 0, rank = 0;
    int64_t shape[TAS_MAX_RANK];
    uint64_t bytes = 0;
    wire_read_text(reader, tensor->name);
    wire_read_u8(reader, &dtype);
    wire_read_u8(reader, &rank);
    for (int d = 0; d < rank && d < TAS_MAX_RANK; d++) wire_read_i64(reader, &shape[d]);
    wire_read_u64(reader, &bytes);
    if (!reader->failed && (rank > TAS_MAX_RANK || bytes > wire_left(reader))) reader->failed = 1;
    if (reader->failed) {
        malformed(reader, reply, reply_type, "WRITE_STATE");
        return 0;
    }
    tas_tensor_info info;
    if (!find_state(s->step, tensor->name, &info)) {
        session_error(reply, reply_type, TAS_ERROR_ARGUMENT, "WRITE_STATE: the step has no state tensor '%s'",
                      tensor->name);
        return 0;
    }
    int same = dtype == (uint8_t)info.dtype && rank == info.rank && bytes == info.bytes;
    for (int d = 0; same && d < rank; d++) same = shape[d] == info.shape[d];
    if (!same) {
        session_error(reply, reply_type, TAS_ERROR_ARGUMENT,
                      "WRITE_STATE: %s is dtype %d of rank %d with %zu bytes on the server; got dtype %d of rank %d with "
                      "%llu bytes (or another shape)", tensor->name, (int)info.dtype, info.rank, info.bytes, (int)dtype,
                      (int)rank, (unsigned long long)bytes);
        return 0;
    }
    tensor->bytes = (size_t)bytes;
    wire_read_bytes(reader, tensor->bytes, &tensor->data);
    return 1;
}

/* Every tensor is checked before any is written: a bad message changes nothing. */
static int write_state(session *s, wire_reader *reader, wire_writer *reply, uint16_t *reply_type) {
    uint32_t count = 0;
    wire_read_u32(reader, &count);
    size_t available = tas_step_state_count(s->step);
    if (!reader->failed && count > available) {
        session_error(reply, reply_type, WIRE_ERROR_MALFORMED, "WRITE_STATE: %u tensors; the step has %zu",
                      (unsigned)count, available);
        return 1;
    }
    received_tensor *tensors = calloc(count + 1u, sizeof *tensors);
    if (tensors == NULL) {
        session_error(reply, reply_type, TAS_ERROR_MEMORY, "WRITE_STATE: the server ran out of memory");
        return 1;
    }
    int ok = !reader->failed;
    for (uint32_t i = 0; i < count && ok; i++) ok = read_tensor(s, reader, &tensors[i], reply, reply_type);
    if (ok && !malformed(reader, reply, reply_type, "WRITE_STATE"))
        for (uint32_t i = 0; i < count; i++) {
            tas_status status = tas_step_write_state(s->step, tensors[i].name, tensors[i].data, tensors[i].bytes);
            if (status != TAS_OK) {
                step_failure(s, reply, reply_type, status, "WRITE_STATE");
                break;
            }
        }
    else if (ok == 0 && *reply_type != WIRE_ERROR)
        malformed(reader, reply, reply_type, "WRITE_STATE");
    free(tensors);
    return 1;
}

static int set_input(session *s, wire_reader *reader, wire_writer *reply, uint16_t *reply_type) {
    char name[WIRE_MAX_TEXT + 1];
    double value = 0;
    wire_read_text(reader, name);
    wire_read_f64(reader, &value);
    if (malformed(reader, reply, reply_type, "SET_INPUT")) return 1;
    tas_status status = tas_step_set_scalar(s->step, name, value);
    return status == TAS_OK ? 1 : step_failure(s, reply, reply_type, status, "SET_INPUT");
}

static int profile(session *s, wire_reader *reader, wire_writer *reply, uint16_t *reply_type) {
    uint8_t flags = 0;
    wire_read_u8(reader, &flags);
    if (malformed(reader, reply, reply_type, "PROFILE")) return 1;
    if (flags & ~1u) {
        session_error(reply, reply_type, WIRE_ERROR_MALFORMED, "PROFILE: flags 0x%x: bit 0 (reset) only", flags);
        return 1;
    }
    json_reply(reply, reply_type, profile_json(s->step, s->profile));
    if (flags & 1u) tas_step_reset_times(s->step);
    return 1;
}

int session_handle(session *s, uint16_t type, const uint8_t *payload, size_t size, uint16_t *reply_type,
                   wire_writer *reply) {
    wire_reader reader = {payload, size, 0, 0};
    *reply_type = (uint16_t)(type | WIRE_REPLY);
    if (type == WIRE_HELLO) return hello(s, &reader, reply, reply_type);
    if (!s->greeted) {
        session_error(reply, reply_type, WIRE_ERROR_UNAUTHORIZED, "message type %u before HELLO: say HELLO first",
                      (unsigned)type);
        return 0;
    }
    switch (type) {
    case WIRE_PROPERTIES:
        if (malformed(&reader, reply, reply_type, "PROPERTIES")) return 1;
        return json_reply(reply, reply_type, properties_json(s->device));
    case WIRE_LOAD_STEP: return load_step(s, &reader, reply, reply_type);
    case WIRE_CLOSE:
        if (malformed(&reader, reply, reply_type, "CLOSE")) return 1;
        return 0;
    case WIRE_RUN: case WIRE_READ_STATE: case WIRE_WRITE_STATE: case WIRE_SET_INPUT: case WIRE_PROFILE:
        if (s->step == NULL) {
            session_error(reply, reply_type, WIRE_ERROR_NO_STEP, "message type %u needs a step: send LOAD_STEP first",
                          (unsigned)type);
            return 1;
        }
        if (type == WIRE_RUN) return run(s, &reader, reply, reply_type);
        if (type == WIRE_READ_STATE) return read_state(s, &reader, reply, reply_type);
        if (type == WIRE_WRITE_STATE) return write_state(s, &reader, reply, reply_type);
        if (type == WIRE_SET_INPUT) return set_input(s, &reader, reply, reply_type);
        return profile(s, &reader, reply, reply_type);
    default:
        session_error(reply, reply_type, WIRE_ERROR_UNKNOWN_TYPE, "message type %u: this server (protocol %d) knows "
                      "types 1 to 9", (unsigned)type, WIRE_VERSION);
        return 1;
    }
}

void session_end(session *s) {
    tas_step_close(s->step);
    s->step = NULL;
    s->greeted = 0;
    s->profile = 0;
}
