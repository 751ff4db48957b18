/* The C API as an app uses it, linked with the shared library and nothing but its header:
 *
 *     api-tour STEP.onnx DEVICE [STEPS]
 *
 * opens the step, trains STEPS steps (default 2) on batches of zeros, prints each loss, then the
 * eval-mode prediction on a batch of zeros (when the file holds one) and the state's names. */
#include <stdio.h>
#include <stdlib.h>

#include "torch_adreno_step.h"

static int failed(tas_step *step, tas_status status) {
    fprintf(stderr, "error (status %d): %s\n", (int)status, tas_step_error(step));
    tas_step_close(step);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: api-tour STEP.onnx DEVICE [STEPS]\n");
        return 2;
    }
    tas_open_options options = {argv[2], NULL, NULL, 0};
    tas_step *step = NULL;
    tas_status status = tas_step_open(argv[1], &options, &step);
    if (status != TAS_OK) return failed(step, status);

    size_t inputs = tas_step_batch_count(step), largest = 1;
    size_t bytes[16];
    const void *batch[16];
    for (size_t i = 0; i < inputs && i < 16; i++) {
        tas_tensor_info info;
        tas_step_batch_info(step, i, &info);
        bytes[i] = info.bytes;
        if (info.bytes > largest) largest = info.bytes;
        printf("batch input %s: %zu bytes\n", info.name, info.bytes);
    }
    void *zeros = calloc(largest, 1);
    for (size_t i = 0; i < inputs && i < 16; i++) batch[i] = zeros;

    int steps = argc > 3 ? atoi(argv[3]) : 2;
    for (int s = 0; s < steps; s++) {
        float loss;
        if ((status = tas_step_run(step, batch, bytes, &loss)) != TAS_OK) return free(zeros), failed(step, status);
        printf("loss %.9g\n", (double)loss);
    }
    if (tas_step_can_predict(step)) {
        tas_tensor_info output;
        tas_step_predict_info(step, &output);
        float *logits = malloc(output.bytes);
        status = tas_step_predict(step, zeros, bytes[0], logits, output.bytes);
        if (status != TAS_OK) return free(zeros), free(logits), failed(step, status);
        printf("logits");
        for (size_t i = 0; i < output.bytes / sizeof(float); i++) printf(" %.9g", (double)logits[i]);
        printf("\n");
        free(logits);
    }
    printf("state:");
    for (size_t i = 0; i < tas_step_state_count(step); i++) {
        tas_tensor_info info;
        tas_step_state_info(step, i, &info);
        printf(" %s", info.name);
    }
    printf("\n");
    free(zeros);
    tas_step_close(step);
    return 0;
}
