/* SHA-256 (FIPS 180-4): musl libc's public-domain implementation (sha256.c). */
#ifndef TAS_SHA256_H
#define TAS_SHA256_H

#include <stddef.h>
#include <stdint.h>

enum { TAS_SHA256_BYTES = 32 };

typedef struct tas_sha256 {
    uint64_t len;    /* processed message length */
    uint32_t h[8];   /* hash state */
    uint8_t buf[64]; /* message block buffer */
} tas_sha256;

void tas_sha256_init(tas_sha256 *s);
void tas_sha256_update(tas_sha256 *s, const void *m, size_t len);
void tas_sha256_final(tas_sha256 *s, uint8_t md[TAS_SHA256_BYTES]);

#endif
