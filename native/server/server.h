/* torch-adreno-step serve: a step server that a desktop's torch_adreno drives over TCP
 * (native/PROTOCOL.md). One client at a time; each client loads its own step, which is released
 * when it leaves. A thin layer over the C API (include/torch_adreno_step.h). */
#ifndef TORCH_ADRENO_STEP_SERVER_H
#define TORCH_ADRENO_STEP_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "torch_adreno_step.h"
#include "wire.h"

#define SERVER_NAME "torch-adreno-step 0.1.0"
#define TOKEN_VARIABLE "TORCH_ADRENO_SERVE_TOKEN"

typedef struct server_config {
    const char *host;           /* the address to listen on; NULL: 127.0.0.1 */
    int port;                   /* 0: any free port (the "listening on" line says which) */
    const char *token;          /* a client's HELLO must carry it; NULL or "": none (loopback only) */
    const char *device;         /* the OpenCL device steps open on (tas_open_options.device) */
    const char *opencl_library; /* NULL: the C API's default */
    const char *cache_dir;      /* the program binary cache; NULL: none */
    uint64_t max_message_bytes; /* any message's payload */
    uint32_t max_steps_per_run; /* steps of one RUN message */
    int io_timeout_ms;          /* a message's bytes must keep coming, and a reply be taken, within this */
    int idle_timeout_ms;        /* between messages; 0: a client may stay idle for ever */
    long max_clients;           /* exit after serving this many clients; 0: serve for ever */
    int fill_uninitialized_memory; /* tas_open_options.fill_uninitialized_memory of the steps it opens */
} server_config;

/* One client's session: its step and where it is in the protocol. */
typedef struct session {
    const server_config *config;
    const tas_device_properties *device;
    const char *peer;           /* "address:port" of the client, for messages */
    tas_step *step;
    int profile;                /* the step was loaded with profiling events */
    int greeted;                /* HELLO (with the right token) came first */
} session;

/* Handles one request of `type` with its payload; fills `reply` and *reply_type (the request's type
 * | WIRE_REPLY, or WIRE_ERROR). Returns 0 when the connection must close after the reply. */
int session_handle(session *session, uint16_t type, const uint8_t *payload, size_t size, uint16_t *reply_type,
                   wire_writer *reply);
/* An error reply: code (a tas_status or a wire_error) and a message. */
void session_error(wire_writer *reply, uint16_t *reply_type, uint32_t code, const char *format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
void session_end(session *session);

/* Listens and serves clients one at a time until SIGINT or SIGTERM (or max_clients). Returns the
 * process exit status: 0, or 2 for a configuration it refuses (say a non-loopback address without
 * a token), 1 for a failure. */
int server_run(const server_config *config);

#endif
