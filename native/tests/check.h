/* The native tests' harness: each CHECK that fails prints where and what, and is counted; a
 * test's main ends with `return check_finish("name");`, nonzero when any check failed (ctest's
 * failure). Also what the tests need of the file system: a fresh folder, files written into it,
 * and stderr captured while a command-line helper prints its error. */
#ifndef TORCH_ADRENO_STEP_TEST_CHECK_H
#define TORCH_ADRENO_STEP_TEST_CHECK_H

#include <stddef.h>

#define CHECK(condition) check_true((condition) != 0, #condition, __FILE__, __LINE__)
#define CHECK_INT(actual, expected) \
    check_int((long long)(actual), (long long)(expected), #actual, __FILE__, __LINE__)
#define CHECK_TEXT(actual, expected) check_text((actual), (expected), #actual, __FILE__, __LINE__)
/* `text` holds `part` */
#define CHECK_HAS(text, part) check_has((text), (part), 1, #text, __FILE__, __LINE__)
#define CHECK_LACKS(text, part) check_has((text), (part), 0, #text, __FILE__, __LINE__)
#define CHECK_BYTES(actual, expected, size) check_bytes((actual), (expected), (size), #actual, __FILE__, __LINE__)

int check_true(int passed, const char *what, const char *file, int line);
int check_int(long long actual, long long expected, const char *what, const char *file, int line);
int check_text(const char *actual, const char *expected, const char *what, const char *file, int line);
int check_has(const char *text, const char *part, int wanted, const char *what, const char *file, int line);
int check_bytes(const void *actual, const void *expected, size_t size, const char *what, const char *file, int line);
/* Prints "<name>: N checks, M failed"; returns 0 when none failed. */
int check_finish(const char *name);

/* A new folder under $TMPDIR (else /tmp), removed with its files by remove_folder. */
const char *make_folder(void);
void remove_folder(const char *folder);
/* `folder`/`name` in `out` (room for 1024 bytes); returns out. */
const char *path_in(const char *folder, const char *name, char out[1024]);
/* Writes `size` bytes to `path`; 0 on failure (counted as a failed check). */
int write_file(const char *path, const void *data, size_t size);

/* Sends stderr to a file until capture_end, which returns what was printed (NUL-terminated, until
 * the next capture_begin). */
void capture_begin(void);
const char *capture_end(void);

#endif
