/* The ONNX reader (src/onnx_reader.c) and the plan's checks (src/plan_memory.c,
 * src/plan_operations.c): the fixture step file read into its launches, copy, memory plan and
 * fills as the Python runner reads it; every truncation of it and random bytes ending in a clean
 * error; plans and nodes that break a rule refused naming it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fixtures.h"
#include "onnx_reader.h"
#include "step_plan.h"

static void test_the_step_file_reads_as_exported(void) {
    onnx_model model;
    step_plan plan;
    memset(&plan, 0, sizeof plan);
    error_record error = {TAS_OK, ""};
    if (!CHECK_INT(onnx_read_memory(fixture_step_file, fixture_step_file_size, "step.onnx", &model, &error), TAS_OK)) {
        onnx_free(&model);
        return;
    }
    CHECK_TEXT(model.producer, "torch_adreno");
    CHECK_TEXT(onnx_metadata(&model, STEP_FORMAT_KEY), "4");
    CHECK_INT(model.node_count, 3);
    CHECK_INT(model.function_count, 3);
    const onnx_initializer *w = onnx_find_initializer(&model, "w");
    if (CHECK(w != NULL)) {
        CHECK_INT(w->rank, 1);
        CHECK_INT(w->dims[0], 1);
        CHECK_INT(w->storage, STORAGE_RAW);
        CHECK_INT(w->raw_length, 4);
        CHECK(w->raw == fixture_step_file + fixture_step_w_offset); /* not copied: a view of the file */
    }
    CHECK_INT(plan_read(&model, "step.onnx", &plan, &error), TAS_OK);
    CHECK_INT(plan.operation_count, 3);
    if (plan.operation_count == 3) {
        const launch_operation *k0 = &plan.operations[0].launch, *k1 = &plan.operations[2].launch;
        CHECK(!plan.operations[0].is_copy && plan.operations[1].is_copy && !plan.operations[2].is_copy);
        CHECK_TEXT(k0->kernel_name, "k0");
        CHECK_INT(k0->dimensions, 1);
        CHECK_INT(k0->global_size[0], 6);
        CHECK_INT(k0->local_size[0], 6);
        CHECK(k0->has_local_size);
        CHECK_TEXT(k0->options, "");
        CHECK_INT(k0->buffer_count, 2);
        CHECK(k0->buffer_count == 2 && k0->buffers[0] == 0 && k0->buffers[1] == 1);
        CHECK_HAS(k0->source, "out0[i] = in0[i] * 2.0f;");
        CHECK_TEXT(k1->options, "-cl-fast-relaxed-math -DN=6"); /* the empty option dropped, as pyopencl does */
        CHECK_INT(k1->buffer_count, 3);
        const copy_operation *copy = &plan.operations[1].copy;
        CHECK_INT(copy->destination, 2);
        CHECK_INT(copy->source, 1);
        CHECK_INT(copy->nbytes, 24);
    }
    CHECK_INT(plan.slot_count, 3);
    CHECK(plan.slot_count == 3 && plan.slots[0] == 24 && plan.slots[2] == 4);
    CHECK_INT(plan.batch_count, 1);
    if (plan.batch_count == 1) {
        CHECK_TEXT(plan.batch[0].name, "batch_0");
        CHECK_INT(plan.batch[0].dtype, TAS_FLOAT32);
        CHECK_INT(plan.batch[0].bytes, 48);
    }
    const plan_identity *view = plan_identity_of(&plan, 0), *state = plan_identity_of(&plan, 3);
    if (CHECK(view != NULL && state != NULL)) {
        CHECK_INT(view->kind, MEMORY_BATCH);
        CHECK(view->has_view && view->view.rank == 2 && view->view.shape[0] == 2 && view->view.shape[1] == 3 &&
              view->view.stride[0] == 3 && view->view.stride[1] == 1 && view->view.offset == 3);
        CHECK_INT(state->kind, MEMORY_PERSISTENT);
        CHECK_TEXT(state->input, "w");
    }
    CHECK(plan_identity_of(&plan, 5) == NULL);
    CHECK_INT(plan.loss.identity, 4);
    CHECK(plan.has_fills);
    CHECK_INT(plan.fill_count, 1);
    CHECK(plan.fill_count == 1 && plan.fills[0].before == 2 && plan.fills[0].identity == 4 &&
          plan.fills[0].nbytes == 4);
    plan_free(&plan);
    onnx_free(&model);
}

/* Reads `size` bytes as a step file; TAS_OK only when the reader and the plan accept them. Any
 * refusal must be a format error with a message. */
static tas_status read_step_bytes(const uint8_t *data, size_t size) {
    onnx_model model;
    step_plan plan;
    memset(&plan, 0, sizeof plan);
    error_record error = {TAS_OK, ""};
    tas_status status = onnx_read_memory(data, size, "cut.onnx", &model, &error);
    if (status == TAS_OK) status = plan_read(&model, "cut.onnx", &plan, &error);
    if (status != TAS_OK) {
        CHECK_INT(status, TAS_ERROR_FORMAT);
        CHECK(error.message[0] != '\0');
    }
    plan_free(&plan);
    onnx_free(&model);
    return status;
}

