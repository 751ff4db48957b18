/* torch-adreno-step devices | train | bench | serve: see usage(); and the devices command. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: torch-adreno-step <command> ...\n"
            "  devices                         list the OpenCL devices (index, platform: name, limits)\n"
            "  train STEP.onnx --data DATA --steps N --out STATE.safetensors [--device I|NAME] [--seed S]\n"
            "        [--state IN.safetensors] [--lr X] [--cache-dir DIR | --no-cache] [--print-every K]\n"
            "        [--fill-uninitialized-memory] [--continue-on-nonfinite] [--no-recording]\n"
            "                                  train the exported step; one line per step, then a summary;\n"
            "                                  a loss that is not finite stops it (exit status 1)\n"
            "  bench STEP.onnx [--data DATA] [--steps N] [--warmup W] [--device I|NAME] [--seed S]\n"
            "        [--cache-dir DIR | --no-cache] [--fill-uninitialized-memory] [--no-recording]\n"
            "                                  per-kernel device times from OpenCL profiling events, then the\n"
            "                                  host's enqueue per step unprofiled, recorded and not\n"
            "  serve --port P [--host H --token T] [--device I|NAME] [--cache-dir DIR | --no-cache]\n"
            "        [--max-message-mib M] [--max-steps-per-run N] [--io-timeout-s S] [--idle-timeout-s S]\n"
            "        [--max-clients K] [--opencl-library PATH] [--fill-uninitialized-memory]\n"
            "                                  a step server for torch_adreno.remote (native/PROTOCOL.md);\n"
            "                                  127.0.0.1 unless --host, which then needs a token; port 0: any\n"
            "DATA: safetensors or .npz (numpy.savez), one array per batch input named as the input or x, y:\n"
            "batches stacked over steps, [S, *input shape], or examples, [N, *input shape[1:]], drawn in an\n"
            "order shuffled each epoch from --seed (default 0).\n"
            "--fill-uninitialized-memory: fill the memory a step makes with NaN / out-of-range words before its\n"
            "first write, so that a read of memory nothing wrote shows.\n"
            "--no-recording: enqueue each operation of the step, not the step recorded once into the driver\n"
            "(a cl_khr_command_buffer, where the device offers one).\n"
            "Environment: TORCH_ADRENO_DEVICE (the default device), TORCH_ADRENO_OPENCL_LIBRARY (the libOpenCL\n"
            "to load), TORCH_ADRENO_STEP_CACHE (the program cache folder), TORCH_ADRENO_SERVE_TOKEN (serve's\n"
            "token, kept out of the process list), TORCH_ADRENO_FILL_UNINITIALIZED_MEMORY (1: fill as\n"
            "--fill-uninitialized-memory does), TORCH_ADRENO_REPLAY_COMMAND_BUFFERS (0: never record the step;\n"
            "1: also Qualcomm's cl_qcom_recordable_queues, not run on a device yet).\n");
}

int command_devices(int argc, char **argv) {
    const char *library = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--opencl-library") == 0 && i + 1 < argc) library = argv[++i];
        else {
            fprintf(stderr, "error: devices takes only --opencl-library PATH, got '%s'\n", argv[i]);
            return EXIT_BAD_INPUT;
        }
    }
    tas_device_info devices[64];
    size_t count = 0;
    char message[2048];
    tas_status status = tas_list_devices(library, devices, 64, &count, message, sizeof message);
    if (status != TAS_OK) {
        fprintf(stderr, "error: %s\n", message);
        return exit_status(status);
    }
    for (size_t i = 0; i < count && i < 64; i++) {
        const tas_device_info *d = &devices[i];
        printf("[%zu] %s: %s\n     %s, driver %s, %s\n     work-group <= %zu, global memory %.1f GiB, largest "
               "allocation %llu MiB\n", i, d->platform, d->name, d->version, d->driver, d->is_gpu ? "GPU" : "not a GPU",
               d->max_work_group, (double)d->global_memory / (1u << 30),
               (unsigned long long)(d->max_allocation >> 20));
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? EXIT_BAD_INPUT : 0;
    }
    if (strcmp(argv[1], "devices") == 0) return command_devices(argc - 1, argv + 1);
    if (strcmp(argv[1], "train") == 0) return command_train(argc - 1, argv + 1);
    if (strcmp(argv[1], "bench") == 0) return command_bench(argc - 1, argv + 1);
    if (strcmp(argv[1], "serve") == 0) return command_serve(argc - 1, argv + 1);
    fprintf(stderr, "error: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return EXIT_BAD_INPUT;
}
