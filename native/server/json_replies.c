/* The replies of the step server that describe things (the device, a loaded step's layout, its
 * profile) as JSON text: the client reads them into dicts, and fields can be added without a new
 * protocol version. The server only writes JSON; it parses none from the network. */
#include <stdlib.h>
#include <string.h>

#include "cJSON.h"
#include "json_replies.h"

static const char *const DTYPE_NAMES[] = {"float32", "int64", "int32", "bool", "uint8"};

static void add_number(cJSON *object, const char *name, double value) {
    cJSON_AddItemToObject(object, name, cJSON_CreateNumber(value));
}

static void add_bool(cJSON *object, const char *name, int value) {
    cJSON_AddItemToObject(object, name, cJSON_CreateBool(value != 0));
}

static void add_text(cJSON *object, const char *name, const char *value) {
    cJSON_AddItemToObject(object, name, cJSON_CreateString(value));
}

/* Prints and frees `object`; NULL when out of memory. */
static char *finish(cJSON *object) {
    char *text = object ? cJSON_PrintUnformatted(object) : NULL;
    cJSON_Delete(object);
    return text;
}

static cJSON *extension_list(const char *extensions) {
    cJSON *list = cJSON_CreateArray();
    const char *at = extensions;
    while (list && *at) {
        while (*at == ' ') at++;
        size_t length = strcspn(at, " ");
        if (length == 0) break;
        char name[256];
        if (length < sizeof name) {
            memcpy(name, at, length);
            name[length] = '\0';
            cJSON_AddItemToArray(list, cJSON_CreateString(name));
        }
        at += length;
    }
    return list;
}

static cJSON *device_object(const tas_device_properties *d) {
    cJSON *object = cJSON_CreateObject();
    if (object == NULL) return NULL;
    add_number(object, "index", (double)d->index);
    add_text(object, "platform", d->platform);
    add_text(object, "name", d->name);
    add_text(object, "vendor", d->vendor);
    add_text(object, "driver", d->driver);
    add_text(object, "opencl_version", d->version);
    add_text(object, "opencl_c_version", d->opencl_c_version);
    add_bool(object, "is_gpu", d->is_gpu);
    add_number(object, "compute_units", d->compute_units);
    add_number(object, "max_clock_mhz", d->max_clock_mhz);
    add_number(object, "max_work_group_size", (double)d->max_work_group);
    cJSON *sizes = cJSON_CreateArray();
    for (int i = 0; sizes && i < 3; i++) cJSON_AddItemToArray(sizes, cJSON_CreateNumber((double)d->max_work_item_sizes[i]));
    cJSON_AddItemToObject(object, "max_work_item_sizes", sizes);
    add_number(object, "preferred_work_group_multiple", (double)d->preferred_work_group_multiple);
    add_number(object, "local_mem_bytes", (double)d->local_memory);
    add_number(object, "global_mem_bytes", (double)d->global_memory);
    add_number(object, "max_alloc_bytes", (double)d->max_allocation);
    add_number(object, "base_addr_align_bits", d->base_address_align_bits);
    add_number(object, "max_parameter_bytes", (double)d->max_parameter_bytes);
    add_number(object, "address_bits", d->address_bits);
    add_bool(object, "unified_memory", d->unified_memory);
    add_bool(object, "image_support", d->image_support);
    add_bool(object, "fp16", strstr(d->extensions, "cl_khr_fp16") != NULL);
    add_number(object, "image2d_max_width", (double)d->image2d_max_width);
    add_number(object, "image2d_max_height", (double)d->image2d_max_height);
    add_number(object, "image_pitch_alignment", d->image_pitch_alignment);
    add_number(object, "image_base_address_alignment", d->image_base_address_alignment);
    add_text(object, "unusable", d->unusable);
    cJSON_AddItemToObject(object, "extensions", extension_list(d->extensions));
    return object;
}

char *properties_json(const tas_device_properties *device) {
    return finish(device_object(device));
}