static void test_truncated_and_random_bytes_end_in_a_clean_error(void) {
    size_t refused = 0;
    for (size_t size = 0; size < fixture_step_file_size; size++) {
        /* (a copy of exactly `size` bytes, so that the sanitizers see a read past the cut) */
        uint8_t *cut = malloc(size ? size : 1);
        if (!CHECK(cut != NULL)) return;
        memcpy(cut, fixture_step_file, size);
        refused += read_step_bytes(cut, size) != TAS_OK;
        free(cut);
    }
    CHECK_INT(refused, fixture_step_file_size); /* (the file ends with the functions, each one needed) */

    uint64_t state = 0x2545F4914F6CDD1Dull;
    uint8_t garbage[512];
    for (int round = 0; round < 200; round++) {
        size_t size = 1 + (size_t)(round * 37 % 512);
        for (size_t i = 0; i < size; i++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            garbage[i] = (uint8_t)(state >> 56);
        }
        CHECK(read_step_bytes(garbage, size) != TAS_OK);
    }
    onnx_model model;
    error_record error = {TAS_OK, ""};
    step_plan plan;
    memset(&plan, 0, sizeof plan);
    onnx_read_memory(fixture_step_file, 0, "empty.onnx", &model, &error); /* an empty ModelProto */
    CHECK_INT(plan_read(&model, "empty.onnx", &plan, &error), TAS_ERROR_FORMAT);
    CHECK_HAS(error.message, "empty.onnx was made by an unnamed producer, not by torch_adreno's export");
    plan_free(&plan);
    onnx_free(&model);
}

/* plan_read_memory of `json`: its status, the message in `error`. */
static tas_status read_plan(const char *json, error_record *error) {
    step_plan plan;
    memset(&plan, 0, sizeof plan);
    *error = (error_record){TAS_OK, ""};
    tas_status status = plan_read_memory(json, "plan.onnx", &plan, error);
    plan_free(&plan);
    return status;
}

#define LOSS "\"loss\": {\"identity\": 1, \"dtype\": \"float32\", \"shape\": []}"
#define BATCH "\"batch\": [{\"input\": \"batch_0\", \"position\": 0, \"shape\": [4, 3], \"dtype\": \"float32\"}]"

static void test_plans_that_break_a_rule_are_refused_naming_it(void) {
    static const struct { const char *json, *message; } CASES[] = {
        {"[1, 2]", "the step plan of plan.onnx (metadata torch_adreno.step) is not a JSON object"},
        {"{\"slots\": [4], \"batch\": [], \"identities\": [{\"index\": 1, \"kind\": \"internal\", \"nbytes\": 4, "
         "\"slot\": 1}], " LOSS "}", "identity 1 names a slot the plan does not have"},
        {"{\"slots\": [4], \"batch\": [], \"identities\": [{\"index\": 1, \"kind\": \"internal\", \"nbytes\": 4, "
         "\"slot\": 0}, {\"index\": 1, \"kind\": \"internal\", \"nbytes\": 4, \"slot\": 0}], " LOSS "}",
         "identity 1 is listed twice"},
        {"{\"slots\": [4], " BATCH ", \"identities\": [{\"index\": 0, \"kind\": \"batch\", \"nbytes\": 48, "
         "\"position\": 0, \"view\": [[2, 3], [3, 1], 7]}, {\"index\": 1, \"kind\": \"internal\", \"nbytes\": 4, "
         "\"slot\": 0}], " LOSS "}", "the view of identity 0 reaches past its batch input"},
        {"{\"slots\": [4], " BATCH ", \"identities\": [{\"index\": 0, \"kind\": \"batch\", \"nbytes\": 44, "
         "\"position\": 0}, {\"index\": 1, \"kind\": \"internal\", \"nbytes\": 4, \"slot\": 0}], " LOSS "}",
         "identity 0 is smaller than the batch it holds"},
        {"{\"slots\": [4], " BATCH ", \"identities\": [{\"index\": 0, \"kind\": \"batch\", \"nbytes\": 48, "
         "\"position\": 1}], " LOSS "}", "identity 0 reads a batch argument the step does not take"},
        {"{\"slots\": [8], \"batch\": [], \"identities\": [{\"index\": 1, \"kind\": \"internal\", \"nbytes\": 8, "
         "\"slot\": 0}], \"loss\": {\"identity\": 1, \"dtype\": \"int64\", \"shape\": []}}",
         "plan.onnx has a loss of int64 with 1 elements; this runtime reads one float32 loss per step"},
        {"{\"slots\": [], \"batch\": [], \"identities\": [{\"index\": 1, \"kind\": \"shared\", \"nbytes\": 4}], " LOSS
         "}", "plan.onnx has memory of kind 'shared' (identity 1), which this runtime cannot provide"},
        {"{\"slots\": [4], \"batch\": [], \"identities\": [{\"index\": 1, \"kind\": \"internal\", \"nbytes\": 4, "
         "\"slot\": 0}], " LOSS ", \"fills\": [[0, 1, 2, 4]]}", "fill 0 is not inside the slot of an internal identity"},
        {"{\"slots\": [4], \"batch\": [], \"identities\": [{\"index\": 1, \"kind\": \"internal\", \"nbytes\": 4, "
         "\"slot\": 0}], " LOSS ", \"fills\": [[3, 1, 0, 4], [2, 1, 0, 4]]}",
         "fill 1 comes before the fill ahead of it"},
        {"{\"slots\": [4], \"batch\": [], \"identities\": [{\"index\": 10000001, \"kind\": \"internal\", "
         "\"nbytes\": 4, \"slot\": 0}], " LOSS "}", "identity 0 has no index below 10000000"},
    };
    error_record error;
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        CHECK_INT(read_plan(CASES[i].json, &error), TAS_ERROR_FORMAT);
        CHECK_HAS(error.message, CASES[i].message);
    }
    /* and the smallest plan that keeps every rule */
    CHECK_INT(read_plan("{\"slots\": [4], \"batch\": [], \"identities\": [{\"index\": 1, \"kind\": \"internal\", "
                        "\"nbytes\": 4, \"slot\": 0}], " LOSS ", \"fills\": [[0, 1, 0, 4]]}", &error), TAS_OK);
}

