#include "program_cache.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A cache file: this magic, the key's length and bytes (compared whole on a hit, so a hash
 * collision is a miss, never a wrong program), the binary's length and bytes. */
static const char MAGIC[8] = {'T', 'A', 'S', 'P', 'R', 'O', 'G', '1'};

typedef struct byte_text {
    char *data;
    size_t length;
} byte_text;

/* source NUL options NUL platform NUL device NUL device version NUL driver version */
static int cache_key(const opencl_device *device, const program_request *request, byte_text *key) {
    const char *parts[] = {request->source, request->options, device->info.platform, device->info.name,
                           device->info.version, device->info.driver};
    size_t length = 0;
    for (size_t i = 0; i < 6; i++) length += strlen(parts[i]) + 1;
    key->data = malloc(length);
    if (key->data == NULL) return 0;
    key->length = 0;
    for (size_t i = 0; i < 6; i++) {
        size_t n = strlen(parts[i]) + 1;
        memcpy(key->data + key->length, parts[i], n);
        key->length += n;
    }
    return 1;
}

/* 128 bits of FNV-1a (two 64-bit lanes of different offsets) as the file name. */
static void cache_path(const char *cache_dir, const byte_text *key, char *path, size_t size) {
    uint64_t a = 0xcbf29ce484222325ULL, b = 0x84222325cbf29ce4ULL;
    for (size_t i = 0; i < key->length; i++) {
        a = (a ^ (uint8_t)key->data[i]) * 0x100000001b3ULL;
        b = (b ^ (uint8_t)key->data[i]) * 0x100000001b3ULL;
    }
    snprintf(path, size, "%s/%016llx%016llx.clbin", cache_dir, (unsigned long long)a, (unsigned long long)b);
}

tas_status make_folders(const char *path, error_record *error) {
    char partial[1024];
    if (snprintf(partial, sizeof partial, "%s", path) >= (int)sizeof partial)
        return fail(error, TAS_ERROR_FILE, "the folder name %s is too long", path);
    for (char *at = partial + 1;; at++) {
        if (*at == '/' || *at == '\0') {
            char saved = *at;
            *at = '\0';
            if (mkdir(partial, 0755) != 0 && errno != EEXIST)
                return fail(error, TAS_ERROR_FILE, "cannot create the folder %s: %s", partial, strerror(errno));
            *at = saved;
            if (saved == '\0') break;
        }
    }
    return TAS_OK;
}

/* The cached binary for `key`, or NULL (no file, another key, a short file). */
static unsigned char *read_cached(const char *path, const byte_text *key, size_t *binary_length) {
    FILE *file = fopen(path, "rb");
    if (file == NULL) return NULL;
    char magic[8];
    uint64_t stored_key_length = 0, stored_binary_length = 0;
    unsigned char *binary = NULL;
    char *stored_key = NULL;
    int ok = fread(magic, 1, 8, file) == 8 && memcmp(magic, MAGIC, 8) == 0 &&
             fread(&stored_key_length, sizeof stored_key_length, 1, file) == 1 && stored_key_length == key->length;
    if (ok) ok = (stored_key = malloc(key->length)) != NULL && fread(stored_key, 1, key->length, file) == key->length &&
                 memcmp(stored_key, key->data, key->length) == 0;
    if (ok) ok = fread(&stored_binary_length, sizeof stored_binary_length, 1, file) == 1 && stored_binary_length > 0 &&
                 stored_binary_length < ((uint64_t)1 << 31);
    if (ok) ok = (binary = malloc((size_t)stored_binary_length)) != NULL &&
                 fread(binary, 1, (size_t)stored_binary_length, file) == stored_binary_length;
    fclose(file);
    free(stored_key);
    if (!ok) {
        free(binary);
        return NULL;
    }
    *binary_length = (size_t)stored_binary_length;
    return binary;
}

/* Writes the program's binary under `path` (through a temporary file renamed into place, so that
 * a concurrent reader sees the old file or the new one). */
