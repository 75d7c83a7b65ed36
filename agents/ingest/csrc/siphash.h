/* SipHash-2-4 with a 128-bit output (Aumasson & Bernstein; the reference implementation's
 * 128-bit variant, CC0): the keyed hash of a person's identifier (agents/ingest/users.py). */
#ifndef SDP_SIPHASH_H
#define SDP_SIPHASH_H

#include <stddef.h>
#include <stdint.h>

/* out = SipHash-2-4-128(key, data[0..len)); key 16 bytes, out 16 bytes. */
void sdp_siphash128(const uint8_t key[16], const uint8_t *data, size_t len, uint8_t out[16]);

#endif
