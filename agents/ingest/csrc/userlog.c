/* The per-person changelog of the compact table, written in one pass (issue #34): per person
 * changed, its record (agents.ingest.user_records: the state in a few varints and a keyed
 * BLAKE2b tag binding the checkpoint context and the person) and the change of the table's
 * digest (agents.ingest.user_digest: a sum mod 2^256 of keyed BLAKE2b terms). The Python
 * modules are authoritative; tests/unit/agents/ingest/test_user_changelog_c.py compares the two
 * byte for byte. Doing this per record in Python (JSON, HMAC, two digest terms) was most of a
 * user-level worker's CPU. */
#include "userlog.h"

#include "blake2b.h"

#include <stdlib.h>

/* a record's value: 1 format byte, last tick, number of periods, 2 x (period, count, 0) */
#define UL_MAX_VALUE (1 + 5 + 1 + 2 * (5 + 3 + 1))
#define UL_TAG 32
#define UL_FORMAT 2

/* hashlib.blake2b(person=b"stream-dp/uterm"): zero-padded to 16 bytes (user_digest._TERM) */
static const uint8_t TERM_PERSON[16] = "stream-dp/uterm";

static inline uint64_t ul_load64(const uint8_t *p) {
    uint64_t w = 0;
    for (int j = 7; j >= 0; j--) w = (w << 8) | p[j];
    return w;
}

static inline uint8_t *ul_varint(uint8_t *p, uint32_t n) {
    while (n > 0x7F) {
        *p++ = (uint8_t)((n & 0x7F) | 0x80);
        n >>= 7;
    }
    *p++ = (uint8_t)n;
    return p;
}

/* encode_state(person(s)) of agents.ingest.user_records: the periods as ut_state lists them */
static size_t ul_encode(const UTSlot *s, uint8_t *out) {
    uint8_t *p = out;
    int n = 0;
    while (n < 2 && s->count[n]) n++;
    *p++ = UL_FORMAT;
    p = ul_varint(p, UT_TICK(s));
    *p++ = (uint8_t)n;
    for (int i = 0; i < n; i++) {
        p = ul_varint(p, s->period[i]);
        p = ul_varint(p, s->count[i]);
        *p++ = 0;  /* no per-leaf entries: the compact table has no leaf bound */
    }
    return (size_t)(p - out);
}

/* acc += sign * F_k(h, value) (mod 2^256), F_k = BLAKE2b-256 read little endian */
static void ul_term(const sdp_blake2b_key *k, const unsigned char h[16], const uint8_t *value,
                    size_t len, int sign, uint64_t acc[4]) {
    uint8_t msg[16 + UL_MAX_VALUE], d[32];
    memcpy(msg, h, 16);
    memcpy(msg + 16, value, len);
    sdp_blake2b(k, msg, 16 + len, d);
    unsigned __int128 carry = 0;
    if (sign > 0) {
        for (int i = 0; i < 4; i++) {
            uint64_t w = ul_load64(d + 8 * i);
            carry += (unsigned __int128)acc[i] + w;
            acc[i] = (uint64_t)carry;
            carry >>= 64;
        }
    } else {
        uint64_t borrow = 0;
        for (int i = 0; i < 4; i++) {
            uint64_t w = ul_load64(d + 8 * i);
            uint64_t a = acc[i], r = a - w - borrow;
            borrow = (a < w) || (a - w < borrow);
            acc[i] = r;
        }
    }
}

static int ul_key(sdp_blake2b_key *k, const Py_buffer *key, const uint8_t *person,
                  const char *what) {
    if (key->len < 1 || key->len > 64 ||
        sdp_blake2b_init_key_person(k, 32, key->buf, (size_t)key->len, person) < 0) {
        PyErr_Format(PyExc_ValueError, "%s: 1 to 64 bytes", what);
        return -1;
    }
    return 0;
}

static PyObject *ul_sum_bytes(const uint64_t acc[4]) {
    uint8_t out[32];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 8; j++) out[8 * i + j] = (uint8_t)(acc[i] >> (8 * j));
    return PyBytes_FromStringAndSize((const char *)out, 32);
}

