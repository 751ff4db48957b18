/* A step file read into what the runtime enqueues: the memory plan of its metadata (JSON, read with
 * cJSON) and its nodes as launches and copies, checked as torch_adreno's Python runner checks
 * them (torch_adreno/runner/__init__.py, read_step), plus the bounds a native program must check
 * itself (slots, identities, views and copies that stay inside their buffers). */
#ifndef TORCH_ADRENO_STEP_PLAN_H
#define TORCH_ADRENO_STEP_PLAN_H

#include "common.h"
#include "onnx_reader.h"

/* torch_adreno/runner/format.py */
#define STEP_PRODUCER "torch_adreno"
#define STEP_DOMAIN "torch_adreno"
#define STEP_FORMAT_VERSION "4"
#define STEP_FORMAT_KEY "torch_adreno.format"
#define STEP_PLAN_KEY "torch_adreno.step"
#define STEP_COPY_OP "copy"
#define STEP_FILLS_KEY "fills"
/* The environment variable that turns fills on where tas_open_options leaves it to it. */
#define FILL_VARIABLE "TORCH_ADRENO_FILL_UNINITIALIZED_MEMORY"

typedef enum memory_kind { MEMORY_INTERNAL, MEMORY_PERSISTENT, MEMORY_BATCH } memory_kind;

typedef struct batch_view { /* elements of the batch input a batch identity holds (numpy as_strided) */
    int rank;
    int64_t shape[TAS_MAX_RANK];
    int64_t stride[TAS_MAX_RANK];
    int64_t offset;
} batch_view;

typedef struct plan_identity {
    int64_t index;
    memory_kind kind;
    uint64_t nbytes;
    int64_t slot;             /* internal: its slot, or -1 where the plan places it nowhere */
    char *input;              /* persistent: the state input holding its initial value */
    size_t batch;             /* batch: index into step_plan.batch */
    int has_view;
    batch_view view;
    int for_prediction;       /* batch: uploaded by the prediction, not the training step */
} plan_identity;

typedef struct tensor_spec {
    char *name;
    int64_t identity;         /* output specs */
    int position;             /* batch inputs: the argument position */
    tas_dtype dtype;
    int rank;
    int64_t shape[TAS_MAX_RANK];
    size_t elements, bytes;
} tensor_spec;

typedef struct launch_operation {
    const char *node_name, *kernel_name, *source; /* into the onnx_model */
    char *options;            /* the build options joined with spaces, as pyopencl passes them */
    unsigned dimensions;      /* 1 to 3 */
    size_t global_size[3];
    size_t local_size[3];
    int has_local_size;       /* an empty local_size lets the driver choose */
    const int64_t *buffers;   /* the memory identity of each argument, into the onnx_model */
    size_t buffer_count;
    int index_checks;         /* then also the index record and a token (runner/format.py) */
    const char *const *extensions;
    size_t extension_count;
} launch_operation;

typedef struct copy_operation {
    const char *node_name;
    int64_t destination, source;
    uint64_t nbytes;
} copy_operation;

/* Before operation `before`, `nbytes` of an internal identity's slot from `offset` (even) are set to
 * the fill pattern (runner/format.py, FILL_PATTERN), when filling is asked for. */
typedef struct plan_fill {
    size_t before;
    int64_t identity;
    uint64_t offset, nbytes;
} plan_fill;

typedef struct step_operation {
    int is_copy;
    launch_operation launch;
    copy_operation copy;
} step_operation;

typedef struct step_plan {
    plan_identity *identities;
    size_t identity_count;
    int64_t *identity_at;     /* memory identity -> position in identities, -1 for none */
    size_t identity_range;    /* 1 + the largest identity */
    uint64_t *slots;
    size_t slot_count;
    tensor_spec *batch;       /* the step's batch inputs, in argument order */
    size_t batch_count;
    tensor_spec loss;
    int has_prediction;
    size_t prediction_operations; /* the file's last operations: the eval-mode forward */
    tensor_spec prediction;
    step_operation *operations;
    size_t operation_count;
    int has_fills;            /* the file lists its fills (files exported before they were listed do not) */
    plan_fill *fills;         /* in operation order */
    size_t fill_count;
} step_plan;

/* Refuses a file of another producer or step format version (plan_read begins with it). */
tas_status plan_check_origin(const onnx_model *model, const char *origin, error_record *error);
/* Reads and checks `model`'s plan and operations; `origin` names the file in messages. */
tas_status plan_read(const onnx_model *model, const char *origin, step_plan *plan, error_record *error);
void plan_free(step_plan *plan);

/* The identity's entry, or NULL. */
const plan_identity *plan_identity_of(const step_plan *plan, int64_t index);

/* Internal: the two halves of plan_read (plan_memory.c, plan_operations.c). */
tas_status plan_read_memory(const char *json, const char *origin, step_plan *plan, error_record *error);
tas_status plan_read_operations(const onnx_model *model, const char *origin, step_plan *plan, error_record *error);

#endif
