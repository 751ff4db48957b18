/* The step server's sockets: listening (loopback unless told otherwise, and then only with a
 * token), one client at a time, frames read with deadlines so that a client that stops mid-message
 * cannot hold the server, and a second client answered "busy" rather than left waiting. POSIX
 * sockets and poll(2): Linux and Android alike. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server.h"

#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0 /* (SIGPIPE is ignored as well) */
#endif

/* A payload's buffer grows with the bytes that arrive, not with the length a header claims. */
#define FIRST_CHUNK (1u << 20)

static volatile sig_atomic_t stopping = 0;

static void stop_serving(int signal_number) {
    (void)signal_number;
    stopping = 1;
}

typedef enum { IO_DONE, IO_CLOSED, IO_TIMEOUT, IO_FAILED, IO_STOPPED } io_result;

/* Waits until `descriptor` is ready for `events`; timeout_ms 0 waits for ever. */
static io_result wait_for(int descriptor, short events, int timeout_ms) {
    struct pollfd entry = {descriptor, events, 0};
    for (;;) {
        if (stopping) return IO_STOPPED;
        int ready = poll(&entry, 1, timeout_ms > 0 ? timeout_ms : -1);
        if (ready > 0) return IO_DONE;
        if (ready == 0) return IO_TIMEOUT;
        if (errno != EINTR) return IO_FAILED;
    }
}

/* Reads exactly `size` bytes, each wait at most timeout_ms. *received counts what came. */
static io_result receive_exactly(int descriptor, uint8_t *out, size_t size, int timeout_ms, size_t *received) {
    *received = 0;
    while (*received < size) {
        io_result waited = wait_for(descriptor, POLLIN, timeout_ms);
        if (waited != IO_DONE) return waited;
        ssize_t got = recv(descriptor, out + *received, size - *received, 0);
        if (got == 0) return IO_CLOSED;
        if (got < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            return errno == ECONNRESET ? IO_CLOSED : IO_FAILED;
        }
        *received += (size_t)got;
    }
    return IO_DONE;
}

static io_result send_all(int descriptor, const uint8_t *data, size_t size, int timeout_ms) {
    size_t sent = 0;
    while (sent < size) {
        io_result waited = wait_for(descriptor, POLLOUT, timeout_ms);
        if (waited != IO_DONE) return waited;
        ssize_t done = send(descriptor, data + sent, size - sent, MSG_NOSIGNAL);
        if (done < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            return IO_CLOSED;
        }
        sent += (size_t)done;
    }
    return IO_DONE;
}

static io_result send_frame(int descriptor, uint16_t type, const wire_writer *payload, int timeout_ms) {
    uint8_t header[WIRE_HEADER_BYTES];
    wire_encode_header(header, type, payload->size);
    io_result result = send_all(descriptor, header, sizeof header, timeout_ms);
    return result == IO_DONE && payload->size ? send_all(descriptor, payload->data, payload->size, timeout_ms) : result;
}

static void send_error(int descriptor, uint32_t code, const char *message, int timeout_ms) {
    wire_writer payload = {0};
    uint16_t type;
    session_error(&payload, &type, code, "%s", message);
    if (!payload.failed) send_frame(descriptor, type, &payload, timeout_ms);
    wire_writer_free(&payload);
}

/* The payload of `length` bytes, grown as it arrives; NULL with *result saying why. */
static uint8_t *receive_payload(int descriptor, uint64_t length, int timeout_ms, io_result *result, size_t *received) {
    size_t capacity = length < FIRST_CHUNK ? (size_t)length : FIRST_CHUNK;
    uint8_t *data = malloc(capacity + 1);
    *received = 0;
    *result = data ? IO_DONE : IO_FAILED;
    while (data && *received < length) {
        if (*received == capacity) {
            size_t grown = capacity * 2 < length ? capacity * 2 : (size_t)length;
            uint8_t *bigger = realloc(data, grown + 1);
            if (bigger == NULL) {
                *result = IO_FAILED;
                break;
            }
            data = bigger;
            capacity = grown;
        }
        size_t got = 0;
        *result = receive_exactly(descriptor, data + *received, capacity - *received, timeout_ms, &got);
        *received += got;
        if (*result != IO_DONE) break;
    }
    if (*result != IO_DONE) {
        free(data);
        return NULL;
    }
    return data;
}

/* Closes a connection after the last reply without resetting it: a socket closed with unread bytes
 * sends RST, which can throw away the reply (an error saying why) before the client reads it. So
 * the sending side is shut first and what the client still sends is read and dropped, for up to
 * half a second, until it closes its side. */
