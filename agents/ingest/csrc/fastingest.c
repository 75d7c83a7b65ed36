/* agents.ingest._fastingest: the compiled fast path of the ingest hot loop (agents.ingest).
 *
 * ``Scanner.scan`` walks a batch of records and handles, a record at a time, exactly the
 * records that the pure-Python fast path of ``IngestState.process_batch`` accepts without any
 * doubt: no headers, a JSON object ``{"key": str, "ts": number, "value": number}`` (any order,
 * ``value`` optional) in strict JSON, a declared key, in range and on time. For each of them it
 * adds the keyed BLAKE2b-128 record digest (agents.ingest.record_digest) to a running sum
 * modulo 2^128 and the event's integer units to its bucket. It stops *before* the first record
 * it is not sure about (anything else: headers, a closing point reached, a LogAppendTime stamp
 * that closes ticks, an unusual JSON shape or number, an escape in a string, an unknown key, a
 * late event, ...) and returns its index: the Python loop handles that record with the
 * authoritative code and calls ``scan`` again after it. So every record's fate is decided by
 * the same rules as the pure path, from its own record and the public closing points only; a
 * property test (tests/unit/agents/ingest/test_fastingest.py) checks that both give identical state.
 *
 * Arithmetic follows the Python expressions operation by operation in IEEE double precision
 * (compiled with -ffp-contract=off: no fused multiply-add), numbers are parsed by CPython's own
 * correctly rounded PyOS_string_to_double, integers only when they have at most 15 digits (exact
 * as doubles), so every comparison and every rounding is the one Python makes. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "blake2b.h"
#include "siphash.h"
#include "usertable.h"

typedef struct {
    PyObject_HEAD
    sdp_blake2b_key key;
    Py_ssize_t max_bytes;
    double max_value, cap, inv_unit, origin, tick_seconds, lateness, grace, skew, max_age;
    long long cap_u;
    int markers, whole;
    /* privacy_unit = user (Scanner.users): the identifier's field, Kafka's default
     * partitioner over `partitions` must give `partition`, the persons' hash key */
    int users;
    char ufield[256];
    Py_ssize_t ufield_len;
    uint32_t partitions, partition;
    uint8_t ukey[16];
} Scanner;

static PyObject *s_offset, *s_key, *s_value, *s_timestamp, *s_timestamp_type, *s_headers;

/* ------------------------------------------------------------------ strict JSON subset */

typedef struct {
    const char *key;  /* the key's UTF-8 bytes (no escapes), or NULL if absent */
    Py_ssize_t key_len;
    double ts, value;
    int has_ts, has_value;
    const char *user;  /* the identifier's bytes (a string without escapes), or NULL */
    Py_ssize_t user_len;
} Event;

static inline const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

/* A JSON number at ``*pp`` in strict JSON grammar; 0 on success (``*out``, ``*pp`` advanced),
 * -1 for anything this parser does not take (the caller falls back to the pure path). */
static int parse_number(const char **pp, const char *end, double *out) {
    const char *p = *pp, *start = p;
    int digits = 0, is_int = 1;
    if (p < end && *p == '-') p++;
    if (p >= end) return -1;
    if (*p == '0') {
        p++;
        digits = 1;
    } else if (*p >= '1' && *p <= '9') {
        while (p < end && *p >= '0' && *p <= '9') {
            p++;
            digits++;
        }
    } else {
        return -1;
    }
    if (p < end && *p == '.') {
        is_int = 0;
        p++;
        int frac = 0;
        while (p < end && *p >= '0' && *p <= '9') {
            p++;
            frac++;
        }
        if (!frac) return -1;
        digits += frac;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        is_int = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        int ed = 0, ev = 0;
        while (p < end && *p >= '0' && *p <= '9') {
            if (ed < 4) ev = 10 * ev + (*p - '0');
            p++;
            ed++;
        }
        if (!ed || ed > 3 || ev > 300) return -1; /* far from overflow and subnormals */
    }
    /* at most 17 significant digits: the value is the correctly rounded double, as every
     * correct parser gives it */
    if (digits > (is_int ? 15 : 17)) return -1;
    Py_ssize_t n = p - start;
    if (n > 40) return -1;
    char buf[48];
    memcpy(buf, start, (size_t)n);
    buf[n] = '\0';
    char *stop = NULL;
    double v;
    if (is_int) {
        /* <= 15 digits: exact as a double, and Python compares and converts it exactly */
        long long iv = strtoll(buf, &stop, 10);
        if (stop != buf + n) return -1;
        v = (double)iv;
    } else {
        v = PyOS_string_to_double(buf, &stop, NULL);
        if (v == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return -1;
        }
        if (stop != buf + n) return -1;
    }
    if (!isfinite(v)) return -1;
    *out = v;
    *pp = p;
    return 0;
}

/* A JSON string's content at ``*pp`` (just past its opening quote) without escapes or control
 * characters: 0 (``*s``, ``*n`` set, ``*pp`` past the closing quote), or -1. */
static int plain_string(const char **pp, const char *end, const char **s, Py_ssize_t *n) {
    const char *p = *pp, *start = p;
    while (p < end) {
        unsigned char c = (unsigned char)*p;
        if (c == '"') break;
        if (c == '\\' || c < 0x20) return -1;
        p++;
    }
    if (p >= end) return -1;
    *s = start;
    *n = p - start;
    *pp = p + 1;
    return 0;
}

static int utf8_valid(const unsigned char *p, Py_ssize_t n);

/* Skip the value of a member the pure path ignores (codec.decode_event reads key, ts and value
 * only), when it is sure that Python's json takes it: a string without escapes or control
 * characters in valid UTF-8, a number as parse_number takes it, true, false or null. -1 for
 * anything else (an object, an array, NaN, an odd number...: the pure path decides). */
static int skip_value(const char **pp, const char *end) {
    const char *p = *pp;
    if (p >= end) return -1;
    if (*p == '"') {
        const char *s;
        Py_ssize_t n;
        p++;
        if (plain_string(&p, end, &s, &n) < 0 || !utf8_valid((const unsigned char *)s, n))
            return -1;
    } else if (*p == '-' || (*p >= '0' && *p <= '9')) {
        double d;
        if (parse_number(&p, end, &d) < 0) return -1;
    } else if (end - p >= 4 && (memcmp(p, "true", 4) == 0 || memcmp(p, "null", 4) == 0)) {
        p += 4;
    } else if (end - p >= 5 && memcmp(p, "false", 5) == 0) {
        p += 5;
    } else {
        return -1;
    }
    *pp = p;
    return 0;
}

/* Parse ``{"key": str, "ts": number, "value": number}`` (each member at most once, any order)
 * — plus, when ``ufield`` is given (privacy_unit = user), that member as a string without
 * escapes, required —, skipping other members with plain values (skip_value; their names
 * without escapes or control characters, in valid UTF-8). 0 on success, -1 on anything else. */
static int parse_event(const char *p, const char *end, Event *ev, const char *ufield,
                       Py_ssize_t ufield_len) {
    ev->key = NULL;
    ev->key_len = 0;
    ev->user = NULL;
    ev->user_len = 0;
    ev->has_ts = ev->has_value = 0;
    p = skip_ws(p, end);
    if (p >= end || *p != '{') return -1;
    p = skip_ws(p + 1, end);
    if (p < end && *p == '}') return -1; /* no ts: not this parser's business */
    for (;;) {
        if (p >= end || *p != '"') return -1;
        p++;
        const char *name = p;
        while (p < end && *p != '"' && *p != '\\') p++;
        if (p >= end || *p != '"') return -1;
        Py_ssize_t name_len = p - name;
        p = skip_ws(p + 1, end);
        if (p >= end || *p != ':') return -1;
        p = skip_ws(p + 1, end);
        if (name_len == 3 && memcmp(name, "key", 3) == 0) {
            if (ev->key != NULL || p >= end || *p != '"') return -1;
            p++;
            const char *s = p;
            while (p < end) {
                unsigned char c = (unsigned char)*p;
                if (c == '"') break;
                if (c == '\\' || c < 0x20) return -1;
                p++;
            }
            if (p >= end) return -1;
            ev->key = s;
            ev->key_len = p - s;
            p++;
        } else if (name_len == 2 && memcmp(name, "ts", 2) == 0) {
            if (ev->has_ts || parse_number(&p, end, &ev->ts) < 0) return -1;
            ev->has_ts = 1;
        } else if (name_len == 5 && memcmp(name, "value", 5) == 0) {
            if (ev->has_value || parse_number(&p, end, &ev->value) < 0) return -1;
            ev->has_value = 1;
        } else if (ufield != NULL && name_len == ufield_len &&
                   memcmp(name, ufield, (size_t)name_len) == 0) {
            /* a string (null, a number, ... : the pure path says invalid_user) */
            if (ev->user != NULL || p >= end || *p != '"') return -1;
            p++;
            if (plain_string(&p, end, &ev->user, &ev->user_len) < 0) return -1;
        } else {
            /* another member: its name as Python's json would take it (no control character,
             * valid UTF-8; escapes stopped the name loop above), its value plain */
            for (Py_ssize_t j = 0; j < name_len; j++)
                if ((unsigned char)name[j] < 0x20) return -1;
            if (!utf8_valid((const unsigned char *)name, name_len) || skip_value(&p, end) < 0)
                return -1;
        }
        p = skip_ws(p, end);
        if (p >= end) return -1;
        if (*p == ',') {
            p = skip_ws(p + 1, end);
            continue;
        }
        if (*p != '}') return -1;
        p = skip_ws(p + 1, end);
        if (p != end) return -1;
        break;
    }
    if (ev->key == NULL || !ev->has_ts || (ufield != NULL && ev->user == NULL)) return -1;
    return 0;
}

