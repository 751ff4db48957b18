/* torch_adreno_step: train a step exported by torch_adreno (TrainingStep.export, one ONNX file) on
 * an OpenCL device, without Python or PyTorch.
 *
 *     tas_open_options options = {0};              // defaults: see tas_open_options
 *     tas_step *step = NULL;
 *     if (tas_step_open("step.onnx", &options, &step) != TAS_OK) {
 *         fprintf(stderr, "%s\n", tas_step_error(step));   // step is set even on failure
 *         tas_step_close(step);
 *         return 1;
 *     }
 *     const void *batch[2] = {x, y};                // host arrays in the step's batch order
 *     size_t bytes[2] = {x_bytes, y_bytes};
 *     float loss;
 *     tas_step_run(step, batch, bytes, &loss);      // the state stays on the device
 *     tas_step_save_state(step, "trained.safetensors");
 *     tas_step_close(step);
 *
 * Errors: every function returns a tas_status; on anything but TAS_OK, tas_step_error(step) says
 * what was wrong and what to do. The library never exits or aborts on bad input.
 *
 * Threads: a tas_step is not thread-safe; use one from one thread at a time (a mutex around the
 * calls is enough). Separate tas_step handles may be used from separate threads at once: the
 * library keeps no global state (each handle loads its own reference to libOpenCL).
 *
 * The batch and state are host arrays in C order, little-endian, of the dtypes the file declares
 * (tas_step_batch_info, tas_step_state_info). */
#ifndef TORCH_ADRENO_STEP_H
#define TORCH_ADRENO_STEP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define TAS_EXPORT __declspec(dllexport)
#else
#define TAS_EXPORT __attribute__((visibility("default")))
#endif

#define TAS_MAX_RANK 8

typedef enum tas_status {
    TAS_OK = 0,
    TAS_ERROR_ARGUMENT = 1, /* a bad argument: NULL, a size that does not match, an unknown name */
    TAS_ERROR_FILE = 2,     /* a file that cannot be opened, read or written */
    TAS_ERROR_FORMAT = 3,   /* a malformed file, or one this runtime does not run (another format version) */
    TAS_ERROR_DEVICE = 4,   /* no OpenCL library or device, or a device lacking what the step needs */
    TAS_ERROR_OPENCL = 5,   /* an OpenCL call failed (building a kernel, allocating, running) */
    TAS_ERROR_MEMORY = 6,   /* the host ran out of memory */
    TAS_ERROR_INDEX = 7     /* a batch value indexed out of range: that step's results are invalid */
} tas_status;

typedef enum tas_dtype { TAS_FLOAT32 = 0, TAS_INT64 = 1, TAS_INT32 = 2, TAS_BOOL = 3, TAS_UINT8 = 4 } tas_dtype;

typedef struct tas_tensor_info {
    const char *name;  /* valid while the step is open */
    tas_dtype dtype;
    int rank;
    int64_t shape[TAS_MAX_RANK];
    size_t bytes;
} tas_tensor_info;

typedef struct tas_open_options {
    /* An OpenCL device: its index among all devices ("0", "1"), or a substring of
     * "platform: device name". NULL: the environment variable TORCH_ADRENO_DEVICE, else the first
     * GPU, else the first device (the rule of torch_adreno's Python runner). */
    const char *device;
    /* The OpenCL library to load. NULL: TORCH_ADRENO_OPENCL_LIBRARY, else libOpenCL.so,
     * libOpenCL.so.1, /vendor/lib64/libOpenCL.so, /system/vendor/lib64/libOpenCL.so in turn. */
    const char *opencl_library;
    /* A folder for built program binaries, keyed by source, build options, device and driver
     * (created if missing). NULL: every program is built from source at each open. */
    const char *cache_dir;
    /* Nonzero: time every launch with OpenCL profiling events (tas_step_kernel_time). */
    int profile;
    /* Positive: before each step's operations, fill the memory they make with the word 0x7FFF
     * repeated (NaN as float32, float16 and bfloat16, an out-of-range index as int32 and int64)
     * before its first write, where the file lists it, so that a kernel reading memory nothing wrote
     * gives NaN or an index error instead of stale values; a correct step's results are the same
     * bits. Negative: never. 0: as the environment variable TORCH_ADRENO_FILL_UNINITIALIZED_MEMORY
     * says (1/true/yes/on; default off). A file exported before fills were listed is refused with
     * filling on. */
    int fill_uninitialized_memory;
} tas_open_options;

