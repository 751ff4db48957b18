/* JSON texts of the step server's descriptive replies (malloc'd; NULL when out of memory). */
#ifndef TORCH_ADRENO_STEP_JSON_REPLIES_H
#define TORCH_ADRENO_STEP_JSON_REPLIES_H

#include <stdint.h>

#include "torch_adreno_step.h"

/* HELLO: {"protocol", "server", "limits": {...}, "device": {...}}. */
char *hello_json(const tas_device_properties *device, const char *server, uint64_t max_message_bytes,
                 uint32_t max_steps_per_run, uint32_t max_text_bytes);
/* PROPERTIES: the "device" object alone (DeviceProfile's fields, by those names where it has them). */
char *properties_json(const tas_device_properties *device);
/* LOAD_STEP: {"batch": [...], "state": [...], summary fields}; each tensor {name, dtype, shape, bytes}. */
char *layout_json(tas_step *step, int profile);
/* PROFILE: {"last_step": {upload_ms, enqueue_ms, wait_ms}, "profiled", "operations": [{name,
 * milliseconds, runs}]}: the operations' device times summed since load or the last reset. */
char *profile_json(tas_step *step, int profile);

#endif