/* Whether ``n`` bytes are valid UTF-8 as Python's strict decoder takes it (no overlong forms,
 * no surrogates, nothing past U+10FFFF). */
static int utf8_valid(const unsigned char *p, Py_ssize_t n) {
    const unsigned char *end = p + n;
    while (p < end) {
        unsigned char c = *p;
        if (c < 0x80) {
            p++;
            continue;
        }
        int len;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c == 0xE0) { len = 3; lo = 0xA0; }
        else if (c >= 0xE1 && c <= 0xEC) len = 3;
        else if (c == 0xED) { len = 3; hi = 0x9F; }  /* no surrogates */
        else if (c >= 0xEE && c <= 0xEF) len = 3;
        else if (c == 0xF0) { len = 4; lo = 0x90; }
        else if (c >= 0xF1 && c <= 0xF3) len = 4;
        else if (c == 0xF4) { len = 4; hi = 0x8F; }
        else return 0;
        if (end - p < len || p[1] < lo || p[1] > hi) return 0;
        for (int k = 2; k < len; k++)
            if (p[k] < 0x80 || p[k] > 0xBF) return 0;
        p += len;
    }
    return 1;
}

/* Kafka's murmur2 (agents/kafka/partitioner.py), unsigned 32 bits. */
static uint32_t kafka_murmur2(const unsigned char *data, Py_ssize_t length) {
    const uint32_t m = 0x5bd1e995u;
    uint32_t h = 0x9747b28cu ^ (uint32_t)length;
    Py_ssize_t whole = length - length % 4;
    for (Py_ssize_t i = 0; i < whole; i += 4) {
        uint32_t k = (uint32_t)data[i] | ((uint32_t)data[i + 1] << 8) |
                     ((uint32_t)data[i + 2] << 16) | ((uint32_t)data[i + 3] << 24);
        k *= m;
        k ^= k >> 24;
        k *= m;
        h = (h * m) ^ k;
    }
    switch (length % 4) {
    case 3: h ^= (uint32_t)data[whole + 2] << 16; /* fall through */
    case 2: h ^= (uint32_t)data[whole + 1] << 8;  /* fall through */
    case 1:
        h ^= (uint32_t)data[whole];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return h;
}

/* ------------------------------------------------------------------ helpers */

/* An attribute that must be an exact int fitting 64 bits; -1 (no exception) if it is not. */
static int get_int_attr(PyObject *r, PyObject *name, long long dflt, long long *out) {
    PyObject *o = PyObject_GetAttr(r, name);
    if (o == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -2;
        PyErr_Clear();
        *out = dflt;
        return 0;
    }
    if (!PyLong_CheckExact(o)) {
        Py_DECREF(o);
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    Py_DECREF(o);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return -1;
    }
    *out = v;
    return 0;
}

static char *put_ll(char *p, long long v) {
    char tmp[24];
    int n = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) *p++ = '-';
    while (n) *p++ = tmp[--n];
    return p;
}

/* ------------------------------------------------------------------ Scanner */

static int Scanner_init(Scanner *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"dkey", "max_bytes", "max_value", "cap", "inv_unit", "cap_u",
                             "origin", "tick_seconds", "lateness", "grace", "skew", "max_age",
                             "markers", "whole", NULL};
    Py_buffer dkey;
    Py_ssize_t max_bytes;
    long long cap_u;
    int markers, whole;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*nddd" "Ldddddd" "pp", kwlist, &dkey,
                                     &max_bytes, &self->max_value, &self->cap, &self->inv_unit,
                                     &cap_u, &self->origin, &self->tick_seconds, &self->lateness,
                                     &self->grace, &self->skew, &self->max_age, &markers,
                                     &whole))
        return -1;
    int bad = dkey.len < 1 || dkey.len > 64 ||
              sdp_blake2b_init_key(&self->key, 16, dkey.buf, (size_t)dkey.len) < 0;
    PyBuffer_Release(&dkey);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "dkey must be 1..64 bytes");
        return -1;
    }
    if (cap_u < 0 || cap_u >= (1LL << 53)) {
        PyErr_SetString(PyExc_ValueError, "cap_u must be in [0, 2^53)");
        return -1;
    }
    self->max_bytes = max_bytes;
    self->cap_u = cap_u;
    self->markers = markers;
    self->whole = whole;
    return 0;
}

/* Add ``u`` units to ``bucket[nodes]``. 0, or -1 with an exception set. ``*first``: an int
 * object of ``*first_u`` units, shared by the new entries that hold it (ints are immutable:
 * most events are a leaf's first in its tick, and all of value 1 have the same units). */
static int bucket_add(PyObject *bucket, PyObject *nodes, long long u, PyObject **first,
                      long long *first_u) {
    if (*first == NULL || *first_u != u) {
        PyObject *o = PyLong_FromLongLong(u);
        if (o == NULL) return -1;
        Py_XSETREF(*first, o);
        *first_u = u;
    }
    /* one hash lookup that inserts ``u`` when the key is new (the usual case at 10^6 leaves:
     * a leaf's first event in its tick), instead of a failed get and then a set */
    Py_ssize_t before = PyDict_GET_SIZE(bucket);
    PyObject *old = PyDict_SetDefault(bucket, nodes, *first); /* borrowed */
    if (old == NULL) return -1;
    /* inserted: the size grew (not ``old == *first``: an earlier event of the leaf may have
     * stored that very object) */
    if (PyDict_GET_SIZE(bucket) != before) return 0;
    PyObject *sum;
    {
        int overflow = 0;
        long long ov = PyLong_CheckExact(old) ? PyLong_AsLongLongAndOverflow(old, &overflow) : 0;
        if (PyLong_CheckExact(old) && !overflow && ov >= 0 && ov < (1LL << 62)) {
            sum = PyLong_FromLongLong(ov + u); /* u < 2^53: no overflow */
        } else {
            PyErr_Clear();
            PyObject *uo = PyLong_FromLongLong(u);
            if (uo == NULL) return -1;
            sum = PyNumber_Add(old, uo);
            Py_DECREF(uo);
        }
    }
    if (sum == NULL) return -1;
    int rc = PyDict_SetItem(bucket, nodes, sum);
    Py_DECREF(sum);
    return rc;
}

/* ------------------------------------------------------------------ the key index */

/* KeyIndex: the declared keys (a dict {str: bucket key}) as an open-addressing hash table over
 * their UTF-8 bytes, built once. Why: at 10^6 leaves the scanner's lookup in the dict made a
 * str per event (UTF-8 decode + SipHash) and then missed the cache three times in a ~100 MB
 * structure (index, entry, the key's str object to compare hashes); perf put ~50 % of the
 * scanner's time there (benchmarks/RESULTS.md, issue #25). Here a lookup hashes the record's
 * key bytes in place, prefetches its slot before the record digest is computed, and a slot
 * holds the tag, the entry and the bucket key object, so the entry (key bytes to compare) and
 * the bucket key (read by the bucket update) are fetched together.
 *
 * Exactness: the index holds the strict UTF-8 encoding of every exact str key (a key that has
 * none -- a lone surrogate -- is left out: no record's bytes decode to it, so the dict never
 * finds it for a record either; other keys are left out too, and a record with such a key goes
 * to the pure path, which decides as always). Strict UTF-8 decoding is injective, so a record's key bytes equal
 * an entry's bytes exactly when they decode to that str: a hit here is a hit in the dict, with
 * the same value; a miss is a miss (the pure path then decides, as after a dict miss).
 *
 * Staleness: the index remembers the dict, its size and its version tag (bumped by CPython on
 * every change); ``Scanner.scan`` uses it only while all three still match (``fresh``), and
 * looks keys up in the dict otherwise. Python 3.14 dropped the version tag: there the index
 * refuses to be built (NotImplementedError) and the dict lookup is used. */

/* SDP_NO_DICT_VERSION (a -D flag) builds the 3.14 behaviour on an older Python: the test of the
 * fallback (tests/unit/test_fastingest_build.py) has no 3.14 interpreter to run on. */