static tas_status store(const opencl_api *api, cl_program program, const char *path, const byte_text *key,
                        error_record *error) {
    size_t binary_length = 0;
    cl_int code = api->GetProgramInfo(program, CL_PROGRAM_BINARY_SIZES, sizeof binary_length, &binary_length, NULL);
    if (code != CL_SUCCESS || binary_length == 0) return TAS_OK; /* a driver without binaries: nothing to keep */
    unsigned char *binary = malloc(binary_length);
    if (binary == NULL) return fail(error, TAS_ERROR_MEMORY, "out of memory");
    code = api->GetProgramInfo(program, CL_PROGRAM_BINARIES, sizeof binary, &binary, NULL);
    char temporary[1100];
    snprintf(temporary, sizeof temporary, "%s.%ld.tmp", path, (long)getpid());
    FILE *file = code == CL_SUCCESS ? fopen(temporary, "wb") : NULL;
    uint64_t key_length = key->length, length = binary_length;
    int written = file != NULL && fwrite(MAGIC, 1, 8, file) == 8 && fwrite(&key_length, sizeof key_length, 1, file) == 1 &&
                  fwrite(key->data, 1, key->length, file) == key->length &&
                  fwrite(&length, sizeof length, 1, file) == 1 && fwrite(binary, 1, binary_length, file) == binary_length;
    if (file != NULL && fclose(file) != 0) written = 0;
    free(binary);
    if (code != CL_SUCCESS) return TAS_OK;
    if (!written || rename(temporary, path) != 0) {
        int saved = errno;
        unlink(temporary);
        return fail(error, TAS_ERROR_FILE, "cannot write the program cache file %s: %s; pass another cache folder",
                    path, strerror(saved));
    }
    return TAS_OK;
}

static tas_status build_failure(const opencl_api *api, cl_program program, const opencl_device *device,
                                const program_request *request, cl_int code, error_record *error) {
    char log[1200] = "";
    size_t log_length = 0;
    api->GetProgramBuildInfo(program, device->id, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, &log_length);
    log[sizeof log - 1] = '\0';
    char name[96];
    return fail(error, TAS_ERROR_OPENCL, "kernel %s does not build on %s: %s%s%s", request->kernel, device->info.name,
                opencl_error_name(code, name, sizeof name), *log ? ": " : "", log);
}

static cl_program from_binary(const opencl_api *api, cl_context context, const opencl_device *device,
                              const program_request *request, const unsigned char *binary, size_t length) {
    cl_int status = CL_SUCCESS, code = CL_SUCCESS;
    cl_program program = api->CreateProgramWithBinary(context, 1, &device->id, &length, &binary, &status, &code);
    if (program == NULL || code != CL_SUCCESS || status != CL_SUCCESS) {
        if (program != NULL) api->ReleaseProgram(program);
        return NULL;
    }
    if (api->BuildProgram(program, 1, &device->id, request->options, NULL, NULL) != CL_SUCCESS) {
        api->ReleaseProgram(program);
        return NULL;
    }
    return program;
}

tas_status program_build(const opencl_api *api, cl_context context, const opencl_device *device,
                         const program_request *request, const char *cache_dir, cl_program *program,
                         program_origin *origin, error_record *error) {
    *program = NULL;
    byte_text key = {NULL, 0};
    char path[1024] = "";
    if (cache_dir != NULL) {
        if (!cache_key(device, request, &key)) return fail(error, TAS_ERROR_MEMORY, "out of memory");
        cache_path(cache_dir, &key, path, sizeof path);
        size_t length = 0;
        unsigned char *binary = read_cached(path, &key, &length);
        if (binary != NULL) {
            *program = from_binary(api, context, device, request, binary, length);
            free(binary);
            if (*program != NULL) {
                free(key.data);
                *origin = PROGRAM_FROM_CACHE;
                return TAS_OK;
            }
        }
    }
    cl_int code = CL_SUCCESS;
    const char *source = request->source;
    size_t source_length = strlen(source);
    *program = api->CreateProgramWithSource(context, 1, &source, &source_length, &code);
    tas_status status = TAS_OK;
    if (*program == NULL || code != CL_SUCCESS) {
        char name[96];
        status = fail(error, TAS_ERROR_OPENCL, "creating the program of kernel %s failed: %s", request->kernel,
                      opencl_error_name(code, name, sizeof name));
    } else if ((code = api->BuildProgram(*program, 1, &device->id, request->options, NULL, NULL)) != CL_SUCCESS) {
        status = build_failure(api, *program, device, request, code, error);
    } else if (cache_dir != NULL) {
        status = store(api, *program, path, &key, error);
    }
    free(key.data);
    if (status != TAS_OK && *program != NULL) {
        api->ReleaseProgram(*program);
        *program = NULL;
    }
    *origin = PROGRAM_BUILT;
    return status;
}