typedef struct tas_step tas_step;

/* Reads the step file, checks it against the device, allocates its memory, builds its programs and
 * binds every kernel argument. *step is set in all cases but out of memory (then NULL): on failure
 * read the message with tas_step_error, then close it. */
TAS_EXPORT tas_status tas_step_open(const char *path, const tas_open_options *options, tas_step **step);
/* tas_step_open on a step file's bytes in memory (received over a socket, say); `origin` names it
 * in messages. The bytes are read during the call only: the step keeps no pointer to them. */
TAS_EXPORT tas_status tas_step_open_memory(const void *bytes, size_t size, const char *origin,
                                           const tas_open_options *options, tas_step **step);
/* Releases everything the step holds; NULL is allowed. */
TAS_EXPORT void tas_step_close(tas_step *step);
/* The message of the last failure ("" if none); "out of memory" for a NULL step. */
TAS_EXPORT const char *tas_step_error(const tas_step *step);

/* The step's batch inputs, in the order tas_step_run takes them. */
TAS_EXPORT size_t tas_step_batch_count(const tas_step *step);
TAS_EXPORT tas_status tas_step_batch_info(tas_step *step, size_t index, tas_tensor_info *info);

/* One training step on the batch (tas_step_batch_count arrays, bytes[i] each, as
 * tas_step_batch_info describes); writes the loss. The kernels update the state in place.
 * TAS_ERROR_INDEX: a batch value indexed out of range (say a token id >= the vocabulary); that
 * step's update was applied with the index replaced by 0. */
TAS_EXPORT tas_status tas_step_run(tas_step *step, const void *const *batch, const size_t *bytes, float *loss);

/* How tas_step_run enqueues the training step. By default it is recorded once, at the first run,
 * into the driver where it offers a way, and each run enqueues the recording: one call per step
 * instead of one per operation (a cl_khr_command_buffer; Qualcomm's cl_qcom_recordable_queues only
 * with TORCH_ADRENO_REPLAY_COMMAND_BUFFERS=1: that path has not run on a device; the variable's 0
 * turns recording off). A step opened with profiling, and the prediction, enqueue operation by
 * operation. Results are the same bits either way. tas_step_set_recording(step, 0) enqueues
 * operation by operation from the next run, 1 the recording again (where there is one). */
TAS_EXPORT tas_status tas_step_set_recording(tas_step *step, int recording);
/* Sets *path to how runs enqueue the step now, e.g. "command buffer (cl_khr_command_buffer 1.0.0)"
 * or "operation by operation (the device offers no cl_khr_command_buffer)" (valid until the next
 * call on the step); records the step first if no run did, which may fail. */
TAS_EXPORT tas_status tas_step_enqueue_path(tas_step *step, const char **path);

/* Where the last tas_step_run's wall time went, in milliseconds: the batch gathered and its writes
 * enqueued, the launches and copies enqueued, then the wait for the loss (the device's remaining
 * work and the read back). A device that computes while the host enqueues hides enqueue_ms. */
typedef struct tas_step_phases {
    double upload_ms;
    double enqueue_ms;
    double wait_ms;
} tas_step_phases;
TAS_EXPORT tas_status tas_step_last_phases(const tas_step *step, tas_step_phases *phases);

/* The model's eval-mode output on `input` (batch input 0's geometry) with the current state, when
 * the file holds a prediction (exported with predict=, as `python -m torch_adreno export` does). */
TAS_EXPORT int tas_step_can_predict(const tas_step *step);
TAS_EXPORT tas_status tas_step_predict_info(tas_step *step, tas_tensor_info *output);
TAS_EXPORT tas_status tas_step_predict(tas_step *step, const void *input, size_t input_bytes, void *output,
                                       size_t output_bytes);

/* The state: parameters, buffers, optimizer state, a tensor learning rate "lr", by the names the
 * export gave them. Reading copies from the device; writing replaces the value on the device. */