#if PY_VERSION_HEX < 0x030E0000 && !defined(SDP_NO_DICT_VERSION)
#define SDP_HAVE_DICT_VERSION 1
static uint64_t dict_version(PyObject *d) {
#if PY_VERSION_HEX >= 0x030C0000
    _Py_COMP_DIAG_PUSH
    _Py_COMP_DIAG_IGNORE_DEPR_DECLS
    uint64_t v = ((PyDictObject *)d)->ma_version_tag;
    _Py_COMP_DIAG_POP
    return v;
#else
    return ((PyDictObject *)d)->ma_version_tag;
#endif
}
#endif

#define KI_INLINE 16

/* Zeroed memory for the index's tables: at 10^6 keys they span ~56 MB, and every lookup lands
 * on a random 4 KiB page (a TLB miss on top of the cache miss); on Linux, with transparent
 * huge pages allowed on request ("madvise"), they are asked for in 2 MiB pages. */
#if defined(__linux__)
#include <sys/mman.h>
#endif

typedef struct {
    void *p;
    size_t size;
    int mapped;
} KMem;

static void *kmem_alloc(KMem *m, size_t size) {
    m->p = NULL;
    m->size = size;
    m->mapped = 0;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (size >= ((size_t)4 << 20)) {
        void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p != MAP_FAILED) {
            (void)madvise(p, size, MADV_HUGEPAGE); /* a hint: 4 KiB pages if refused */
            m->p = p;
            m->mapped = 1;
            return p;
        }
    }
#endif
    m->p = PyMem_Calloc(1, size);
    return m->p;
}

static void kmem_free(KMem *m) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (m->mapped) {
        munmap(m->p, m->size);
        m->p = NULL;
        return;
    }
#endif
    PyMem_Free(m->p);
    m->p = NULL;
}

typedef struct {
    uint32_t tag;      /* the hash's upper 32 bits */
    uint32_t entry;    /* entry index + 1; 0 = an empty slot */
    PyObject *value;   /* the bucket key (a reference owned by values) */
} KSlot;

typedef struct {
    uint32_t len;              /* key length in bytes */
    uint32_t off;              /* bytes past KI_INLINE: at arena + off */
    char head[KI_INLINE];      /* the first (up to) KI_INLINE bytes */
} KEntry;

typedef struct {
    PyObject_HEAD
    PyObject *dict;    /* the dict it was built from */
    PyObject *values;  /* a list holding every value (the slots borrow from it) */
    Py_ssize_t dict_len;
    uint64_t version;
    uint64_t mask;     /* slots - 1 (a power of two, load <= 1/2) */
    KSlot *slots;
    KEntry *entries;
    KMem slots_mem, entries_mem;
    char *arena;
    Py_ssize_t n;
} KeyIndex;

static PyTypeObject KeyIndexType;

/* CPython's keyed hash of a buffer, the one hash(bytes) gives. Public from 3.14
 * (Py_HashBuffer); before, _Py_HashBytes, exported by libpython in every version but declared
 * by a public header only up to 3.12 (3.13 moved it to the internal pycore_pyhash.h). Without a
 * prototype C assumes it returns int: on 3.13 the 64-bit hash came back cut to 32 bits and
 * sign-extended, so the slot tag (its upper half) stopped filtering. Declared here with its
 * exact signature; the build uses -Werror=implicit-function-declaration (setup.py) so a missing
 * declaration can never compile again, and tests/unit/test_key_index.py checks that the hash
 * equals hash(bytes) to all 64 bits. */
#if PY_VERSION_HEX >= 0x030E0000
#define SDP_HASH_BYTES(p, n) Py_HashBuffer((p), (n))
#else
#if PY_VERSION_HEX >= 0x030D0000
PyAPI_FUNC(Py_hash_t) _Py_HashBytes(const void *, Py_ssize_t);
#endif
#define SDP_HASH_BYTES(p, n) _Py_HashBytes((p), (n))
#endif

static inline uint64_t ki_hash(const char *p, Py_ssize_t n) {
    /* CPython's keyed SipHash of the bytes (PYTHONHASHSEED): the keys of records are chosen by
     * writers, and a keyed hash keeps them from aiming at one probe sequence */
    return (uint64_t)SDP_HASH_BYTES(p, n);
}

static inline int ki_equal(const KeyIndex *ix, const KEntry *e, const char *p, Py_ssize_t n) {
    if ((Py_ssize_t)e->len != n) return 0;
    Py_ssize_t head = n < KI_INLINE ? n : KI_INLINE;
    if (memcmp(e->head, p, (size_t)head) != 0) return 0;
    return n <= KI_INLINE || memcmp(ix->arena + e->off, p + KI_INLINE, (size_t)(n - KI_INLINE)) == 0;
}

static void KeyIndex_clear_mem(KeyIndex *self) {
    if (self->slots != NULL) kmem_free(&self->slots_mem);
    if (self->entries != NULL) kmem_free(&self->entries_mem);
    PyMem_Free(self->arena);
    self->slots = NULL;
    self->entries = NULL;
    self->arena = NULL;
    self->n = 0;
    Py_CLEAR(self->dict);
    Py_CLEAR(self->values);
}

static int KeyIndex_init(KeyIndex *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"declared", NULL};
    PyObject *d;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!", kwlist, &PyDict_Type, &d)) return -1;
#ifndef SDP_HAVE_DICT_VERSION
    PyErr_SetString(PyExc_NotImplementedError, "no dict version tag on this Python");
    return -1;
#else
    KeyIndex_clear_mem(self);
    Py_ssize_t n = PyDict_GET_SIZE(d);
    if (n >= (Py_ssize_t)1 << 30) {
        PyErr_SetString(PyExc_ValueError, "too many keys");
        return -1;
    }
    uint64_t size = 8;
    while (size < 2 * (uint64_t)n) size <<= 1;
    self->slots = kmem_alloc(&self->slots_mem, (size_t)size * sizeof(KSlot));
    self->entries = kmem_alloc(&self->entries_mem, (n ? (size_t)n : 1) * sizeof(KEntry));
    self->values = PyList_New(0);
    size_t arena_cap = 64, arena_len = 0;
    self->arena = PyMem_Malloc(arena_cap);
    if (!self->slots || !self->entries || !self->values || !self->arena) {
        KeyIndex_clear_mem(self);
        PyErr_NoMemory();
        return -1;
    }
    self->mask = size - 1;
    Py_ssize_t pos = 0, kept = 0;
    PyObject *k, *v;
    while (PyDict_Next(d, &pos, &k, &v)) {
        /* not an exact str: left to the dict (a subclass may hash or compare otherwise; a
         * record whose key the index lacks goes to the authoritative pure path) */
        if (!PyUnicode_CheckExact(k)) continue;
        Py_ssize_t len;
        const char *b = PyUnicode_AsUTF8AndSize(k, &len);
        if (b == NULL) { /* a lone surrogate: no strict UTF-8 bytes decode to it */
            PyErr_Clear();
            continue;
        }
        if (len > UINT32_MAX / 2) continue;
        uint64_t h = ki_hash(b, len);
        uint64_t i = h & self->mask;
        int dup = 0;
        while (self->slots[i].entry) {
            /* two str keys with equal UTF-8 bytes are equal strs: a dict holds one of them */
            if (ki_equal(self, &self->entries[self->slots[i].entry - 1], b, len)) dup = 1;
            i = (i + 1) & self->mask;
        }
        if (dup) continue;
        KEntry *e = &self->entries[kept];
        e->len = (uint32_t)len;
        memcpy(e->head, b, (size_t)(len < KI_INLINE ? len : KI_INLINE));
        if (len > KI_INLINE) {
            size_t extra = (size_t)(len - KI_INLINE);
            if (arena_len + extra > UINT32_MAX) continue;
            if (arena_len + extra > arena_cap) {
                while (arena_len + extra > arena_cap) arena_cap *= 2;
                char *na = PyMem_Realloc(self->arena, arena_cap);
                if (na == NULL) {
                    KeyIndex_clear_mem(self);
                    PyErr_NoMemory();
                    return -1;
                }
                self->arena = na;
            }
            memcpy(self->arena + arena_len, b + KI_INLINE, extra);
            e->off = (uint32_t)arena_len;
            arena_len += extra;
        }
        if (PyList_Append(self->values, v) < 0) {
            KeyIndex_clear_mem(self);
            return -1;
        }
        self->slots[i].tag = (uint32_t)(h >> 32);
        self->slots[i].entry = (uint32_t)(kept + 1);
        self->slots[i].value = v; /* values keeps it alive */
        kept++;
    }
    self->n = kept;
    Py_INCREF(d);
    self->dict = d;
    self->dict_len = n;
    self->version = dict_version(d);
    return 0;
#endif
}

/* The index answers for ``d`` exactly as ``d`` would (built from it, unchanged since). */
static int KeyIndex_is_fresh(const KeyIndex *ix, PyObject *d) {
#ifdef SDP_HAVE_DICT_VERSION
    return ix->slots != NULL && ix->dict == d && PyDict_GET_SIZE(d) == ix->dict_len &&
           dict_version(d) == ix->version;
#else
    (void)ix;
    (void)d;
    return 0;
#endif
}

static PyObject *KeyIndex_fresh(KeyIndex *self, PyObject *d) {
    return PyBool_FromLong(PyDict_Check(d) && KeyIndex_is_fresh(self, d));
}

