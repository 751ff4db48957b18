/* torch-adreno-step serve: the command line of the step server (server/server.h). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "server.h"

enum { OPTION_PORT = 1, OPTION_HOST, OPTION_TOKEN, OPTION_DEVICE, OPTION_CACHE, OPTION_NO_CACHE, OPTION_LIBRARY,
       OPTION_MAX_MESSAGE, OPTION_MAX_STEPS, OPTION_IO_TIMEOUT, OPTION_IDLE_TIMEOUT, OPTION_MAX_CLIENTS, OPTION_FILL };

int command_serve(int argc, char **argv) {
    static const struct option LONG_OPTIONS[] = {
        {"port", required_argument, NULL, OPTION_PORT},         {"host", required_argument, NULL, OPTION_HOST},
        {"token", required_argument, NULL, OPTION_TOKEN},       {"device", required_argument, NULL, OPTION_DEVICE},
        {"cache-dir", required_argument, NULL, OPTION_CACHE},   {"no-cache", no_argument, NULL, OPTION_NO_CACHE},
        {"opencl-library", required_argument, NULL, OPTION_LIBRARY},
        {"max-message-mib", required_argument, NULL, OPTION_MAX_MESSAGE},
        {"max-steps-per-run", required_argument, NULL, OPTION_MAX_STEPS},
        {"io-timeout-s", required_argument, NULL, OPTION_IO_TIMEOUT},
        {"idle-timeout-s", required_argument, NULL, OPTION_IDLE_TIMEOUT},
        {"max-clients", required_argument, NULL, OPTION_MAX_CLIENTS},
        {"fill-uninitialized-memory", no_argument, NULL, OPTION_FILL}, {NULL, 0, NULL, 0},
    };
    server_config config = {NULL, -1, getenv(TOKEN_VARIABLE), NULL, NULL, NULL, 1024ull << 20, 4096, 30000, 0, 0, 0};
    char cache_buffer[1024];
    int no_cache = 0;
    long value = 0;
    opterr = 0;
    int code;
    while ((code = getopt_long(argc, argv, ":", LONG_OPTIONS, NULL)) != -1) {
        switch (code) {
        case OPTION_PORT: if (!parse_range(optarg, "--port", 0, 65535, &value)) return EXIT_BAD_INPUT; config.port = (int)value; break;
        case OPTION_HOST: config.host = optarg; break;
        case OPTION_TOKEN: config.token = optarg; break;
        case OPTION_DEVICE: config.device = optarg; break;
        case OPTION_CACHE: config.cache_dir = optarg; break;
        case OPTION_NO_CACHE: no_cache = 1; break;
        case OPTION_LIBRARY: config.opencl_library = optarg; break;
        case OPTION_FILL: config.fill_uninitialized_memory = 1; break;
        case OPTION_MAX_MESSAGE:
            if (!parse_range(optarg, "--max-message-mib", 1, 1L << 20, &value)) return EXIT_BAD_INPUT;
            config.max_message_bytes = (uint64_t)value << 20;
            break;
        case OPTION_MAX_STEPS:
            if (!parse_range(optarg, "--max-steps-per-run", 1, 1L << 20, &value)) return EXIT_BAD_INPUT;
            config.max_steps_per_run = (uint32_t)value;
            break;
        case OPTION_IO_TIMEOUT:
            if (!parse_range(optarg, "--io-timeout-s", 1, 86400, &value)) return EXIT_BAD_INPUT;
            config.io_timeout_ms = (int)value * 1000;
            break;
        case OPTION_IDLE_TIMEOUT:
            if (!parse_range(optarg, "--idle-timeout-s", 0, 86400 * 7, &value)) return EXIT_BAD_INPUT;
            config.idle_timeout_ms = (int)(value * 1000);
            break;
        case OPTION_MAX_CLIENTS:
            if (!parse_range(optarg, "--max-clients", 0, 1L << 30, &value)) return EXIT_BAD_INPUT;
            config.max_clients = value;
            break;
        default:
            fprintf(stderr, "error: serve: option %s %s (see torch-adreno-step --help)\n", argv[optind - 1],
                    code == ':' ? "needs a value" : "is not known");
            return EXIT_BAD_INPUT;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "error: serve takes options only, got '%s'\n", argv[optind]);
        return EXIT_BAD_INPUT;
    }
    if (config.port < 0) {
        fprintf(stderr, "error: serve needs --port P (0: any free port, printed when listening)\n");
        return EXIT_BAD_INPUT;
    }
    if (config.token && *config.token && strlen(config.token) > WIRE_MAX_TEXT) {
        fprintf(stderr, "error: a token of at most %d bytes, please\n", WIRE_MAX_TEXT);
        return EXIT_BAD_INPUT;
    }
    if (no_cache) config.cache_dir = NULL;
    else if (config.cache_dir == NULL) config.cache_dir = default_cache_dir(cache_buffer, sizeof cache_buffer);
    return server_run(&config);
}
