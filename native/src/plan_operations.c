/* The step's operations: the file's nodes in launch order, each a kernel launch or a copy, refused
 * as torch_adreno's Python runner refuses them (runner/__init__.py, read_step). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "step_plan.h"

static const char *const KERNEL_ATTRIBUTES[] = {
    "kernel_name", "opencl_source", "build_options", "global_size", "local_size", "buffers",
    "parameters",  "fx_nodes",      "graph",         "index_checks", "extensions",
};
static const char *const COPY_ATTRIBUTES[] = {"destination", "source", "nbytes"};
/* Standard ops the export writes into the main graph around the kernels (views of inputs and outputs). */
static const char *const PLUMBING_OPS[] = {"Constant", "Gather", "Reshape", "Slice"};

#define COUNT(array) (sizeof(array) / sizeof((array)[0]))

static int listed(const char *name, const char *const *names, size_t count) {
    for (size_t i = 0; i < count; i++)
        if (strcmp(name, names[i]) == 0) return 1;
    return 0;
}

static int compare_text(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Appends ", name" (or "name" first) to `out`, keeping it NUL-terminated within `size`. */
static void append_name(char *out, size_t size, const char *name) {
    size_t used = strlen(out);
    snprintf(out + used, size - used, "%s%s", used ? ", " : "", name);
}

/* The node carries exactly `expected`: otherwise names the unknown and the missing attributes. */
static tas_status check_attribute_names(const onnx_node *node, const char *where, const char *const *expected,
                                        size_t expected_count, error_record *error) {
    const char *unknown[64];
    size_t unknown_count = 0;
    for (size_t i = 0; i < node->attribute_count && unknown_count < COUNT(unknown); i++) {
        const char *name = node->attributes[i].name ? node->attributes[i].name : "";
        if (!listed(name, expected, expected_count)) unknown[unknown_count++] = name;
    }
    const char *missing[COUNT(KERNEL_ATTRIBUTES)];
    size_t missing_count = 0;
    for (size_t i = 0; i < expected_count; i++)
        if (onnx_find_attribute(node, expected[i]) == NULL) missing[missing_count++] = expected[i];
    if (!unknown_count && !missing_count) return TAS_OK;
    qsort(unknown, unknown_count, sizeof unknown[0], compare_text);
    qsort(missing, missing_count, sizeof missing[0], compare_text);
    char unknown_text[512] = "", missing_text[512] = "", expected_text[512] = "";
    for (size_t i = 0; i < unknown_count; i++) append_name(unknown_text, sizeof unknown_text, unknown[i]);
    for (size_t i = 0; i < missing_count; i++) append_name(missing_text, sizeof missing_text, missing[i]);
    for (size_t i = 0; i < expected_count; i++) append_name(expected_text, sizeof expected_text, expected[i]);
    return fail(error, TAS_ERROR_FORMAT,
                "%s has %s%s%s%s%s (a kernel node carries exactly: %s); a newer export? update torch_adreno", where,
                unknown_count ? "attributes this runner does not know: " : "", unknown_text,
                unknown_count && missing_count ? "; " : "", missing_count ? "no attribute " : "", missing_text,
                expected_text);
}

static tas_status typed_attribute(const onnx_node *node, const char *where, const char *name, int type,
                                  const onnx_attribute **out, error_record *error) {
    static const char *const TYPE_NAMES[] = {"", "a float", "an integer", "a string", "", "", "", "a list of integers",
                                             "a list of strings"};
    const onnx_attribute *attribute = onnx_find_attribute(node, name);
    /* (an empty list is written without its values: an attribute of the list's type and nothing else) */
    if (attribute == NULL || attribute->type != type || (type == ONNX_ATTRIBUTE_STRING && attribute->s == NULL))
        return fail(error, TAS_ERROR_FORMAT, "attribute %s of %s is not %s: a corrupted step file? export it again",
                    name, where, TYPE_NAMES[type]);
    *out = attribute;
    return TAS_OK;
}

static tas_status read_copy(const onnx_node *node, const char *where, step_operation *operation, error_record *error) {
    const onnx_attribute *destination = NULL, *source = NULL, *nbytes = NULL;
    tas_status status = typed_attribute(node, where, "destination", ONNX_ATTRIBUTE_INT, &destination, error);
    if (status == TAS_OK) status = typed_attribute(node, where, "source", ONNX_ATTRIBUTE_INT, &source, error);
    if (status == TAS_OK) status = typed_attribute(node, where, "nbytes", ONNX_ATTRIBUTE_INT, &nbytes, error);
    if (status != TAS_OK) return status;
    if (nbytes->i < 0) return fail(error, TAS_ERROR_FORMAT, "%s copies a negative number of bytes", where);
    operation->is_copy = 1;
    operation->copy.node_name = node->name ? node->name : node->op_type;
    operation->copy.destination = destination->i;
    operation->copy.source = source->i;
    operation->copy.nbytes = (uint64_t)nbytes->i;
    return TAS_OK;
}

static tas_status read_geometry(const onnx_attribute *global, const onnx_attribute *local, const char *where,
                                launch_operation *launch, error_record *error) {
    if (global->ints.count < 1 || global->ints.count > 3 || (local->ints.count && local->ints.count != global->ints.count))
        return fail(error, TAS_ERROR_FORMAT,
                    "%s launches %zu-dimensional work with a %zu-dimensional work-group; OpenCL takes 1 to 3 dimensions, "
                    "the same for both", where, global->ints.count, local->ints.count);
    launch->dimensions = (unsigned)global->ints.count;
    launch->has_local_size = local->ints.count != 0;
    for (size_t d = 0; d < global->ints.count; d++) {
        int64_t g = global->ints.items[d], l = launch->has_local_size ? local->ints.items[d] : 1;
        if (g < 1 || l < 1 || g > (int64_t)1 << 40 || l > (int64_t)1 << 20)
            return fail(error, TAS_ERROR_FORMAT, "%s has a work size of %lld (work-group %lld) in dimension %zu",
                        where, (long long)g, (long long)l, d);
        launch->global_size[d] = (size_t)g;
        launch->local_size[d] = (size_t)l;
    }
    return TAS_OK;
}

static tas_status read_launch(const onnx_node *node, const char *where, step_operation *operation, error_record *error) {
    const onnx_attribute *kernel_name = NULL, *source = NULL, *options = NULL, *global = NULL, *local = NULL,
                         *buffers = NULL, *checks = NULL, *extensions = NULL;
    tas_status status = typed_attribute(node, where, "kernel_name", ONNX_ATTRIBUTE_STRING, &kernel_name, error);
    if (status == TAS_OK) status = typed_attribute(node, where, "opencl_source", ONNX_ATTRIBUTE_STRING, &source, error);
    if (status == TAS_OK) status = typed_attribute(node, where, "build_options", ONNX_ATTRIBUTE_STRINGS, &options, error);
    if (status == TAS_OK) status = typed_attribute(node, where, "global_size", ONNX_ATTRIBUTE_INTS, &global, error);
    if (status == TAS_OK) status = typed_attribute(node, where, "local_size", ONNX_ATTRIBUTE_INTS, &local, error);
    if (status == TAS_OK) status = typed_attribute(node, where, "buffers", ONNX_ATTRIBUTE_INTS, &buffers, error);
    if (status == TAS_OK) status = typed_attribute(node, where, "index_checks", ONNX_ATTRIBUTE_INT, &checks, error);
    if (status == TAS_OK) status = typed_attribute(node, where, "extensions", ONNX_ATTRIBUTE_STRINGS, &extensions, error);
    if (status != TAS_OK) return status;
    launch_operation *launch = &operation->launch;
    status = read_geometry(global, local, where, launch, error);
    if (status != TAS_OK) return status;
    launch->node_name = node->name ? node->name : node->op_type;
    launch->kernel_name = kernel_name->s;
    launch->source = source->s;
    launch->buffers = buffers->ints.items;
    launch->buffer_count = buffers->ints.count;
    launch->index_checks = checks->i != 0;
    launch->extensions = (const char *const *)extensions->strings.items;
    launch->extension_count = extensions->strings.count;
    /* pyopencl joins the options with spaces (the empty ones the export writes for "none" dropped) */
    size_t length = 1;
    for (size_t i = 0; i < options->strings.count; i++) length += strlen(options->strings.items[i]) + 1;
    launch->options = calloc(length, 1);
    if (launch->options == NULL) return fail(error, TAS_ERROR_MEMORY, "out of memory");
    for (size_t i = 0; i < options->strings.count; i++) {
        const char *option = options->strings.items[i];
        if (!*option) continue;
        if (*launch->options) strcat(launch->options, " ");
        strcat(launch->options, option);
    }
    return TAS_OK;
}

static int defines_function(const onnx_model *model, const char *name) {
    for (size_t i = 0; i < model->function_count; i++) {
        const onnx_function_name *function = &model->functions[i];
        if (function->name && function->domain && strcmp(function->domain, STEP_DOMAIN) == 0 &&
            strcmp(function->name, name) == 0)
            return 1;
    }
    return 0;
}

static tas_status read_node(const onnx_model *model, const onnx_node *node, const char *origin, step_plan *plan,
                            error_record *error) {
    const char *op_type = node->op_type ? node->op_type : "";
    const char *domain = node->domain ? node->domain : "";
    char where[512];
    snprintf(where, sizeof where, "node %s of %s", node->name && *node->name ? node->name : op_type, origin);
    if (strcmp(domain, "") == 0 || strcmp(domain, "ai.onnx") == 0) {
        if (listed(op_type, PLUMBING_OPS, COUNT(PLUMBING_OPS))) return TAS_OK;
        return fail(error, TAS_ERROR_FORMAT,
                    "%s is a standard %s between kernels; the runner runs kernels and copies only (and Constant, "
                    "Gather, Reshape, Slice around them)", where, op_type);
    }
    if (strcmp(domain, STEP_DOMAIN) != 0)
        return fail(error, TAS_ERROR_FORMAT, "%s is an op of domain '%s'; the runner knows '" STEP_DOMAIN "' only",
                    where, domain);
    int is_copy = strcmp(op_type, STEP_COPY_OP) == 0;
    tas_status status = is_copy ? check_attribute_names(node, where, COPY_ATTRIBUTES, COUNT(COPY_ATTRIBUTES), error)
                                : check_attribute_names(node, where, KERNEL_ATTRIBUTES, COUNT(KERNEL_ATTRIBUTES), error);
    if (status != TAS_OK) return status;
    if (!defines_function(model, op_type))
        return fail(error, TAS_ERROR_FORMAT, "%s calls %s, which the file defines no function for", where, op_type);
    step_operation operation;
    memset(&operation, 0, sizeof operation);
    status = is_copy ? read_copy(node, where, &operation, error) : read_launch(node, where, &operation, error);
    if (status != TAS_OK) return status;
    plan->operations[plan->operation_count++] = operation; /* (room for every node was made) */
    return TAS_OK;
}

tas_status plan_read_operations(const onnx_model *model, const char *origin, step_plan *plan, error_record *error) {
    plan->operations = calloc(model->node_count + 1, sizeof *plan->operations);
    if (plan->operations == NULL) return fail(error, TAS_ERROR_MEMORY, "out of memory");
    for (size_t i = 0; i < model->node_count; i++) {
        tas_status status = read_node(model, &model->nodes[i], origin, plan, error);
        if (status != TAS_OK) return status;
    }
    if (plan->has_prediction && plan->prediction_operations > plan->operation_count)
        return fail(error, TAS_ERROR_FORMAT, "%s says its prediction is its last %zu operations; it has %zu", origin,
                    plan->prediction_operations, plan->operation_count);
    if (plan->fill_count && plan->fills[plan->fill_count - 1].before >= plan->operation_count)
        return fail(error, TAS_ERROR_FORMAT, "%s lists a fill before operation %zu; it has %zu operations", origin,
                    plan->fills[plan->fill_count - 1].before, plan->operation_count);
    return TAS_OK;
}

tas_status plan_check_origin(const onnx_model *model, const char *origin, error_record *error) {
    if (model->producer == NULL || strcmp(model->producer, STEP_PRODUCER) != 0)
        return fail(error, TAS_ERROR_FORMAT,
                    "%s was made by %s, not by torch_adreno's export: the runner runs only training steps exported "
                    "with TrainingStep.export / `python -m torch_adreno export`",
                    origin, model->producer && *model->producer ? model->producer : "an unnamed producer");
    const char *version = onnx_metadata(model, STEP_FORMAT_KEY);
    const char *json = onnx_metadata(model, STEP_PLAN_KEY);
    if (version == NULL || strcmp(version, STEP_FORMAT_VERSION) != 0 || json == NULL)
        return fail(error, TAS_ERROR_FORMAT,
                    "%s has step format %s; this runner reads format " STEP_FORMAT_VERSION " (metadata " STEP_FORMAT_KEY
                    " and " STEP_PLAN_KEY "): export it again", origin, version && *version ? version : "(none)");
    return TAS_OK;
}

tas_status plan_read(const onnx_model *model, const char *origin, step_plan *plan, error_record *error) {
    memset(plan, 0, sizeof *plan);
    tas_status status = plan_check_origin(model, origin, error);
    if (status != TAS_OK) return status;
    status = plan_read_memory(onnx_metadata(model, STEP_PLAN_KEY), origin, plan, error);
    if (status != TAS_OK) return status;
    return plan_read_operations(model, origin, plan, error);
}

void plan_free(step_plan *plan) {
    for (size_t i = 0; i < plan->identity_count; i++) free(plan->identities[i].input);
    free(plan->identities);
    free(plan->identity_at);
    free(plan->slots);
    for (size_t i = 0; i < plan->batch_count; i++) free(plan->batch[i].name);
    free(plan->batch);
    for (size_t i = 0; i < plan->operation_count; i++) free(plan->operations[i].launch.options);
    free(plan->operations);
    free(plan->fills);
    memset(plan, 0, sizeof *plan);
}