/* The bucket key of ``p[0:n]`` (borrowed), or NULL (not declared; no exception). */
static inline PyObject *KeyIndex_find(const KeyIndex *ix, uint64_t h, const char *p,
                                      Py_ssize_t n) {
    uint32_t tag = (uint32_t)(h >> 32);
    for (uint64_t i = h & ix->mask;; i = (i + 1) & ix->mask) {
        const KSlot *s = &ix->slots[i];
        if (!s->entry) return NULL;
        if (s->tag == tag) {
            __builtin_prefetch(s->value); /* the bucket update reads it: fetch it meanwhile */
            if (ki_equal(ix, &ix->entries[s->entry - 1], p, n)) return s->value;
        }
    }
}

static PyObject *KeyIndex_get(KeyIndex *self, PyObject *arg) {
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "bytes expected");
        return NULL;
    }
    if (self->slots == NULL) Py_RETURN_NONE;
    const char *p = PyBytes_AS_STRING(arg);
    Py_ssize_t n = PyBytes_GET_SIZE(arg);
    PyObject *v = KeyIndex_find(self, ki_hash(p, n), p, n);
    if (v == NULL) Py_RETURN_NONE;
    Py_INCREF(v);
    return v;
}

static Py_ssize_t KeyIndex_len(KeyIndex *self) { return self->n; }