typedef struct {
    unsigned char h[16];
    Py_ssize_t was;  /* index into dirty_was, or -1 (listed by the caller only) */
} ULEntry;

static int ul_cmp(const void *a, const void *b) {
    return memcmp(((const ULEntry *)a)->h, ((const ULEntry *)b)->h, 16);
}

/* `e` (n entries) in hash order (memcmp's): a counting sort on the first two bytes (the hashes
 * are uniform: ~n / 65536 entries a bucket), then each bucket sorted. qsort over 10^6 entries
 * was a third of the pass. 0, or -1 with MemoryError set. */
static int ul_sort(ULEntry *e, Py_ssize_t n) {
    if (n < 4096) {
        qsort(e, (size_t)n, sizeof(ULEntry), ul_cmp);
        return 0;
    }
    size_t *start = PyMem_RawCalloc(65537, sizeof(size_t));
    ULEntry *tmp = PyMem_RawMalloc((size_t)n * sizeof(ULEntry));
    if (start == NULL || tmp == NULL) {
        PyMem_RawFree(start);
        PyMem_RawFree(tmp);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) start[((size_t)e[i].h[0] << 8 | e[i].h[1]) + 1]++;
    for (size_t b = 1; b <= 65536; b++) start[b] += start[b - 1];
    for (Py_ssize_t i = 0; i < n; i++) tmp[start[(size_t)e[i].h[0] << 8 | e[i].h[1]]++] = e[i];
    /* start[b] is now the end of bucket b, the start of bucket b + 1 */
    size_t lo = 0;
    for (size_t b = 0; b < 65536; b++) {
        size_t hi = start[b];
        if (hi - lo > 1) qsort(tmp + lo, hi - lo, sizeof(ULEntry), ul_cmp);
        lo = hi;
    }
    memcpy(e, tmp, (size_t)n * sizeof(ULEntry));
    PyMem_RawFree(start);
    PyMem_RawFree(tmp);
    return 0;
}