/* Reads the fixture, lets `change` alter node `node` of the model, and reads the operations. */
static tas_status read_changed(size_t node, void (*change)(onnx_model *, onnx_node *), error_record *error) {
    onnx_model model;
    step_plan plan;
    memset(&plan, 0, sizeof plan);
    *error = (error_record){TAS_OK, ""};
    tas_status status = onnx_read_memory(fixture_step_file, fixture_step_file_size, "step.onnx", &model, error);
    CHECK_INT(status, TAS_OK);
    if (status == TAS_OK) {
        change(&model, &model.nodes[node]);
        status = plan_read(&model, "step.onnx", &plan, error);
    }
    plan_free(&plan);
    onnx_free(&model);
    return status;
}

static void replace_text(char **text, const char *with) {
    free(*text);
    *text = copy_text(with, strlen(with));
}

static void standard_op(onnx_model *model, onnx_node *node) {
    (void)model;
    replace_text(&node->op_type, "Add");
    replace_text(&node->domain, "");
}

static void other_domain(onnx_model *model, onnx_node *node) {
    (void)model;
    replace_text(&node->domain, "com.example");
}

static void renamed_attribute(onnx_model *model, onnx_node *node) {
    (void)model;
    onnx_attribute *graph = (onnx_attribute *)onnx_find_attribute(node, "graph");
    if (CHECK(graph != NULL)) replace_text(&graph->name, "graph_name");
}

static void no_function(onnx_model *model, onnx_node *node) {
    (void)node;
    for (size_t i = 0; i < model->function_count; i++)
        if (strcmp(model->functions[i].name, "k0") == 0) replace_text(&model->functions[i].name, "k9");
}

static void empty_work(onnx_model *model, onnx_node *node) {
    (void)model;
    onnx_attribute *global = (onnx_attribute *)onnx_find_attribute(node, "global_size");
    if (CHECK(global != NULL && global->ints.count == 1)) global->ints.items[0] = 0;
}

static void negative_copy(onnx_model *model, onnx_node *node) {
    (void)model;
    onnx_attribute *nbytes = (onnx_attribute *)onnx_find_attribute(node, "nbytes");
    if (CHECK(nbytes != NULL)) nbytes->i = -24;
}

static void test_nodes_that_break_a_rule_are_refused_naming_it(void) {
    error_record error;
    CHECK_INT(read_changed(0, standard_op, &error), TAS_ERROR_FORMAT);
    CHECK_HAS(error.message, "node k0 of step.onnx is a standard Add between kernels");
    CHECK_INT(read_changed(0, other_domain, &error), TAS_ERROR_FORMAT);
    CHECK_HAS(error.message, "node k0 of step.onnx is an op of domain 'com.example'");
    CHECK_INT(read_changed(2, renamed_attribute, &error), TAS_ERROR_FORMAT);
    CHECK_HAS(error.message, "node k1 of step.onnx has attributes this runner does not know: graph_name; no "
                             "attribute graph");
    CHECK_INT(read_changed(0, no_function, &error), TAS_ERROR_FORMAT);
    CHECK_HAS(error.message, "node k0 of step.onnx calls k0, which the file defines no function for");
    CHECK_INT(read_changed(0, empty_work, &error), TAS_ERROR_FORMAT);
    CHECK_HAS(error.message, "node k0 of step.onnx has a work size of 0 (work-group 6) in dimension 0");
    CHECK_INT(read_changed(1, negative_copy, &error), TAS_ERROR_FORMAT);
    CHECK_HAS(error.message, "node copy of step.onnx copies a negative number of bytes");
}

int main(void) {
    test_the_step_file_reads_as_exported();
    test_truncated_and_random_bytes_end_in_a_clean_error();
    test_plans_that_break_a_rule_are_refused_naming_it();
    test_nodes_that_break_a_rule_are_refused_naming_it();
    return check_finish("test_onnx_plan");
}