static void KeyIndex_dealloc(KeyIndex *self) {
    KeyIndex_clear_mem(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef KeyIndex_methods[] = {
    {"fresh", (PyCFunction)KeyIndex_fresh, METH_O,
     "fresh(d) -> bool: built from the dict d, and d unchanged since (size and version)."},
    {"get", (PyCFunction)KeyIndex_get, METH_O,
     "get(key_bytes) -> the value of the str key whose strict UTF-8 bytes these are, or None."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods KeyIndex_as_sequence = {
    .sq_length = (lenfunc)KeyIndex_len,
};

PyDoc_STRVAR(KeyIndex_doc,
"KeyIndex(declared)\n\n"
"The str keys of the dict ``declared`` by their UTF-8 bytes (an open-addressing table built\n"
"once): ``Scanner.scan`` looks record keys up here without making a str, while the dict is\n"
"unchanged (``fresh``). NotImplementedError where CPython has no dict version tag (3.14+).");

static PyTypeObject KeyIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "agents.ingest._fastingest.KeyIndex",
    .tp_basicsize = sizeof(KeyIndex),
    .tp_dealloc = (destructor)KeyIndex_dealloc,
    .tp_as_sequence = &KeyIndex_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = KeyIndex_doc,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)KeyIndex_init,
    .tp_methods = KeyIndex_methods,
};

/* ------------------------------------------------------------------ record blocks */

/* One record of a Kafka record batch (message format v2), located in the batch's bytes. */
typedef struct {
    long long offset, timestamp;
    Py_ssize_t key_pos, key_len;     /* key_len -1: null key */
    Py_ssize_t value_pos, value_len; /* value_len -1: null value */
    Py_ssize_t hdr_pos, hdr_count;
} RecInfo;

typedef struct {
    PyObject_HEAD
    PyObject *buf; /* the fetched bytes (a reference: records point into it) */
    Py_ssize_t n;
    int timestamp_type;
    RecInfo *recs;
} RecordBlock;

static PyTypeObject RecordBlockType;
static PyObject *record_factory = NULL; /* agents.ingest.Record */

/* ------------------------------------------------------------------ the scan */

typedef struct {
    Scanner *self;
    long long next_tick, stop_offset;
    double horizon_ts;
    int lat_active;
    PyObject *buckets, *declared;
    unsigned __int128 acc;
    long long accepted, clamped;
    long long cur_tick;
    PyObject *cur_bucket; /* the last tick's bucket (borrowed: buckets holds it) */
    char *heap;
    Py_ssize_t heap_size;
    const KeyIndex *index; /* the declared keys' index while fresh, else NULL (the dict) */
    long long sum_u;       /* the units of sum_obj (the sum of a leaf's first event) */
    PyObject *sum_obj;
    UserTable *table;   /* privacy_unit = user: the partition's per-person table (it lists
                         * the persons it counts itself, for the changelog) */
    long long bounded;  /* events over their person's bounds (dropped) */
} ScanCtx;

/* One record without headers: 1 = accepted on the fast path (digest and bucket updated),
 * 0 = the pure path decides it (nothing changed), -1 = error (exception set). ``kptr`` NULL:
 * a null key; ``vptr`` NULL: a null value. */
/* A record parsed ahead of its turn (record blocks with a fresh index): its event as
 * parse_event read it from the same bytes, and its key's hash. */
typedef struct {
    Event ev;
    uint64_t kh;
    int ok; /* 0: not parsed ahead (scan_one parses it, or leaves it to the pure path) */
    int has_person; /* user level: ``person`` is the keyed hash of ev.user */
    unsigned char person[16];
} Ahead;

/* Parse record ``j`` of ``blk`` ahead (no side effect on any state: only parsing and
 * prefetching) and start fetching its key's slot. */
static void look_ahead(const ScanCtx *c, const RecordBlock *blk, Py_ssize_t j, Ahead *a) {
    a->ok = 0;
    if (j >= blk->n) return;
    const RecInfo *ri = &blk->recs[j];
    if (ri->value_len < 0 || ri->value_len > c->self->max_bytes) return;
    const char *v = PyBytes_AS_STRING(blk->buf) + ri->value_pos;
    if (parse_event(v, v + ri->value_len, &a->ev, c->self->users ? c->self->ufield : NULL,
                    c->self->ufield_len) < 0)
        return;
    a->kh = ki_hash(a->ev.key, a->ev.key_len);
    __builtin_prefetch(&c->index->slots[a->kh & c->index->mask]);
    a->ok = 1;
    a->has_person = 0;
    if (c->table != NULL && a->ev.user_len >= 1 && a->ev.user_len <= 256) {
        /* the person's slot is a cache miss at 10^6 people: fetched two records ahead */
        sdp_siphash128(c->self->ukey, (const uint8_t *)a->ev.user, (size_t)a->ev.user_len,
                       a->person);
        ut_prefetch(c->table, a->person);
        a->has_person = 1;
    }
}

/* One record later (its slot has arrived): start fetching the entry it names (the key bytes
 * to compare) and the bucket key object, so that neither is a cache miss at its turn. */
static void resolve_ahead(const KeyIndex *ix, const Ahead *a) {
    if (!a->ok) return;
    /* the first slot with the key's tag (about 3 in 4 keys sit in their home slot at load
     * <= 1/2; the others a slot or two on, mostly on the same cache line) */
    uint32_t tag = (uint32_t)(a->kh >> 32);
    uint64_t i = a->kh & ix->mask;
    for (int k = 0; k < 4; k++, i = (i + 1) & ix->mask) {
        const KSlot *s = &ix->slots[i];
        if (!s->entry) return; /* not declared */
        if (s->tag == tag) {
            const KEntry *e = &ix->entries[s->entry - 1];
            __builtin_prefetch(e);
            __builtin_prefetch((const char *)e + sizeof(KEntry) - 1); /* it may span 2 lines */
            __builtin_prefetch(s->value);
            return;
        }
    }
}

/* ``pre``: the record's value parsed ahead (or NULL). */
static int scan_one(ScanCtx *c, long long offset, long long rts_ms, long long rtype,
                    const char *kptr, Py_ssize_t klen, const char *vptr, Py_ssize_t vlen,
                    const Ahead *pre) {
    Scanner *self = c->self;
    const double origin = self->origin, tick_seconds = self->tick_seconds;
    if (offset >= c->stop_offset) return 0;
    if (!self->markers && rts_ms < 0) return 0;
    /* |rts_ms| <= 2^53: its double is exact, as Python's int -> float is */
    if (rts_ms > (1LL << 53) || rts_ms < -(1LL << 53)) return 0;
    const double arrival = (double)rts_ms / 1000.0;
    if (c->lat_active && rtype == 1 && rts_ms >= 0) {
        double through = floor((arrival - self->grace - self->lateness - origin) / tick_seconds);
        if (!(through < (double)c->next_tick)) return 0; /* it may close ticks: pure path */
    }
    if (vptr == NULL || vlen > self->max_bytes) return 0;
    Event ev;
    if (pre != NULL && pre->ok)
        ev = pre->ev; /* parse_event of these very bytes */
    else if (parse_event(vptr, vptr + vlen, &ev, self->users ? self->ufield : NULL,
                         self->ufield_len) < 0)
        return 0;
    if (self->users) {
        /* an identifier the pure path would refuse (invalid_user, wrong_partition, or a
         * record that is not UTF-8): it decides, with its reasons */
        if (ev.user_len < 1 || ev.user_len > 256 ||
            !utf8_valid((const unsigned char *)ev.user, ev.user_len) ||
            (kafka_murmur2((const unsigned char *)ev.user, ev.user_len) & 0x7fffffffu) %
                    self->partitions != self->partition)
            return 0;
    }
    const double rts = ev.ts, rv = ev.has_value ? ev.value : 1.0;
    if (!(origin <= rts && 0.0 <= rv && rv <= self->max_value &&
          rts <= c->horizon_ts &&
          (self->markers || (rts <= arrival + self->skew && arrival - rts <= self->max_age)) &&
          (!self->whole || floor(rv) == rv)))
        return 0;
    double t = floor((rts - origin) / tick_seconds);
    if (!(t > -9.0e15 && t < 9.0e15)) return 0;
    long long tick = (long long)t + 1;
    if (!(tick >= c->next_tick &&
          (self->markers ||
           (double)tick > floor((arrival - self->lateness - origin) / tick_seconds))))
        return 0;
    PyObject *nodes = NULL;
    uint64_t kh = 0;
    if (c->index != NULL) {
        /* its slot is fetched while the digest below is computed */
        kh = pre != NULL && pre->ok ? pre->kh : ki_hash(ev.key, ev.key_len);
        __builtin_prefetch(&c->index->slots[kh & c->index->mask]);
    } else {
        PyObject *ks = PyUnicode_DecodeUTF8(ev.key, ev.key_len, NULL);
        if (ks == NULL) {
            PyErr_Clear();
            return 0;
        }
        nodes = PyDict_GetItemWithError(c->declared, ks); /* borrowed */
        Py_DECREF(ks);
        if (nodes == NULL) {
            PyErr_Clear();
            return 0;
        }
        Py_INCREF(nodes);
    }
    /* the record digest: b"<offset>|<ts>|<type>|" key part, value part, b"0|" (no headers) */
    Py_ssize_t need = 5 * 24 + (klen > 0 ? klen : 0) + vlen + 8;
    char stackbuf[512];
    char *buf = stackbuf;
    if (need > (Py_ssize_t)sizeof stackbuf) {
        if (need > c->heap_size) {
            char *nb = PyMem_Realloc(c->heap, (size_t)need);
            if (nb == NULL) {
                Py_XDECREF(nodes);
                PyErr_NoMemory();
                return -1;
            }
            c->heap = nb;
            c->heap_size = need;
        }
        buf = c->heap;
    }
    char *p = buf;
    p = put_ll(p, offset);
    *p++ = '|';
    p = put_ll(p, self->markers ? -1 : rts_ms);
    *p++ = '|';
    p = put_ll(p, rtype);
    *p++ = '|';
    if (kptr == NULL) {
        *p++ = '-';
        *p++ = '|';
    } else {
        p = put_ll(p, klen);
        *p++ = '|';
        memcpy(p, kptr, (size_t)klen);
        p += klen;
    }
    p = put_ll(p, vlen);
    *p++ = '|';
    memcpy(p, vptr, (size_t)vlen);
    p += vlen;
    *p++ = '0';
    *p++ = '|';
    uint64_t w0, w1;
    sdp_blake2b_words(&self->key, (const uint8_t *)buf, (size_t)(p - buf), &w0, &w1);
    if (nodes == NULL) {
        /* the index (computing the digest first cost nothing: the slot was on its way; a
         * record whose key is not declared wastes it, and the pure path decides it) */
        nodes = KeyIndex_find(c->index, kh, ev.key, ev.key_len); /* borrowed */
        if (nodes == NULL) return 0;
        Py_INCREF(nodes);
    }
    if (self->users) {
        /* the last decision, after every event-level one (as on the pure path): the
         * person's bound. Nothing above changed any state; the admit does, so every way
         * back to the pure path is taken before it (the bucket's type included). */
        if (c->cur_bucket == NULL || tick != c->cur_tick) {
            PyObject *tobj = PyLong_FromLongLong(tick);
            if (tobj == NULL) {
                Py_DECREF(nodes);
                return -1;
            }
            PyObject *b = PyDict_GetItemWithError(c->buckets, tobj);
            Py_DECREF(tobj);
            if ((b == NULL && PyErr_Occurred()) || (b != NULL && !PyDict_CheckExact(b))) {
                Py_DECREF(nodes);
                if (PyErr_Occurred()) return -1;
                return 0;
            }
        }
        unsigned char person_buf[16];
        const unsigned char *person = person_buf;
        if (pre != NULL && pre->ok && pre->has_person)
            person = pre->person; /* the same bytes' hash, computed ahead */
        else
            sdp_siphash128(self->ukey, (const uint8_t *)ev.user, (size_t)ev.user_len, person_buf);
        int got = ut_admit(c->table, person, tick);
        if (got < 0) {
            Py_DECREF(nodes);
            return got == -2 ? -1 : 0; /* -1: a state the table cannot hold (pure path) */
        }
        if (got == 0) { /* dropped: digested, never bucketed nor dead-lettered */
            Py_DECREF(nodes);
            c->acc += ((unsigned __int128)w1 << 64) | w0;
            c->bounded++;
            return 1;
        }
    }
    /* the units: min(round(rv * inv_unit), cap_u), round half to even */
    int clamped = rv > self->cap;
    double x = rv * self->inv_unit;
    long long u;
    if (x >= (double)self->cap_u) {
        u = self->cap_u; /* round(x) >= cap_u (cap_u is an integer) */
    } else {
        u = (long long)nearbyint(x); /* the default rounding mode: half to even */
        if (u > self->cap_u) u = self->cap_u;
    }
    /* the bucket of the tick */
    if (c->cur_bucket == NULL || tick != c->cur_tick) {
        PyObject *tobj = PyLong_FromLongLong(tick);
        if (tobj == NULL) {
            Py_DECREF(nodes);
            return -1;
        }
        PyObject *b = PyDict_GetItemWithError(c->buckets, tobj);
        if (b == NULL) {
            if (PyErr_Occurred()) {
                Py_DECREF(tobj);
                Py_DECREF(nodes);
                return -1;
            }
            b = PyDict_New();
            if (b == NULL || PyDict_SetItem(c->buckets, tobj, b) < 0) {
                Py_XDECREF(b);
                Py_DECREF(tobj);
                Py_DECREF(nodes);
                return -1;
            }
            Py_DECREF(b); /* buckets holds it */
        }
        Py_DECREF(tobj);
        if (!PyDict_CheckExact(b)) {
            Py_DECREF(nodes);
            return 0;
        }
        c->cur_bucket = b;
        c->cur_tick = tick;
    }
    if (bucket_add(c->cur_bucket, nodes, u, &c->sum_obj, &c->sum_u) < 0) {
        Py_DECREF(nodes);
        return -1;
    }
    Py_DECREF(nodes);
    c->acc += ((unsigned __int128)w1 << 64) | w0;
    c->accepted++;
    c->clamped += clamped;
    return 1;
}

/* A record object (aiokafka's, or agents.ingest.Record): 1/0/-1 as scan_one. */
static int scan_object(ScanCtx *c, PyObject *r) {
    long long offset, rts_ms, rtype;
    int rc = get_int_attr(r, s_offset, 0, &offset);
    if (rc < 0) return rc == -2 ? -1 : 0;
    if (offset >= c->stop_offset) return 0;
    /* headers: any header (a marker, or bytes that change the digest) -> pure path */
    PyObject *h = PyObject_GetAttr(r, s_headers);
    if (h == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
        PyErr_Clear();
    } else {
        int truth = PyObject_IsTrue(h);
        Py_DECREF(h);
        if (truth < 0) {
            PyErr_Clear();
            return 0;
        }
        if (truth) return 0;
    }
    rc = get_int_attr(r, s_timestamp, -1, &rts_ms);
    if (rc < 0) return rc == -2 ? -1 : 0;
    rc = get_int_attr(r, s_timestamp_type, 0, &rtype);
    if (rc < 0) return rc == -2 ? -1 : 0;
    PyObject *kobj = PyObject_GetAttr(r, s_key);
    if (kobj == NULL) {
        PyErr_Clear();
        return 0;
    }
    PyObject *vobj = PyObject_GetAttr(r, s_value);
    if (vobj == NULL) {
        Py_DECREF(kobj);
        PyErr_Clear();
        return 0;
    }
    if (!((kobj == Py_None || PyBytes_CheckExact(kobj)) && PyBytes_CheckExact(vobj))) {
        Py_DECREF(kobj);
        Py_DECREF(vobj);
        return 0;
    }
    rc = scan_one(c, offset, rts_ms, rtype,
                  kobj == Py_None ? NULL : PyBytes_AS_STRING(kobj),
                  kobj == Py_None ? -1 : PyBytes_GET_SIZE(kobj), PyBytes_AS_STRING(vobj),
                  PyBytes_GET_SIZE(vobj), NULL);
    Py_DECREF(kobj);
    Py_DECREF(vobj);
    return rc;
}

PyDoc_STRVAR(scan_doc,
"scan(records, start, next_tick, stop_offset, horizon_ts, lat_active, buckets, declared,\n"
"     index=None, table=None)\n"
"-> (end, digest_add, accepted, clamped, bounded)\n\n"
"Handle records[start:end] (each accepted on the fast path: digest added, units bucketed in\n"
"``buckets`` = {tick: {bucket key: units}}) and stop at ``end``, the first record that needs\n"
"the pure path (or len(records)). ``records``: a sequence of record objects, or a\n"
"RecordBlock. ``stop_offset``: the offset of the next pending closing point (records at or\n"
"past it are left to the pure path); ``horizon_ts``: the worker clock's bound on event times\n"
"(Unix s); ``lat_active``: the LogAppendTime rule is live; ``declared``: event key -> bucket\n"
"key; ``index``: a KeyIndex of ``declared`` (used while fresh, else the dict is). "
"``digest_add`` is the sum of the records' digests modulo 2^128. After users(): ``table``,\n"
"the partition's UserTable (each event's last decision: counted, or ``bounded``: digested\n"
"and dropped; the table lists the persons counted while ``tracking``).");

static PyObject *Scanner_scan(Scanner *self, PyObject *args) {
    PyObject *records, *buckets, *declared, *index = Py_None, *table = Py_None;
    Py_ssize_t start;
    long long next_tick, stop_offset;
    double horizon_ts;
    int lat_active;
    if (!PyArg_ParseTuple(args, "OnLLdpO!O!|OO", &records, &start, &next_tick, &stop_offset,
                          &horizon_ts, &lat_active, &PyDict_Type, &buckets, &PyDict_Type,
                          &declared, &index, &table))
        return NULL;
    if (index != Py_None && Py_TYPE(index) != &KeyIndexType) {
        PyErr_SetString(PyExc_TypeError, "index must be a KeyIndex or None");
        return NULL;
    }
    if (self->users ? !ut_check(table) : table != Py_None) {
        PyErr_SetString(PyExc_TypeError, "table: a UserTable with Scanner.users, else None");
        return NULL;
    }
    ScanCtx c = {self, next_tick, stop_offset, horizon_ts, lat_active, buckets, declared,
                 0, 0, 0, 0, NULL, NULL, 0, NULL, -1, NULL,
                 self->users ? (UserTable *)table : NULL, 0};
    /* checked once per call: nothing in the scan runs Python code that could change it */
    if (index != Py_None && KeyIndex_is_fresh((KeyIndex *)index, declared))
        c.index = (const KeyIndex *)index;
    Py_ssize_t i = start, n;
    int failed = 0;
    if (Py_TYPE(records) == &RecordBlockType) {
        RecordBlock *blk = (RecordBlock *)records;
        const char *base = PyBytes_AS_STRING(blk->buf);
        n = blk->n;
        /* with the index, records are parsed two ahead of their turn and their slot, entry
         * and bucket key fetched in two steps meanwhile: at 10^6 keys each is a cache miss
         * that would otherwise stall the record's turn (RESULTS.md, issue #25) */
        Ahead ring[3];
        if (c.index != NULL) {
            look_ahead(&c, blk, i, &ring[i % 3]);
            look_ahead(&c, blk, i + 1, &ring[(i + 1) % 3]);
            resolve_ahead(c.index, &ring[i % 3]);
        }
        for (; i < n; i++) {
            const RecInfo *ri = &blk->recs[i];
            if (ri->hdr_count) break;
            const Ahead *pre = NULL;
            if (c.index != NULL) {
                look_ahead(&c, blk, i + 2, &ring[(i + 2) % 3]);
                resolve_ahead(c.index, &ring[(i + 1) % 3]);
                pre = &ring[i % 3];
            }
            int rc = scan_one(&c, ri->offset, ri->timestamp, blk->timestamp_type,
                              ri->key_len < 0 ? NULL : base + ri->key_pos, ri->key_len,
                              ri->value_len < 0 ? NULL : base + ri->value_pos, ri->value_len,
                              pre);
            if (rc < 0) failed = 1;
            if (rc <= 0) break;
        }
    } else {
        n = PySequence_Size(records);
        if (n < 0) return NULL;
        int is_list = PyList_CheckExact(records);
        for (; i < n; i++) {
            PyObject *r = is_list ? PyList_GET_ITEM(records, i) : PySequence_GetItem(records, i);
            if (r == NULL) {
                failed = 1;
                break;
            }
            if (!is_list) Py_DECREF(r); /* the sequence keeps it alive */
            int rc = scan_object(&c, r);
            if (rc < 0) failed = 1;
            if (rc <= 0) break;
        }
    }
    PyMem_Free(c.heap);
    Py_XDECREF(c.sum_obj);
    if (failed) return NULL;
    PyObject *lo = PyLong_FromUnsignedLongLong((unsigned long long)c.acc);
    PyObject *hi = PyLong_FromUnsignedLongLong((unsigned long long)(c.acc >> 64));
    PyObject *sh = PyLong_FromLong(64);
    PyObject *digest = NULL;
    if (lo && hi && sh) {
        PyObject *t = PyNumber_Lshift(hi, sh);
        if (t) {
            digest = PyNumber_Or(t, lo);
            Py_DECREF(t);
        }
    }
    Py_XDECREF(lo);
    Py_XDECREF(hi);
    Py_XDECREF(sh);
    if (digest == NULL) return NULL;
    return Py_BuildValue("nNLLL", i, digest, c.accepted, c.clamped, c.bounded);
}

PyDoc_STRVAR(users_doc,
"users(field, partitions, partition, key): decide privacy_unit = user on the fast path\n"
"(agents/ingest/users.py): an event must carry ``field`` (bytes of the member name) as a\n"
"string without escapes, of 1 to 256 bytes of valid UTF-8, that Kafka's default partitioner\n"
"over ``partitions`` puts on ``partition``; its person is SipHash-2-4-128 of it under ``key``\n"
"(16 bytes), bounded by the UserTable given to scan(). Anything else: the pure path.");

static PyObject *Scanner_users(Scanner *self, PyObject *args) {
    Py_buffer field, key;
    unsigned long long partitions, partition;
    if (!PyArg_ParseTuple(args, "y*KKy*", &field, &partitions, &partition, &key)) return NULL;
    int bad = field.len < 1 || field.len > (Py_ssize_t)sizeof self->ufield || partitions < 1 ||
              partitions > 0x7fffffffULL || partition >= partitions || key.len != 16;
    if (!bad) {
        memcpy(self->ufield, field.buf, (size_t)field.len);
        self->ufield_len = field.len;
        memcpy(self->ukey, key.buf, 16);
    }
    PyBuffer_Release(&field);
    PyBuffer_Release(&key);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "users(field of 1..256 bytes, partitions >= 1, "
                        "partition < partitions, key of 16 bytes)");
        return NULL;
    }
    self->partitions = (uint32_t)partitions;
    self->partition = (uint32_t)partition;
    self->users = 1;
    Py_RETURN_NONE;
}

