/* agents._fastingest: the compiled fast path of the ingest hot loop (agents.ingest).
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
 * property test (tests/unit/test_fastingest.py) checks that both give identical state.
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

typedef struct {
    PyObject_HEAD
    sdp_blake2b_key key;
    Py_ssize_t max_bytes;
    double max_value, cap, inv_unit, origin, tick_seconds, lateness, grace, skew, max_age;
    long long cap_u;
    int markers, whole;
} Scanner;

static PyObject *s_offset, *s_key, *s_value, *s_timestamp, *s_timestamp_type, *s_headers;

/* ------------------------------------------------------------------ strict JSON subset */

typedef struct {
    const char *key;  /* the key's UTF-8 bytes (no escapes), or NULL if absent */
    Py_ssize_t key_len;
    double ts, value;
    int has_ts, has_value;
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

/* Parse ``{"key": str, "ts": number, "value": number}`` (each member at most once, any order,
 * no other member). 0 on success, -1 on anything else. */
static int parse_event(const char *p, const char *end, Event *ev) {
    ev->key = NULL;
    ev->key_len = 0;
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
        } else {
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
    if (ev->key == NULL || !ev->has_ts) return -1;
    return 0;
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

/* Add ``u`` units to ``bucket[nodes]``. 0, or -1 with an exception set. */
static int bucket_add(PyObject *bucket, PyObject *nodes, long long u) {
    PyObject *old = PyDict_GetItemWithError(bucket, nodes); /* borrowed */
    PyObject *sum;
    if (old == NULL) {
        if (PyErr_Occurred()) return -1;
        sum = PyLong_FromLongLong(u);
    } else {
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

PyDoc_STRVAR(scan_doc,
"scan(records, start, next_tick, stop_offset, horizon_ts, lat_active, buckets, declared)\n"
"-> (end, digest_add, accepted, clamped)\n\n"
"Handle records[start:end] (each accepted on the fast path: digest added, units bucketed in\n"
"``buckets`` = {tick: {bucket key: units}}) and stop at ``end``, the first record that needs\n"
"the pure path (or len(records)). ``stop_offset``: the offset of the next pending closing\n"
"point (records at or past it are left to the pure path); ``horizon_ts``: markers schedule's\n"
"bound on event times (Unix s); ``lat_active``: the LogAppendTime rule is live; ``declared``:\n"
"event key -> bucket key. ``digest_add`` is the sum of the records' digests modulo 2^128.");

static PyObject *Scanner_scan(Scanner *self, PyObject *args) {
    PyObject *records, *buckets, *declared;
    Py_ssize_t start;
    long long next_tick, stop_offset;
    double horizon_ts;
    int lat_active;
    if (!PyArg_ParseTuple(args, "OnLLdpO!O!", &records, &start, &next_tick, &stop_offset,
                          &horizon_ts, &lat_active, &PyDict_Type, &buckets, &PyDict_Type,
                          &declared))
        return NULL;
    Py_ssize_t n = PySequence_Size(records);
    if (n < 0) return NULL;
    int is_list = PyList_CheckExact(records);
    unsigned __int128 acc = 0;
    long long accepted = 0, clamped = 0;
    const double origin = self->origin, tick_seconds = self->tick_seconds;
    long long cur_tick = 0;
    PyObject *cur_bucket = NULL; /* the last tick's bucket (borrowed: buckets holds it) */
    char stackbuf[512];
    char *heap = NULL;
    Py_ssize_t heap_size = 0;
    Py_ssize_t i = start;
    int failed = 0;

    for (; i < n; i++) {
        PyObject *r = is_list ? PyList_GET_ITEM(records, i) : PySequence_GetItem(records, i);
        if (r == NULL) {
            failed = 1;
            break;
        }
        if (!is_list) Py_DECREF(r); /* the sequence keeps it alive */
        long long offset, rts_ms, rtype;
        int rc = get_int_attr(r, s_offset, 0, &offset);
        if (rc == -2) { failed = 1; break; }
        if (rc < 0 || offset >= stop_offset) break;
        /* headers: any header (a marker, or bytes that change the digest) -> pure path */
        PyObject *h = PyObject_GetAttr(r, s_headers);
        if (h == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) { failed = 1; break; }
            PyErr_Clear();
        } else {
            int truth = PyObject_IsTrue(h);
            Py_DECREF(h);
            if (truth < 0) { PyErr_Clear(); break; }
            if (truth) break;
        }
        rc = get_int_attr(r, s_timestamp, -1, &rts_ms);
        if (rc == -2) { failed = 1; break; }
        if (rc < 0) break;
        rc = get_int_attr(r, s_timestamp_type, 0, &rtype);
        if (rc == -2) { failed = 1; break; }
        if (rc < 0) break;
        if (!self->markers && rts_ms < 0) break;
        /* |rts_ms| < 2^53: its double is exact, as Python's int -> float is */
        if (rts_ms > (1LL << 53) || rts_ms < -(1LL << 53)) break;
        const double arrival = (double)rts_ms / 1000.0;
        if (lat_active && rtype == 1 && rts_ms >= 0) {
            double through = floor((arrival - self->grace - self->lateness - origin) / tick_seconds);
            if (!(through < (double)next_tick)) break; /* it may close ticks: pure path */
        }
        PyObject *kobj = PyObject_GetAttr(r, s_key);
        if (kobj == NULL) { PyErr_Clear(); break; }
        PyObject *vobj = PyObject_GetAttr(r, s_value);
        if (vobj == NULL) { Py_DECREF(kobj); PyErr_Clear(); break; }
        int ok = (kobj == Py_None || PyBytes_CheckExact(kobj)) && PyBytes_CheckExact(vobj) &&
                 PyBytes_GET_SIZE(vobj) <= self->max_bytes;
        Event ev;
        if (ok) {
            const char *vb = PyBytes_AS_STRING(vobj);
            ok = parse_event(vb, vb + PyBytes_GET_SIZE(vobj), &ev) == 0;
        }
        double rts = 0.0, rv = 1.0;
        long long tick = 0;
        if (ok) {
            rts = ev.ts;
            rv = ev.has_value ? ev.value : 1.0;
            ok = origin <= rts && 0.0 <= rv && rv <= self->max_value &&
                 (self->markers ? rts <= horizon_ts
                                : (rts <= arrival + self->skew && arrival - rts <= self->max_age)) &&
                 (!self->whole || floor(rv) == rv);
        }
        if (ok) {
            double t = floor((rts - origin) / tick_seconds);
            ok = t > -9.0e15 && t < 9.0e15;
            if (ok) {
                tick = (long long)t + 1;
                ok = tick >= next_tick &&
                     (self->markers ||
                      (double)tick > floor((arrival - self->lateness - origin) / tick_seconds));
            }
        }
        PyObject *nodes = NULL;
        if (ok) {
            PyObject *ks = PyUnicode_DecodeUTF8(ev.key, ev.key_len, NULL);
            if (ks == NULL) {
                PyErr_Clear();
                ok = 0;
            } else {
                nodes = PyDict_GetItemWithError(declared, ks); /* borrowed */
                Py_DECREF(ks);
                if (nodes == NULL) {
                    PyErr_Clear();
                    ok = 0;
                }
            }
        }
        if (!ok) {
            Py_DECREF(kobj);
            Py_DECREF(vobj);
            break;
        }
        Py_INCREF(nodes);
        /* the record digest: b"<offset>|<ts>|<type>|" key part, value part, b"0|" */
        Py_ssize_t klen = kobj == Py_None ? -1 : PyBytes_GET_SIZE(kobj);
        Py_ssize_t vlen = PyBytes_GET_SIZE(vobj);
        Py_ssize_t need = 3 * 24 + 2 * 24 + (klen > 0 ? klen : 0) + vlen + 8;
        char *buf = stackbuf;
        if (need > (Py_ssize_t)sizeof stackbuf) {
            if (need > heap_size) {
                char *nb = PyMem_Realloc(heap, (size_t)need);
                if (nb == NULL) {
                    Py_DECREF(kobj);
                    Py_DECREF(vobj);
                    Py_DECREF(nodes);
                    PyErr_NoMemory();
                    failed = 1;
                    break;
                }
                heap = nb;
                heap_size = need;
            }
            buf = heap;
        }
        char *p = buf;
        p = put_ll(p, offset);
        *p++ = '|';
        p = put_ll(p, self->markers ? -1 : rts_ms);
        *p++ = '|';
        p = put_ll(p, rtype);
        *p++ = '|';
        if (klen < 0) {
            *p++ = '-';
            *p++ = '|';
        } else {
            p = put_ll(p, klen);
            *p++ = '|';
            memcpy(p, PyBytes_AS_STRING(kobj), (size_t)klen);
            p += klen;
        }
        p = put_ll(p, vlen);
        *p++ = '|';
        memcpy(p, PyBytes_AS_STRING(vobj), (size_t)vlen);
        p += vlen;
        *p++ = '0';
        *p++ = '|';
        Py_DECREF(kobj);
        Py_DECREF(vobj);
        uint64_t w0, w1;
        sdp_blake2b_words(&self->key, (const uint8_t *)buf, (size_t)(p - buf), &w0, &w1);
        /* the units: min(round(rv * inv_unit), cap_u), round half to even */
        if (rv > self->cap) clamped++;
        double x = rv * self->inv_unit;
        long long u;
        if (x >= (double)self->cap_u) {
            u = self->cap_u; /* round(x) >= cap_u (cap_u is an integer) */
        } else {
            u = (long long)nearbyint(x); /* the default rounding mode: half to even */
            if (u > self->cap_u) u = self->cap_u;
        }
        /* the bucket of the tick */
        if (cur_bucket == NULL || tick != cur_tick) {
            PyObject *tobj = PyLong_FromLongLong(tick);
            if (tobj == NULL) { Py_DECREF(nodes); failed = 1; break; }
            PyObject *b = PyDict_GetItemWithError(buckets, tobj);
            if (b == NULL) {
                if (PyErr_Occurred()) { Py_DECREF(tobj); Py_DECREF(nodes); failed = 1; break; }
                b = PyDict_New();
                if (b == NULL || PyDict_SetItem(buckets, tobj, b) < 0) {
                    Py_XDECREF(b);
                    Py_DECREF(tobj);
                    Py_DECREF(nodes);
                    failed = 1;
                    break;
                }
                Py_DECREF(b); /* buckets holds it */
            }
            if (!PyDict_CheckExact(b)) {
                Py_DECREF(tobj);
                Py_DECREF(nodes);
                break;
            }
            Py_DECREF(tobj);
            cur_bucket = b;
            cur_tick = tick;
        }
        if (bucket_add(cur_bucket, nodes, u) < 0) {
            Py_DECREF(nodes);
            failed = 1;
            break;
        }
        Py_DECREF(nodes);
        acc += ((unsigned __int128)w1 << 64) | w0;
        accepted++;
    }
    PyMem_Free(heap);
    if (failed) return NULL;
    PyObject *lo = PyLong_FromUnsignedLongLong((unsigned long long)acc);
    PyObject *hi = PyLong_FromUnsignedLongLong((unsigned long long)(acc >> 64));
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
    return Py_BuildValue("nNLL", i, digest, accepted, clamped);
}

static PyMethodDef Scanner_methods[] = {
    {"scan", (PyCFunction)Scanner_scan, METH_VARARGS, scan_doc},
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
    .tp_name = "agents._fastingest.Scanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = Scanner_doc,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Scanner_init,
    .tp_methods = Scanner_methods,
};

/* ------------------------------------------------------------------ module functions */

static PyObject *fi_blake2b(PyObject *mod, PyObject *args) {
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

static PyObject *fi_parse_event(PyObject *mod, PyObject *arg) {
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "bytes expected");
        return NULL;
    }
    Event ev;
    const char *b = PyBytes_AS_STRING(arg);
    if (parse_event(b, b + PyBytes_GET_SIZE(arg), &ev) < 0) Py_RETURN_NONE;
    PyObject *key = PyUnicode_DecodeUTF8(ev.key, ev.key_len, NULL);
    if (key == NULL) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return Py_BuildValue("Ndd", key, ev.ts, ev.has_value ? ev.value : 1.0);
}

static PyMethodDef module_methods[] = {
    {"blake2b", fi_blake2b, METH_VARARGS,
     "blake2b(key, data, digest_size=16) -> bytes: keyed BLAKE2b (the vendored C code)."},
    {"parse_event", fi_parse_event, METH_O,
     "parse_event(raw) -> (key, ts, value) or None: the strict parser of the fast path "
     "(None: the pure path decides)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "agents._fastingest",
    "The compiled fast path of the ingest hot loop (see agents.ingest).", -1, module_methods,
};

PyMODINIT_FUNC PyInit__fastingest(void) {
    if (PyType_Ready(&ScannerType) < 0) return NULL;
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
    return m;
}