static void close_gracefully(int descriptor) {
    shutdown(descriptor, SHUT_WR);
    uint8_t scratch[16384];
    for (int waited = 0; waited < 500 && !stopping; waited += 50) {
        struct pollfd entry = {descriptor, POLLIN, 0};
        if (poll(&entry, 1, 50) <= 0) continue;
        if (recv(descriptor, scratch, sizeof scratch, 0) <= 0) break;
    }
    close(descriptor);
}

/* Another client while one is served: told so at once, rather than left in the backlog. */
static void refuse_busy(int listener, const char *serving) {
    int other = accept(listener, NULL, NULL);
    if (other < 0) return;
    char message[256];
    snprintf(message, sizeof message, "busy: this server serves one client at a time and is serving %s; try again "
             "when it leaves", serving);
    send_error(other, WIRE_ERROR_BUSY, message, 1000);
    close_gracefully(other);
}

static const char *describe(io_result result) {
    switch (result) {
    case IO_CLOSED: return "closed the connection";
    case IO_TIMEOUT: return "sent nothing within the time limit";
    case IO_STOPPED: return "was dropped: the server is stopping";
    default: return "failed";
    }
}

/* Serves one client until it leaves, breaks the protocol beyond repair, or the server stops. */
static void serve_client(const server_config *config, const tas_device_properties *device, int listener, int client,
                         const char *peer) {
    session s = {config, device, peer, NULL, 0, 0};
    int io_ms = config->io_timeout_ms, open = 1;
    while (open) {
        struct pollfd entries[2] = {{client, POLLIN, 0}, {listener, POLLIN, 0}};
        int ready = poll(entries, 2, config->idle_timeout_ms > 0 ? config->idle_timeout_ms : -1);
        if (stopping) break;
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0) {
            fprintf(stderr, "client %s: %s\n", peer, ready == 0 ? "idle past --idle-timeout-s: dropped" : "poll failed");
            break;
        }
        if (!(entries[0].revents & (POLLIN | POLLHUP | POLLERR))) {
            /* (only when the client has nothing pending: a client that just left is seen to leave
             * first, and the one that connected after it is served rather than told "busy") */
            if (entries[1].revents & POLLIN) refuse_busy(listener, peer);
            continue;
        }
        uint8_t raw[WIRE_HEADER_BYTES];
        size_t got = 0;
        io_result result = receive_exactly(client, raw, sizeof raw, io_ms, &got);
        if (result != IO_DONE) {
            if (got || result != IO_CLOSED)
                fprintf(stderr, "client %s %s inside a frame header (%zu of %d bytes)\n", peer, describe(result), got,
                        WIRE_HEADER_BYTES);
            break;
        }
        wire_header header;
        char message[256];
        if (!wire_decode_header(raw, &header)) {
            send_error(client, WIRE_ERROR_BAD_FRAME, "not a frame of the torch-adreno-step protocol (no TASP magic): "
                       "see native/PROTOCOL.md; closing", io_ms);
            break;
        }
        if (header.version != WIRE_VERSION) {
            snprintf(message, sizeof message, "protocol version %u; this server speaks version %d: update the client "
                     "or the server", (unsigned)header.version, WIRE_VERSION);
            send_error(client, WIRE_ERROR_VERSION, message, io_ms);
            break;
        }
        if (header.length > config->max_message_bytes) {
            snprintf(message, sizeof message, "a message of %llu bytes; this server takes at most %llu "
                     "(--max-message-mib)", (unsigned long long)header.length,
                     (unsigned long long)config->max_message_bytes);
            send_error(client, WIRE_ERROR_TOO_LARGE, message, io_ms);
            break;
        }
        uint8_t *payload = receive_payload(client, header.length, io_ms, &result, &got);
        if (payload == NULL) {
            fprintf(stderr, "client %s %s inside a message (%zu of %llu bytes)\n", peer, describe(result), got,
                    (unsigned long long)header.length);
            break;
        }
        wire_writer reply = {0};
        uint16_t reply_type = 0;
        open = session_handle(&s, header.type, payload, (size_t)header.length, &reply_type, &reply);
        free(payload);
        if (reply.failed) session_error(&reply, &reply_type, TAS_ERROR_MEMORY, "the server ran out of memory");
        result = reply.failed ? IO_FAILED : send_frame(client, reply_type, &reply, io_ms);
        wire_writer_free(&reply);
        if (result != IO_DONE) {
            fprintf(stderr, "client %s: the reply was not taken (%s)\n", peer, describe(result));
            break;
        }
    }
    session_end(&s);
}