static PyMethodDef Scanner_methods[] = {
    {"scan", (PyCFunction)Scanner_scan, METH_VARARGS, scan_doc},
    {"users", (PyCFunction)Scanner_users, METH_VARARGS, users_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(Scanner_doc,
"Scanner(dkey, max_bytes, max_value, cap, inv_unit, cap_u, origin, tick_seconds, lateness,\n"
"        grace, skew, max_age, markers, whole)\n\n"
"The constants of one events partition's ingest state (agents.ingest.IngestState): the\n"
"schedule digest key (1..64 bytes), limits (bytes, value units), the unit scale\n"
"(1 / value unit, a power of two), the cap in units, and the schedule (Unix seconds).");

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "agents.ingest._fastingest.Scanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = Scanner_doc,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Scanner_init,
    .tp_methods = Scanner_methods,
};

/* ------------------------------------------------------------------ RecordBlock */

/* A zigzag varint of at most 64 bits (Kafka's varint / varlong). 0, or -1 if malformed. */
static int read_varint(const unsigned char **pp, const unsigned char *end, long long *out) {
    const unsigned char *p = *pp;
    unsigned long long v = 0;
    int shift = 0;
    for (;;) {
        if (p >= end || shift > 63) return -1; /* at most 10 bytes */
        unsigned char b = *p++;
        v |= (unsigned long long)(b & 0x7f) << shift;
        if (!(b & 0x80)) break;
        shift += 7;
    }
    *out = (long long)(v >> 1) ^ -(long long)(v & 1);
    *pp = p;
    return 0;
}

static inline long long be64(const unsigned char *p) {
    unsigned long long v = 0;
    for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
    return (long long)v;
}

static inline long be32(const unsigned char *p) {
    return (long)(int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) |
                           ((uint32_t)p[2] << 8) | (uint32_t)p[3]);
}

static int block_fail(const char *why) {
    PyErr_SetString(PyExc_ValueError, why);
    return -1;
}