PyObject *ul_changelog(UserTable *self, PyObject *args) {
    PyObject *extra;
    Py_buffer mac = {0}, ctx = {0}, dkey = {0};
    PyObject *mac_obj;
    if (!PyArg_ParseTuple(args, "OOy*y*", &extra, &mac_obj, &ctx, &dkey)) return NULL;
    PyObject *out = NULL, *seq = NULL;
    ULEntry *ents = NULL;
    sdp_blake2b_key mk, tk;
    int tagged = mac_obj != Py_None;
    if (tagged && PyObject_GetBuffer(mac_obj, &mac, PyBUF_SIMPLE) < 0) goto done;
    if (ctx.len != 32) {
        PyErr_SetString(PyExc_ValueError, "context_hash: 32 bytes");
        goto done;
    }
    if ((tagged && ul_key(&mk, &mac, NULL, "mac_key") < 0) ||
        ul_key(&tk, &dkey, TERM_PERSON, "digest_key") < 0)
        goto done;
    seq = PySequence_Fast(extra, "extra: a sequence of persons");
    if (seq == NULL) goto done;
    Py_ssize_t nx = PySequence_Fast_GET_SIZE(seq), n = (Py_ssize_t)self->ndirty + nx;
    ents = PyMem_RawMalloc((size_t)(n ? n : 1) * sizeof(ULEntry));
    if (ents == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (size_t i = 0; i < self->ndirty; i++) {
        memcpy(ents[i].h, self->dirty + 16 * i, 16);
        ents[i].was = (Py_ssize_t)i;
    }
    for (Py_ssize_t j = 0; j < nx; j++) {
        PyObject *o = PySequence_Fast_GET_ITEM(seq, j);
        if (!PyBytes_Check(o) || PyBytes_GET_SIZE(o) != 16) {
            PyErr_SetString(PyExc_TypeError, "a person is its 16-byte keyed hash (bytes)");
            goto done;
        }
        ULEntry *e = &ents[(Py_ssize_t)self->ndirty + j];
        memcpy(e->h, PyBytes_AS_STRING(o), 16);
        e->was = -1;
    }
    if (ul_sort(ents, n) < 0) goto done;
    Py_ssize_t m = 0;  /* each person once, keeping the state noted before its change */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (m && memcmp(ents[m - 1].h, ents[i].h, 16) == 0) {
            if (ents[m - 1].was < 0) ents[m - 1].was = ents[i].was;
            continue;
        }
        ents[m++] = ents[i];
    }
    out = PyList_New(m);
    if (out == NULL) goto done;
    uint64_t acc[4] = {0, 0, 0, 0};
    for (Py_ssize_t i = 0; i < m; i++) {
        const unsigned char *h = ents[i].h;
        if (i + 8 < m) ut_prefetch(self, ents[i + 8].h);  /* the slots are cache misses */
        uint8_t buf[32 + 16 + UL_MAX_VALUE + UL_TAG];
        PyObject *value;
        const UTSlot *s = ut_find(self, h);
        if (s == NULL) {
            value = Py_NewRef(Py_None);
        } else {
            UTSlot clean = *s;
            clean.last_tick &= ~UT_DIRTY;
            /* ctx ‖ person ‖ value: the tag's message, the value at offset 48 */
            uint8_t *v = buf + 48;
            size_t len = ul_encode(&clean, v);
            ul_term(&tk, h, v, len, +1, acc);
            if (tagged) {
                memcpy(buf, ctx.buf, 32);
                memcpy(buf + 32, h, 16);
                sdp_blake2b(&mk, buf, 48 + len, v + len);
                len += UL_TAG;
            }
            value = PyBytes_FromStringAndSize((const char *)v, (Py_ssize_t)len);
        }
        if (ents[i].was >= 0 && !ut_empty(&self->dirty_was[ents[i].was])) {
            UTSlot was = self->dirty_was[ents[i].was];
            uint8_t wbuf[UL_MAX_VALUE];
            was.last_tick &= ~UT_DIRTY;
            ul_term(&tk, h, wbuf, ul_encode(&was, wbuf), -1, acc);
        }
        PyObject *key = value == NULL ? NULL
                        : PyBytes_FromStringAndSize((const char *)h, 16);
        PyObject *pair = key == NULL ? NULL : PyTuple_Pack(2, key, value);
        Py_XDECREF(key);
        Py_XDECREF(value);
        if (pair == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, pair);
    }
    PyObject *delta = ul_sum_bytes(acc);
    if (delta == NULL) {
        Py_CLEAR(out);
        goto done;
    }
    ut_clear_dirty(self);  /* only once everything exists: an error leaves them to the next call */
    PyObject *ret = PyTuple_Pack(2, out, delta);
    Py_DECREF(delta);
    Py_DECREF(out);
    out = ret;
done:
    PyMem_RawFree(ents);
    Py_XDECREF(seq);
    if (tagged && mac.obj != NULL) PyBuffer_Release(&mac);
    PyBuffer_Release(&ctx);
    PyBuffer_Release(&dkey);
    return out;
}

PyObject *ul_digest_sum(UserTable *self, PyObject *arg) {
    Py_buffer dkey;
    if (PyObject_GetBuffer(arg, &dkey, PyBUF_SIMPLE) < 0) return NULL;
    sdp_blake2b_key tk;
    int bad = ul_key(&tk, &dkey, TERM_PERSON, "digest_key");
    PyBuffer_Release(&dkey);
    if (bad) return NULL;
    uint64_t acc[4] = {0, 0, 0, 0};
    for (size_t j = 0; j < self->cap; j++) {
        const UTSlot *s = &self->slots[j];
        if (ut_empty(s)) continue;
        UTSlot clean = *s;
        uint8_t buf[UL_MAX_VALUE];
        clean.last_tick &= ~UT_DIRTY;
        ul_term(&tk, s->h, buf, ul_encode(&clean, buf), +1, acc);
    }
    return ul_sum_bytes(acc);
}