TAS_EXPORT size_t tas_step_state_count(const tas_step *step);
TAS_EXPORT tas_status tas_step_state_info(tas_step *step, size_t index, tas_tensor_info *info);
TAS_EXPORT tas_status tas_step_read_state(tas_step *step, const char *name, void *data, size_t bytes);
TAS_EXPORT tas_status tas_step_write_state(tas_step *step, const char *name, const void *data, size_t bytes);
/* Sets a one-element state tensor such as "lr" (a hyper-parameter the file takes as an input),
 * converting `value` to its dtype. TAS_ERROR_ARGUMENT if there is none of that name or size. */
TAS_EXPORT tas_status tas_step_set_scalar(tas_step *step, const char *name, double value);
/* Every state tensor to a safetensors file (loads with safetensors.torch.load_file and
 * torch_adreno.export.load_state), or from one (each tensor it holds must be state of this step,
 * of the same dtype and shape; state it lacks keeps its value). */
TAS_EXPORT tas_status tas_step_save_state(tas_step *step, const char *path);
TAS_EXPORT tas_status tas_step_load_state(tas_step *step, const char *path);

typedef struct tas_step_summary {
    const char *device;         /* "platform: device name" */
    const char *driver;         /* the driver version */
    size_t operations;          /* launches and copies of one training step */
    size_t kernels;             /* launches of one training step */
    size_t programs_built;      /* programs compiled from source at open */
    size_t programs_cached;     /* programs loaded from the binary cache at open */
    uint64_t device_bytes;      /* bytes of every buffer the step allocated */
} tas_step_summary;
TAS_EXPORT tas_status tas_step_summarize(tas_step *step, tas_step_summary *summary);

/* With tas_open_options.profile: the device time of each training-step operation, summed over
 * every tas_step_run since open (or since tas_step_reset_times). `name` is the file's node name. */
TAS_EXPORT tas_status tas_step_kernel_time(tas_step *step, size_t operation, const char **name,
                                           double *milliseconds, size_t *runs);
TAS_EXPORT void tas_step_reset_times(tas_step *step);

typedef struct tas_device_info {
    char platform[128];
    char name[128];
    char version[128];
    char driver[64];
    int is_gpu;
    uint64_t global_memory;
    uint64_t max_allocation;
    size_t max_work_group;
} tas_device_info;

/* Everything a compiler needs to plan kernels for a device (torch_adreno's DeviceProfile): the
 * driver's CL_DEVICE_* values, and the preferred work-group multiple of a probe kernel it built. */
typedef struct tas_device_properties {
    size_t index;                   /* among all devices, as tas_open_options.device counts them */
    char platform[128];
    char name[128];
    char vendor[128];
    char version[128];              /* CL_DEVICE_VERSION: "OpenCL 3.0 ..." */
    char opencl_c_version[128];
    char driver[64];
    int is_gpu;
    int unified_memory;             /* CL_DEVICE_HOST_UNIFIED_MEMORY */
    int image_support;
    uint32_t compute_units;
    uint32_t max_clock_mhz;
    uint32_t address_bits;
    uint32_t base_address_align_bits; /* CL_DEVICE_MEM_BASE_ADDR_ALIGN */
    size_t max_work_group;
    size_t max_work_item_sizes[3];
    size_t preferred_work_group_multiple; /* 0 when the probe kernel did not build (see unusable) */
    size_t max_parameter_bytes;
    uint64_t local_memory;
    uint64_t global_memory;
    uint64_t max_allocation;
    size_t image2d_max_width, image2d_max_height;         /* 0 without image support */
    uint32_t image_pitch_alignment, image_base_address_alignment; /* 0 where not reported */
    char unusable[512];             /* why kernels cannot be built here ("" when they can) */
    char extensions[8192];          /* space-separated, as the driver lists them (cut at 8191 bytes) */
} tas_device_properties;

/* The properties of the device `device` names (NULL: the default rule of tas_open_options.device).
 * On failure `message` (if not NULL) says why. */
TAS_EXPORT tas_status tas_describe_device(const char *opencl_library, const char *device,
                                          tas_device_properties *properties, char *message, size_t message_size);

/* The OpenCL devices in the order tas_open_options.device indexes them. Fills up to `capacity`
 * entries and sets *count to the number of devices. On failure `message` (if not NULL) says why. */
TAS_EXPORT tas_status tas_list_devices(const char *opencl_library, tas_device_info *devices, size_t capacity,
                                       size_t *count, char *message, size_t message_size);

#ifdef __cplusplus
}
#endif

#endif