static int RecordBlock_init(RecordBlock *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"buf", "pos", "min_offset", NULL};
    PyObject *buf;
    Py_ssize_t pos;
    long long min_offset;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!nL", kwlist, &PyBytes_Type, &buf, &pos,
                                     &min_offset))
        return -1;
    if (self->buf != NULL) return block_fail("RecordBlock is immutable");
    const unsigned char *all = (const unsigned char *)PyBytes_AS_STRING(buf);
    Py_ssize_t size = PyBytes_GET_SIZE(buf);
    if (pos < 0 || pos + 61 > size) return block_fail("truncated batch header");
    const unsigned char *h = all + pos;
    long long base_offset = be64(h);
    /* no broker sends one; the CRC does not cover it: let aiokafka decode such bytes */
    if (base_offset < 0) return block_fail("negative base offset");
    long batch_len = be32(h + 8);
    if (batch_len < 49 || pos + 12 + (Py_ssize_t)batch_len > size)
        return block_fail("truncated batch");
    if (h[16] != 2) return block_fail("not message format v2");
    int attributes = (int)(((unsigned)h[21] << 8) | h[22]);
    if (attributes & 0x07) return block_fail("compressed batch");
    if (attributes & 0x20) return block_fail("control batch");
    int ts_type = (attributes >> 3) & 1;
    long long first_ts = be64(h + 27), max_ts = be64(h + 35);
    long count = be32(h + 57);
    /* every record takes at least 7 bytes (seven one-byte varints: length, attributes,
     * timestamp delta, offset delta, key length, value length, header count), so a larger
     * count cannot be read (by aiokafka either): refused before allocating a RecInfo per
     * *claimed* record (a writer's 1 MB batch claiming 10^6 records made 56 MB) */
    if (count < 0 || count > (batch_len - 49) / 7) return block_fail("bad record count");
    RecInfo *recs = PyMem_Calloc(count ? (size_t)count : 1, sizeof(RecInfo));
    if (recs == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    const unsigned char *p = h + 61, *end = h + 12 + batch_len;
    Py_ssize_t kept = 0;
    /* aiokafka's fetcher skips a record below its running next offset (the fetch position,
     * then the last yielded record's offset + 1): a hostile batch's offset deltas need not
     * increase, and the block must keep exactly the records aiokafka would yield */
    long long next = min_offset;
    int past_max = 0; /* a record at INT64_MAX was kept: every later one lies below next */
    for (long j = 0; j < count; j++) {
        long long len, ts_delta, off_delta, klen, vlen, hcount;
        if (read_varint(&p, end, &len) < 0 || len < 0 || len > INT32_MAX || len > end - p)
            goto bad;
        const unsigned char *rend = p + len;
        long long rattr;
        /* record attributes: an int8 in Kafka's format (always 0), but aiokafka reads a varint
         * there, and the batch must read exactly as aiokafka reads it (a hostile writer's 0x80
         * shifted every later field of the record) */
        if (read_varint(&p, rend, &rattr) < 0) goto bad;
        if (read_varint(&p, rend, &ts_delta) < 0 || read_varint(&p, rend, &off_delta) < 0 ||
            read_varint(&p, rend, &klen) < 0 || klen < -1 || klen > rend - p)
            goto bad;
        if (off_delta < INT32_MIN || off_delta > INT32_MAX || klen > INT32_MAX) goto bad;
        RecInfo ri;
        /* two's-complement wrap-around, as aiokafka's int64 arithmetic (no undefined overflow) */
        ri.offset = (long long)((unsigned long long)base_offset + (unsigned long long)off_delta);
        ri.timestamp = ts_type ? max_ts
                               : (long long)((unsigned long long)first_ts +
                                             (unsigned long long)ts_delta);
        ri.key_pos = (Py_ssize_t)(p - all);
        ri.key_len = (Py_ssize_t)klen;
        if (klen > 0) p += klen;
        if (read_varint(&p, rend, &vlen) < 0 || vlen < -1 || vlen > rend - p) goto bad;
        ri.value_pos = (Py_ssize_t)(p - all);
        ri.value_len = (Py_ssize_t)vlen;
        if (vlen > 0) p += vlen;
        if (read_varint(&p, rend, &hcount) < 0 || hcount < 0 || hcount > rend - p) goto bad;
        ri.hdr_pos = (Py_ssize_t)(p - all);
        ri.hdr_count = (Py_ssize_t)hcount;
        for (long long k = 0; k < hcount; k++) {
            long long hk, hv;
            if (read_varint(&p, rend, &hk) < 0 || hk < 0 || hk > rend - p) goto bad;
            /* header names are UTF-8 (aiokafka decodes them): check it here */
            PyObject *name = PyUnicode_DecodeUTF8((const char *)p, (Py_ssize_t)hk, NULL);
            if (name == NULL) {
                PyErr_Clear();
                goto bad;
            }
            Py_DECREF(name);
            p += hk;
            if (read_varint(&p, rend, &hv) < 0 || hv < -1 || hv > rend - p) goto bad;
            if (hv > 0) p += hv;
        }
        if (p != rend) goto bad;
        if (past_max || ri.offset < next) continue; /* as aiokafka skips it */
        if (ri.offset == LLONG_MAX)
            past_max = 1;
        else
            next = ri.offset + 1;
        recs[kept++] = ri;
    }
    if (p != end) goto bad;
    Py_INCREF(buf);
    self->buf = buf;
    self->n = kept;
    self->timestamp_type = ts_type;
    self->recs = recs;
    return 0;
bad:
    PyMem_Free(recs);
    return block_fail("malformed record in batch");
}

static void RecordBlock_dealloc(RecordBlock *self) {
    Py_XDECREF(self->buf);
    PyMem_Free(self->recs);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t RecordBlock_len(RecordBlock *self) { return self->n; }

static PyObject *bytes_at(const char *base, Py_ssize_t pos, Py_ssize_t len) {
    if (len < 0) Py_RETURN_NONE;
    return PyBytes_FromStringAndSize(base + pos, len);
}

/* The i-th record as agents.ingest.Record(offset, key, value, timestamp, timestamp_type,
 * headers): what the pure path reads (fallback records only). */
static PyObject *RecordBlock_item(RecordBlock *self, Py_ssize_t i) {
    if (i < 0 || i >= self->n) {
        PyErr_SetString(PyExc_IndexError, "record index out of range");
        return NULL;
    }
    if (record_factory == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "set_record_factory() was not called");
        return NULL;
    }
    const RecInfo *ri = &self->recs[i];
    const char *base = PyBytes_AS_STRING(self->buf);
    PyObject *headers = PyList_New(0);
    if (headers == NULL) return NULL;
    const unsigned char *p = (const unsigned char *)base + ri->hdr_pos;
    const unsigned char *end = (const unsigned char *)base + PyBytes_GET_SIZE(self->buf);
    for (Py_ssize_t k = 0; k < ri->hdr_count; k++) {
        long long hk, hv;
        read_varint(&p, end, &hk); /* validated when the block was built */
        PyObject *name = PyUnicode_DecodeUTF8((const char *)p, (Py_ssize_t)hk, NULL);
        p += hk;
        read_varint(&p, end, &hv);
        PyObject *val = bytes_at((const char *)p, 0, (Py_ssize_t)hv);
        if (hv > 0) p += hv;
        PyObject *pair = (name && val) ? PyTuple_Pack(2, name, val) : NULL;
        Py_XDECREF(name);
        Py_XDECREF(val);
        if (pair == NULL || PyList_Append(headers, pair) < 0) {
            Py_XDECREF(pair);
            Py_DECREF(headers);
            return NULL;
        }
        Py_DECREF(pair);
    }
    PyObject *key = bytes_at(base, ri->key_pos, ri->key_len);
    PyObject *value = bytes_at(base, ri->value_pos, ri->value_len);
    PyObject *out = NULL;
    if (key && value)
        out = PyObject_CallFunction(record_factory, "LOOLiO", ri->offset, key, value,
                                    ri->timestamp, self->timestamp_type, headers);
    Py_XDECREF(key);
    Py_XDECREF(value);
    Py_DECREF(headers);
    return out;
}

static PyObject *RecordBlock_offset(RecordBlock *self, void *closure) {
    (void)closure;
    return PyLong_FromLongLong(self->n ? self->recs[self->n - 1].offset : -1);
}

static PyGetSetDef RecordBlock_getset[] = {
    {"offset", (getter)RecordBlock_offset, NULL,
     "The offset of the block's last record (-1 if empty): aiokafka's fetch loop moves the "
     "partition's position past it.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods RecordBlock_as_sequence = {
    .sq_length = (lenfunc)RecordBlock_len,
    .sq_item = (ssizeargfunc)RecordBlock_item,
};

PyDoc_STRVAR(RecordBlock_doc,
"RecordBlock(buf, pos, min_offset)\n\n"
"The records of one uncompressed Kafka record batch (message format v2, not a control batch)\n"
"starting at byte ``pos`` of the fetched bytes ``buf``, records with an offset below\n"
"``min_offset`` left out (as aiokafka leaves them out). A sequence of records: item ``i`` is\n"
"an ``agents.ingest.Record`` (built on demand, for the records the pure path decides);\n"
"``Scanner.scan`` reads the others in place. ValueError for anything else (aiokafka decodes\n"
"such a batch itself).");

static PyTypeObject RecordBlockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "agents.ingest._fastingest.RecordBlock",
    .tp_basicsize = sizeof(RecordBlock),
    .tp_dealloc = (destructor)RecordBlock_dealloc,
    .tp_as_sequence = &RecordBlock_as_sequence,
    .tp_getset = RecordBlock_getset,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = RecordBlock_doc,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)RecordBlock_init,
};

