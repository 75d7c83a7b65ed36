/* Keyed BLAKE2b (RFC 7693), written after the reference implementation
 * (https://github.com/BLAKE2/BLAKE2, CC0 1.0 / OpenSSL / Apache 2.0): one-shot hashing of a
 * message under a key whose block is compressed once and reused for every message.
 *
 * Only what the ingest fast path needs: digest lengths 1..64 bytes, keys 1..64 bytes, an optional
 * personalisation, messages given in one piece. Output is bit-identical to
 * hashlib.blake2b(data, key=..., digest_size=n, person=...) (unit tests compare them). */
#ifndef STREAM_DP_BLAKE2B_H
#define STREAM_DP_BLAKE2B_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t h[8];     /* chaining value after the key block */
    uint64_t h0[8];    /* chaining value before it (an empty message under a key) */
    uint8_t block[128]; /* the key block (an empty message under a key: it is the last) */
    size_t outlen;     /* digest length, bytes */
    int keyed;         /* 1: the key block has been compressed (t starts at 128) */
} sdp_blake2b_key;

/* Prepare the state for digests of ``outlen`` bytes under ``key`` (``keylen`` 0..64).
 * Returns 0, or -1 for a length out of range. */
int sdp_blake2b_init_key(sdp_blake2b_key *k, size_t outlen, const uint8_t *key, size_t keylen);

/* The same with a 16-byte personalisation (hashlib.blake2b's ``person``, zero-padded to 16
 * bytes); ``person`` NULL: none. */
int sdp_blake2b_init_key_person(sdp_blake2b_key *k, size_t outlen, const uint8_t *key,
                                size_t keylen, const uint8_t *person);

/* The digest of ``data`` (``len`` bytes) under the prepared key, written to ``out``
 * (``k->outlen`` bytes). */
void sdp_blake2b(const sdp_blake2b_key *k, const uint8_t *data, size_t len, uint8_t *out);

/* The first two 64-bit words of the digest (little-endian reading of bytes 0..15): what the
 * ingest digest needs for ``int.from_bytes(digest16, "little")``. */
void sdp_blake2b_words(const sdp_blake2b_key *k, const uint8_t *data, size_t len,
                       uint64_t *w0, uint64_t *w1);

#endif