static int is_loopback(const struct sockaddr *address) {
    if (address->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)(const void *)address)->sin_addr.s_addr) >> 24) == 127;
    if (address->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)(const void *)address)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) ||
               (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return 0;
}

static void name_address(const struct sockaddr *address, socklen_t length, char *out, size_t size) {
    char host[1025] = "?", port[32] = "?"; /* (NI_MAXHOST and NI_MAXSERV are not POSIX) */
    getnameinfo(address, length, host, sizeof host, port, sizeof port, NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(out, size, address->sa_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, port);
}

/* Binds and listens on config's address; -1 with a message on failure. */
static int open_listener(const server_config *config, char *bound, size_t bound_size) {
    const char *host = config->host && *config->host ? config->host : "127.0.0.1";
    char port[16];
    snprintf(port, sizeof port, "%d", config->port);
    struct addrinfo hints, *found = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int code = getaddrinfo(host, port, &hints, &found);
    if (code != 0) {
        fprintf(stderr, "error: cannot listen on %s: %s\n", host, gai_strerror(code));
        return -1;
    }
    int listener = -1;
    for (struct addrinfo *at = found; at && listener < 0; at = at->ai_next) {
        if (!is_loopback(at->ai_addr) && !(config->token && *config->token)) {
            fprintf(stderr, "error: %s is not a loopback address: serving it needs a token (--token T or %s), which "
                    "every client must then give; or serve 127.0.0.1 and forward a port (adb forward)\n", host,
                    TOKEN_VARIABLE);
            freeaddrinfo(found);
            return -2;
        }
        listener = socket(at->ai_family, at->ai_socktype, at->ai_protocol);
        if (listener < 0) continue;
        int yes = 1;
        setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
        if (bind(listener, at->ai_addr, at->ai_addrlen) != 0 || listen(listener, 4) != 0) {
            fprintf(stderr, "error: cannot listen on %s port %s: %s\n", host, port, strerror(errno));
            close(listener);
            listener = -1;
        }
    }
    freeaddrinfo(found);
    if (listener >= 0) {
        struct sockaddr_storage address;
        socklen_t length = sizeof address;
        getsockname(listener, (struct sockaddr *)&address, &length);
        name_address((struct sockaddr *)&address, length, bound, bound_size);
    }
    return listener;
}

int server_run(const server_config *config) {
    char message[2048];
    tas_device_properties *device = calloc(1, sizeof *device);
    if (device == NULL) return 1;
    tas_status status = tas_describe_device(config->opencl_library, config->device, device, message, sizeof message);
    if (status != TAS_OK) {
        fprintf(stderr, "error: %s\n", message);
        free(device);
        return status == TAS_ERROR_DEVICE || status == TAS_ERROR_ARGUMENT ? 2 : 1;
    }
    char bound[128];
    int listener = open_listener(config, bound, sizeof bound);
    if (listener < 0) {
        free(device);
        return listener == -2 ? 2 : 1;
    }
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &action, NULL); /* a client gone mid-reply is an error return, not a signal */
    action.sa_handler = stop_serving;  /* (no SA_RESTART: poll returns, the loop ends, all is freed) */
    sigaction(SIGINT, &action, NULL);
    sigaction(SIGTERM, &action, NULL);
    printf("listening on %s (device %s: %s; one client at a time%s)\n", bound, device->platform, device->name,
           config->token && *config->token ? "; token required" : "");
    fflush(stdout);
    long served = 0;
    while (!stopping && (config->max_clients == 0 || served < config->max_clients)) {
        if (wait_for(listener, POLLIN, 0) != IO_DONE) continue;
        struct sockaddr_storage address;
        socklen_t length = sizeof address;
        int client = accept(listener, (struct sockaddr *)&address, &length);
        if (client < 0) continue;
        int yes = 1; /* one small reply per step: no Nagle delay */
        setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
        char peer[128];
        name_address((struct sockaddr *)&address, length, peer, sizeof peer);
        fprintf(stderr, "client %s connected\n", peer);
        serve_client(config, device, listener, client, peer);
        close_gracefully(client);
        fprintf(stderr, "client %s left\n", peer);
        served += 1;
    }
    close(listener);
    free(device);
    printf("stopped after %ld clients\n", served);
    return 0;
}