static PyObject *fi_set_record_factory(PyObject *mod, PyObject *arg) {
    (void)mod;
    Py_INCREF(arg);
    Py_XSETREF(record_factory, arg);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ module functions */

static PyObject *fi_blake2b(PyObject *mod, PyObject *args) {
    (void)mod;
    Py_buffer key, data;
    Py_ssize_t outlen = 16;
    if (!PyArg_ParseTuple(args, "y*y*|n", &key, &data, &outlen)) return NULL;
    sdp_blake2b_key k;
    uint8_t out[64];
    if (key.len > 64 || sdp_blake2b_init_key(&k, (size_t)outlen, key.buf, (size_t)key.len) < 0) {
        PyBuffer_Release(&key);
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "key must be 0..64 bytes, digest size 1..64");
        return NULL;
    }
    sdp_blake2b(&k, data.buf, (size_t)data.len, out);
    PyBuffer_Release(&key);
    PyBuffer_Release(&data);
    return PyBytes_FromStringAndSize((const char *)out, outlen);
}

static PyObject *fi_siphash128(PyObject *mod, PyObject *args) {
    (void)mod;
    Py_buffer key, data;
    if (!PyArg_ParseTuple(args, "y*y*", &key, &data)) return NULL;
    uint8_t out[16];
    int bad = key.len != 16;
    if (!bad) sdp_siphash128(key.buf, data.buf, (size_t)data.len, out);
    PyBuffer_Release(&key);
    PyBuffer_Release(&data);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "siphash128: the key must be 16 bytes");
        return NULL;
    }
    return PyBytes_FromStringAndSize((const char *)out, 16);
}

static PyObject *fi_parse_event(PyObject *mod, PyObject *arg) {
    (void)mod;
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "bytes expected");
        return NULL;
    }
    Event ev;
    const char *b = PyBytes_AS_STRING(arg);
    if (parse_event(b, b + PyBytes_GET_SIZE(arg), &ev, NULL, 0) < 0) Py_RETURN_NONE;
    PyObject *key = PyUnicode_DecodeUTF8(ev.key, ev.key_len, NULL);
    if (key == NULL) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return Py_BuildValue("Ndd", key, ev.ts, ev.has_value ? ev.value : 1.0);
}


/* dict_columns(d) -> (keys, sums) as native int64 bytes, sorted by key, or None when a key or
 * a sum is not an int that fits int64 (the caller falls back). An open bucket's checkpoint
 * columns (agents.bucket_columns): one pass over the dict instead of two np.fromiter over
 * Python ints, and an LSD radix sort over the bytes the keys use (leaf indices: 3 passes). */
static PyObject *fi_dict_columns(PyObject *mod, PyObject *arg) {
    (void)mod;
    if (!PyDict_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "dict expected");
        return NULL;
    }
    Py_ssize_t n = PyDict_GET_SIZE(arg);
    uint64_t *k = PyMem_Malloc(sizeof(uint64_t) * (size_t)(n ? n : 1) * 2);
    int64_t *v = PyMem_Malloc(sizeof(int64_t) * (size_t)(n ? n : 1) * 2);
    if (k == NULL || v == NULL) {
        PyMem_Free(k);
        PyMem_Free(v);
        return PyErr_NoMemory();
    }
    Py_ssize_t pos = 0, i = 0;
    PyObject *key, *val;
    int64_t kmin = INT64_MAX;
    int ok = 1;
    while (PyDict_Next(arg, &pos, &key, &val)) {
        if (!PyLong_CheckExact(key) || !PyLong_CheckExact(val)) { ok = 0; break; }
        int over = 0;
        long long a = PyLong_AsLongLongAndOverflow(key, &over);
        if (over) { ok = 0; break; }
        long long b = PyLong_AsLongLongAndOverflow(val, &over);
        if (over) { ok = 0; break; }
        k[i] = (uint64_t)a;
        v[i] = (int64_t)b;
        if ((int64_t)a < kmin) kmin = (int64_t)a;
        i++;
    }
    if (!ok || i != n) {
        PyMem_Free(k);
        PyMem_Free(v);
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    /* radix sort on key - min (distinct keys: any correct sort gives the one order) */
    uint64_t span = 0;
    for (i = 0; i < n; i++) {
        k[i] -= (uint64_t)kmin;  /* unsigned: key - min, exact for any int64 pair */
        if (k[i] > span) span = k[i];
    }
    uint64_t *k2 = k + n;
    int64_t *v2 = v + n;
    for (int shift = 0; shift < 64 && (shift == 0 || (span >> shift) != 0); shift += 8) {
        Py_ssize_t count[257] = {0};
        for (i = 0; i < n; i++) count[((k[i] >> shift) & 0xff) + 1]++;
        for (int b = 0; b < 256; b++) count[b + 1] += count[b];
        for (i = 0; i < n; i++) {
            Py_ssize_t at = count[(k[i] >> shift) & 0xff]++;
            k2[at] = k[i];
            v2[at] = v[i];
        }
        uint64_t *tk = k; k = k2; k2 = tk;
        int64_t *tv = v; v = v2; v2 = tv;
    }
    for (i = 0; i < n; i++) k[i] += (uint64_t)kmin;
    PyObject *kb = PyBytes_FromStringAndSize((const char *)k, (Py_ssize_t)sizeof(uint64_t) * n);
    PyObject *vb = PyBytes_FromStringAndSize((const char *)v, (Py_ssize_t)sizeof(int64_t) * n);
    /* k/v may point at either half after an odd number of passes: free the base */
    PyMem_Free(k < k2 ? k : k2);
    PyMem_Free(v < v2 ? v : v2);
    if (kb == NULL || vb == NULL) {
        Py_XDECREF(kb);
        Py_XDECREF(vb);
        return NULL;
    }
    return Py_BuildValue("NN", kb, vb);
}

static PyObject *fi_key_hash(PyObject *self, PyObject *arg) {
    (void)self;
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "key_hash() takes bytes");
        return NULL;
    }
    return PyLong_FromLongLong((long long)(int64_t)ki_hash(PyBytes_AS_STRING(arg),
                                                          PyBytes_GET_SIZE(arg)));
}

static PyMethodDef module_methods[] = {
    {"key_hash", fi_key_hash, METH_O,
     "key_hash(data) -> int: the key index's hash of the bytes (equal to hash(data))."},
    {"siphash128", fi_siphash128, METH_VARARGS,
     "siphash128(key, data) -> bytes: SipHash-2-4 with a 128-bit output under a 16-byte key "
     "(a person's identifier, agents.ingest.users)."},
    {"blake2b", fi_blake2b, METH_VARARGS,
     "blake2b(key, data, digest_size=16) -> bytes: keyed BLAKE2b (the vendored C code)."},
    {"set_record_factory", fi_set_record_factory, METH_O,
     "set_record_factory(cls): the record type RecordBlock items are built with."},
    {"dict_columns", fi_dict_columns, METH_O,
     "dict_columns(d) -> (keys, sums) int64 bytes sorted by key, or None (a key or sum not "
     "an int in int64)."},
    {"parse_event", fi_parse_event, METH_O,
     "parse_event(raw) -> (key, ts, value) or None: the strict parser of the fast path "
     "(None: the pure path decides)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "agents.ingest._fastingest",
    "The compiled fast path of the ingest hot loop (see agents.ingest).", -1, module_methods,
};

PyMODINIT_FUNC PyInit__fastingest(void) {
    if (PyType_Ready(&ScannerType) < 0 || PyType_Ready(&RecordBlockType) < 0 ||
        PyType_Ready(&KeyIndexType) < 0)
        return NULL;
    s_offset = PyUnicode_InternFromString("offset");
    s_key = PyUnicode_InternFromString("key");
    s_value = PyUnicode_InternFromString("value");
    s_timestamp = PyUnicode_InternFromString("timestamp");
    s_timestamp_type = PyUnicode_InternFromString("timestamp_type");
    s_headers = PyUnicode_InternFromString("headers");
    if (!s_offset || !s_key || !s_value || !s_timestamp || !s_timestamp_type || !s_headers)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL) return NULL;
    Py_INCREF(&ScannerType);
    if (PyModule_AddObject(m, "Scanner", (PyObject *)&ScannerType) < 0) {
        Py_DECREF(&ScannerType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&RecordBlockType);
    if (PyModule_AddObject(m, "RecordBlock", (PyObject *)&RecordBlockType) < 0) {
        Py_DECREF(&RecordBlockType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&KeyIndexType);
    if (PyModule_AddObject(m, "KeyIndex", (PyObject *)&KeyIndexType) < 0) {
        Py_DECREF(&KeyIndexType);
        Py_DECREF(m);
        return NULL;
    }
    if (usertable_add_type(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