char *hello_json(const tas_device_properties *device, const char *server, uint64_t max_message_bytes,
                 uint32_t max_steps_per_run, uint32_t max_text_bytes) {
    cJSON *object = cJSON_CreateObject(), *limits = cJSON_CreateObject();
    if (object == NULL || limits == NULL) {
        cJSON_Delete(object);
        cJSON_Delete(limits);
        return NULL;
    }
    add_number(object, "protocol", 1);
    add_text(object, "server", server);
    add_number(limits, "max_message_bytes", (double)max_message_bytes);
    add_number(limits, "max_steps_per_run", max_steps_per_run);
    add_number(limits, "max_text_bytes", max_text_bytes);
    cJSON_AddItemToObject(object, "limits", limits);
    cJSON_AddItemToObject(object, "device", device_object(device));
    return finish(object);
}

static cJSON *tensor_object(const tas_tensor_info *info) {
    cJSON *object = cJSON_CreateObject(), *shape = cJSON_CreateArray();
    if (object == NULL || shape == NULL) {
        cJSON_Delete(object);
        cJSON_Delete(shape);
        return NULL;
    }
    add_text(object, "name", info->name);
    add_text(object, "dtype", (unsigned)info->dtype < 5 ? DTYPE_NAMES[info->dtype] : "?");
    for (int d = 0; d < info->rank; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)info->shape[d]));
    cJSON_AddItemToObject(object, "shape", shape);
    add_number(object, "bytes", (double)info->bytes);
    return object;
}

char *layout_json(tas_step *step, int profile) {
    tas_step_summary summary;
    if (tas_step_summarize(step, &summary) != TAS_OK) return NULL;
    cJSON *object = cJSON_CreateObject(), *batch = cJSON_CreateArray(), *state = cJSON_CreateArray();
    if (object == NULL || batch == NULL || state == NULL) {
        cJSON_Delete(object);
        cJSON_Delete(batch);
        cJSON_Delete(state);
        return NULL;
    }
    tas_tensor_info info;
    for (size_t i = 0; i < tas_step_batch_count(step); i++)
        if (tas_step_batch_info(step, i, &info) == TAS_OK) cJSON_AddItemToArray(batch, tensor_object(&info));
    for (size_t i = 0; i < tas_step_state_count(step); i++)
        if (tas_step_state_info(step, i, &info) == TAS_OK) cJSON_AddItemToArray(state, tensor_object(&info));
    cJSON_AddItemToObject(object, "batch", batch);
    cJSON_AddItemToObject(object, "state", state);
    add_text(object, "device", summary.device);
    add_text(object, "driver", summary.driver);
    add_number(object, "operations", (double)summary.operations);
    add_number(object, "kernels", (double)summary.kernels);
    add_number(object, "programs_built", (double)summary.programs_built);
    add_number(object, "programs_cached", (double)summary.programs_cached);
    add_number(object, "device_bytes", (double)summary.device_bytes);
    add_bool(object, "profile", profile);
    return finish(object);
}

char *profile_json(tas_step *step, int profile) {
    tas_step_phases phases = {0, 0, 0};
    tas_step_summary summary;
    if (tas_step_last_phases(step, &phases) != TAS_OK || tas_step_summarize(step, &summary) != TAS_OK) return NULL;
    cJSON *object = cJSON_CreateObject(), *last = cJSON_CreateObject(), *operations = cJSON_CreateArray();
    if (object == NULL || last == NULL || operations == NULL) {
        cJSON_Delete(object);
        cJSON_Delete(last);
        cJSON_Delete(operations);
        return NULL;
    }
    add_number(last, "upload_ms", phases.upload_ms);
    add_number(last, "enqueue_ms", phases.enqueue_ms);
    add_number(last, "wait_ms", phases.wait_ms);
    cJSON_AddItemToObject(object, "last_step", last);
    add_bool(object, "profiled", profile);
    for (size_t i = 0; profile && i < summary.operations; i++) {
        const char *name;
        double milliseconds;
        size_t runs;
        if (tas_step_kernel_time(step, i, &name, &milliseconds, &runs) != TAS_OK) continue;
        cJSON *row = cJSON_CreateObject();
        if (row == NULL) continue;
        add_text(row, "name", name);
        add_number(row, "milliseconds", milliseconds);
        add_number(row, "runs", (double)runs);
        cJSON_AddItemToArray(operations, row);
    }
    cJSON_AddItemToObject(object, "operations", operations);
    return finish(object);
}
