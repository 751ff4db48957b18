#include "check.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int checks, failures;

int check_true(int passed, const char *what, const char *file, int line) {
    checks += 1;
    if (!passed) {
        failures += 1;
        fprintf(stderr, "%s:%d: FAILED: %s\n", file, line, what);
    }
    return passed;
}

int check_int(long long actual, long long expected, const char *what, const char *file, int line) {
    checks += 1;
    if (actual == expected) return 1;
    failures += 1;
    fprintf(stderr, "%s:%d: FAILED: %s is %lld, expected %lld\n", file, line, what, actual, expected);
    return 0;
}

int check_text(const char *actual, const char *expected, const char *what, const char *file, int line) {
    checks += 1;
    if (actual != NULL && strcmp(actual, expected) == 0) return 1;
    failures += 1;
    fprintf(stderr, "%s:%d: FAILED: %s is \"%s\", expected \"%s\"\n", file, line, what, actual ? actual : "(null)",
            expected);
    return 0;
}

int check_has(const char *text, const char *part, int wanted, const char *what, const char *file, int line) {
    checks += 1;
    if (text != NULL && (strstr(text, part) != NULL) == wanted) return 1;
    failures += 1;
    fprintf(stderr, "%s:%d: FAILED: %s %s \"%s\": it is \"%s\"\n", file, line, what, wanted ? "lacks" : "holds", part,
            text ? text : "(null)");
    return 0;
}

int check_bytes(const void *actual, const void *expected, size_t size, const char *what, const char *file, int line) {
    checks += 1;
    if (actual != NULL && memcmp(actual, expected, size) == 0) return 1;
    failures += 1;
    fprintf(stderr, "%s:%d: FAILED: the %zu bytes of %s differ from those expected\n", file, line, size, what);
    return 0;
}

int check_finish(const char *name) {
    printf("%s: %d checks, %d failed\n", name, checks, failures);
    return failures != 0 || checks == 0;
}

static char folder_path[1024];

const char *make_folder(void) {
    const char *base = getenv("TMPDIR");
    snprintf(folder_path, sizeof folder_path, "%s/tas-test-XXXXXX", base && *base ? base : "/tmp");
    if (mkdtemp(folder_path) == NULL) {
        check_true(0, "mkdtemp made a folder", __FILE__, __LINE__);
        exit(1);
    }
    return folder_path;
}

void remove_folder(const char *folder) {
    DIR *listing = opendir(folder);
    if (listing == NULL) return;
    struct dirent *entry;
    char path[1024];
    while ((entry = readdir(listing)) != NULL)
        if (strcmp(entry->d_name, ".") != 0 && strcmp(entry->d_name, "..") != 0)
            unlink(path_in(folder, entry->d_name, path));
    closedir(listing);
    rmdir(folder);
}

const char *path_in(const char *folder, const char *name, char out[1024]) {
    snprintf(out, 1024, "%s/%s", folder, name);
    return out;
}

int write_file(const char *path, const void *data, size_t size) {
    FILE *file = fopen(path, "wb");
    int written = file != NULL && fwrite(data, 1, size, file) == size;
    if (file != NULL && fclose(file) != 0) written = 0;
    return check_true(written, path, __FILE__, __LINE__);
}

static int saved_stderr = -1;
static char captured[8192];
static char capture_path[1100];

void capture_begin(void) {
    fflush(stderr);
    snprintf(capture_path, sizeof capture_path, "%s/captured-stderr", folder_path[0] ? folder_path : make_folder());
    int descriptor = open(capture_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (descriptor < 0) return;
    saved_stderr = dup(2);
    dup2(descriptor, 2);
    close(descriptor);
}

const char *capture_end(void) {
    captured[0] = '\0';
    if (saved_stderr < 0) return captured;
    fflush(stderr);
    dup2(saved_stderr, 2);
    close(saved_stderr);
    saved_stderr = -1;
    FILE *file = fopen(capture_path, "rb");
    if (file != NULL) {
        size_t read = fread(captured, 1, sizeof captured - 1, file);
        captured[read] = '\0';
        fclose(file);
    }
    return captured;
}
