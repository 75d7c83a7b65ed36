/* The compact per-person table of privacy_unit = "user" (issue #34, docs/design/user-level.md
 * §3): the same decisions as stream_dp.user_level.Bounder (authoritative; the property tests of
 * tests/unit/agents/ingest/test_user_table.py compare them decision by decision and export by
 * export) in 32 bytes per person instead of ~570.
 *
 * Open addressing with linear probing over the 128-bit keyed hash, which is already uniform
 * (no second hash): a person's home slot is `h0 * cap >> 64` (h0 = the hash's first 8 bytes,
 * little endian), so the capacity need not be a power of two and grows by 1.5x at a load of
 * 3/4 (between 43 and 64 bytes per person). Per person: the largest counted tick and up to two
 * open periods with their counts (u32 periods, ticks below 2^31 — the top bit marks a person
 * changed since the changelog last took them —, u16 counts: K <= 65535). What it cannot hold
 * (a third open period, a tick past 2^31 - 1, leaf bounds) it refuses with -1
 * before changing anything, and agents.ingest.users moves the table to the Bounder.
 *
 * A wholly closed period is dropped by one sweep when the period closes (forget_before), which
 * rebuilds the table without the persons that are gone: no tombstones, no per-tick work. */
#include "usertable.h"
#include "userlog.h"

#include <limits.h>
#include <string.h>

#define UT_MIN_CAP 16

/* `s` counted an event: list it for the changelog (once until taken), with `was`, its slot
 * before this change (NULL: a new person). 0, or -2. */
static int ut_touch(UserTable *t, UTSlot *s, const UTSlot *was) {
    if (!t->tracking || (s->last_tick & UT_DIRTY)) return 0;
    if (t->ndirty == t->dirty_cap) {
        size_t cap = t->dirty_cap ? 2 * t->dirty_cap : 1024;
        unsigned char *d = PyMem_RawRealloc(t->dirty, cap * 16);
        if (d == NULL) {
            PyErr_NoMemory();
            return -2;
        }
        t->dirty = d;
        UTSlot *w = PyMem_RawRealloc(t->dirty_was, cap * sizeof(UTSlot));
        if (w == NULL) {
            PyErr_NoMemory();
            return -2;
        }
        t->dirty_was = w;
        t->dirty_cap = cap;
    }
    UTSlot *old = &t->dirty_was[t->ndirty];
    if (was != NULL) {
        *old = *was;
    } else {
        memset(old, 0, sizeof *old);
    }
    memcpy(t->dirty + 16 * t->ndirty++, s->h, 16);
    s->last_tick |= UT_DIRTY;
    return 0;
}

/* The slot holding `h`, or the empty slot where it would go (*found says which). */
static inline UTSlot *ut_probe(const UserTable *t, const unsigned char *h, int *found) {
    size_t i = ut_home(h, t->cap);
    for (;;) {
        UTSlot *s = &t->slots[i];
        if (ut_empty(s)) {
            *found = 0;
            return s;
        }
        if (memcmp(s->h, h, 16) == 0) {
            *found = 1;
            return s;
        }
        if (++i == t->cap) i = 0;
    }
}

/* A new array of `cap` slots holding the persons of `t` (those not empty). 0, or -2 with
 * MemoryError set (then `t` is unchanged). */
static int ut_rebuild(UserTable *t, size_t cap) {
    if (cap < UT_MIN_CAP) cap = UT_MIN_CAP;
    UTSlot *fresh = PyMem_RawCalloc(cap, sizeof(UTSlot));
    if (fresh == NULL) {
        PyErr_NoMemory();
        return -2;
    }
    UTSlot *old = t->slots;
    size_t old_cap = t->cap, n = 0;
    t->slots = fresh;
    t->cap = cap;
    for (size_t j = 0; j < old_cap; j++) {
        if (ut_empty(&old[j])) continue;
        int found;
        UTSlot *s = ut_probe(t, old[j].h, &found);
        *s = old[j];
        n++;
    }
    t->n = n;
    PyMem_RawFree(old);
    return 0;
}

UTSlot *ut_find(const UserTable *t, const unsigned char h[16]) {
    int found;
    UTSlot *s = ut_probe(t, h, &found);
    return found ? s : NULL;
}

/* Room for one more person (load <= 3/4 after it). */
static int ut_reserve(UserTable *t) {
    if ((t->n + 1) * 4 <= t->cap * 3) return 0;
    return ut_rebuild(t, t->cap + t->cap / 2);
}

int ut_admit(UserTable *t, const unsigned char h[16], long long tick) {
    if (tick < 1 || tick > (long long)(UT_DIRTY - 1)) return -1;
    uint32_t period = t->period_ticks ? (uint32_t)((tick - 1) / t->period_ticks) : 0;
    int found;
    UTSlot *s = ut_probe(t, h, &found);
    if (!found) {  /* a new person: the first event always counts (K >= 1) */
        if ((t->n + 1) * 4 > t->cap * 3) {
            if (ut_reserve(t) < 0) return -2;
            s = ut_probe(t, h, &found);
        }
        memcpy(s->h, h, 16);
        s->last_tick = (uint32_t)tick;
        s->period[0] = period;
        s->count[0] = 1;
        s->period[1] = 0;
        s->count[1] = 0;
        t->n++;
        return ut_touch(t, s, NULL) < 0 ? -2 : 1;
    }
    uint32_t last = UT_TICK(s);
    if (t->sep && last && (uint64_t)tick < (uint64_t)last + t->sep) return 0;
    int i;
    if (s->count[0] && s->period[0] == period) i = 0;
    else if (s->count[1] && s->period[1] == period) i = 1;
    else if (s->count[0] == 0) i = 0;
    else if (s->count[1] == 0) i = 1;
    else return -1;  /* a third open period */
    if (s->count[i] == 0) s->period[i] = period;  /* a new period (its first event counts) */
    else if (s->count[i] >= t->max_events) return 0;
    UTSlot was = *s;  /* as last written, if not changed since (else ut_touch ignores it) */
    s->count[i]++;
    if ((uint32_t)tick > last) s->last_tick = (uint32_t)tick | (s->last_tick & UT_DIRTY);
    return ut_touch(t, s, &was) < 0 ? -2 : 1;
}

static PyObject *ut_state(const UTSlot *s) {
    PyObject *periods = PyList_New(0);
    if (periods == NULL) return NULL;
    for (int i = 0; i < 2 && s->count[i]; i++) {
        PyObject *item = Py_BuildValue("(IIN)", s->period[i], (unsigned)s->count[i], PyDict_New());
        if (item == NULL || PyList_Append(periods, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(periods);
            return NULL;
        }
        Py_DECREF(item);
    }
    return Py_BuildValue("(IN)", UT_TICK(s), periods);
}

static int ut_person_arg(PyObject *o, const unsigned char **h) {
    if (!PyBytes_Check(o) || PyBytes_GET_SIZE(o) != 16) {
        PyErr_SetString(PyExc_TypeError, "a person is its 16-byte keyed hash (bytes)");
        return -1;
    }
    *h = (const unsigned char *)PyBytes_AS_STRING(o);
    return 0;
}

/* ------------------------------------------------------------------ Python type */

static int UserTable_init(UserTable *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"max_events", "period_ticks", "min_separation_ticks", NULL};
    unsigned long long k, t, b;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KKK", kwlist, &k, &t, &b)) return -1;
    if (k < 1 || k > 0xFFFF || t > UINT32_MAX || b > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "UserTable: K in 1..65535, the period and the "
                        "separation below 2^32 ticks");
        return -1;
    }
    self->max_events = (uint32_t)k;
    self->period_ticks = (uint32_t)t;
    self->sep = (uint32_t)b;
    PyMem_RawFree(self->slots);
    self->slots = PyMem_RawCalloc(UT_MIN_CAP, sizeof(UTSlot));
    if (self->slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->cap = UT_MIN_CAP;
    self->n = 0;
    return 0;
}

static void UserTable_dealloc(UserTable *self) {
    PyMem_RawFree(self->slots);
    PyMem_RawFree(self->dirty);
    PyMem_RawFree(self->dirty_was);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *UserTable_admit(UserTable *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 2 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "admit(person, tick, leaf=None)");
        return NULL;
    }
    const unsigned char *h;
    if (ut_person_arg(args[0], &h) < 0) return NULL;
    int overflow;
    long long tick = PyLong_AsLongLongAndOverflow(args[1], &overflow);
    if (tick == -1 && PyErr_Occurred()) return NULL;
    if (overflow) Py_RETURN_NONE;
    int got = ut_admit(self, h, tick);
    if (got == -2) return NULL;
    if (got < 0) Py_RETURN_NONE;
    return PyBool_FromLong(got);
}

static PyObject *UserTable_forget_before(UserTable *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"period", "open_tick", NULL};
    long long period, open_tick = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "L|L", kwlist, &period, &open_tick)) return NULL;
    PyObject *changed = PyList_New(0);
    if (changed == NULL) return NULL;
    size_t gone = 0;
    for (size_t j = 0; j < self->cap; j++) {
        UTSlot *s = &self->slots[j];
        if (ut_empty(s)) continue;
        int old = 0;
        for (int i = 1; i >= 0; i--) {
            if (s->count[i] && (long long)s->period[i] < period) {
                old = 1;
                if (i == 0) {  /* keep the survivor first (insertion order) */
                    s->period[0] = s->period[1];
                    s->count[0] = s->count[1];
                }
                s->count[1] = 0;
                s->period[1] = 0;
            }
        }
        int dead = s->count[0] == 0 &&
                   (!self->sep || (open_tick && (long long)UT_TICK(s) + self->sep <= open_tick));
        if (dead || old) {
            PyObject *b = PyBytes_FromStringAndSize((const char *)s->h, 16);
            if (b == NULL || PyList_Append(changed, b) < 0) {
                Py_XDECREF(b);
                Py_DECREF(changed);
                return NULL;  /* the sweep is cut short: the caller's state is lost anyway */
            }
            Py_DECREF(b);
        }
        if (dead) {
            s->last_tick = 0;  /* empty: the rebuild below leaves it out */
            gone++;
        }
    }
    if (gone) {
        size_t alive = self->n - gone;
        self->n = alive;
        if (ut_rebuild(self, alive + alive * 2 / 3 + 1) < 0) {
            Py_DECREF(changed);
            return NULL;
        }
    }
    return changed;
}

static PyObject *UserTable_person(UserTable *self, PyObject *arg) {
    const unsigned char *h;
    if (ut_person_arg(arg, &h) < 0) return NULL;
    int found;
    UTSlot *s = ut_probe(self, h, &found);
    if (!found) Py_RETURN_NONE;
    return ut_state(s);
}

static int ut_cmp(const void *a, const void *b) {
    return memcmp((*(UTSlot *const *)a)->h, (*(UTSlot *const *)b)->h, 16);
}

static PyObject *UserTable_export(UserTable *self, PyObject *Py_UNUSED(ignored)) {
    UTSlot **order = PyMem_RawMalloc((self->n ? self->n : 1) * sizeof(UTSlot *));
    if (order == NULL) return PyErr_NoMemory();
    size_t m = 0;
    for (size_t j = 0; j < self->cap; j++)
        if (!ut_empty(&self->slots[j])) order[m++] = &self->slots[j];
    qsort(order, m, sizeof(UTSlot *), ut_cmp);
    PyObject *out = PyList_New((Py_ssize_t)m);
    if (out == NULL) goto fail;
    for (size_t i = 0; i < m; i++) {
        PyObject *st = ut_state(order[i]);
        if (st == NULL) goto fail;
        PyObject *row = Py_BuildValue("(y#OO)", (const char *)order[i]->h, (Py_ssize_t)16,
                                      PyTuple_GET_ITEM(st, 0), PyTuple_GET_ITEM(st, 1));
        Py_DECREF(st);
        if (row == NULL) goto fail;
        PyList_SET_ITEM(out, (Py_ssize_t)i, row);
    }
    PyMem_RawFree(order);
    return out;
fail:
    PyMem_RawFree(order);
    Py_XDECREF(out);
    return NULL;
}

/* an int in [lo, hi], else -1 with nothing set (out of range, too big, not an int) */
static int ut_int(PyObject *o, long long lo, long long hi, long long *out) {
    if (!PyLong_CheckExact(o)) return -1;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return -1;
    }
    *out = v;
    return (v < lo || v > hi) ? -1 : 0;
}

static PyObject *ut_cannot(void) {
    PyErr_SetString(PyExc_OverflowError, "UserTable: a state the compact table cannot hold");
    return NULL;
}

PyDoc_STRVAR(load_doc,
"load(people): add the persons of export() (or Bounder.export()). ValueError with the\n"
"Bounder's message for a state the bounds cannot give (as far as checked before the first\n"
"state the table cannot hold); OverflowError for one it cannot hold (a non-empty per-leaf\n"
"count, a third period, a count of 0, a number past u32): load it into a Bounder then.");

static PyObject *UserTable_load(UserTable *self, PyObject *people) {
    PyObject *seq = PySequence_Fast(people, "load() takes a sequence of persons");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *person, *last_obj, *periods;
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != 3) goto cannot;
        person = PyTuple_GET_ITEM(row, 0);
        last_obj = PyTuple_GET_ITEM(row, 1);
        periods = PyTuple_GET_ITEM(row, 2);
        if (!PyBytes_Check(person) || PyBytes_GET_SIZE(person) != 16) goto cannot;
        const unsigned char *h = (const unsigned char *)PyBytes_AS_STRING(person);
        long long last;
        if (ut_int(last_obj, LLONG_MIN, LLONG_MAX, &last) < 0) goto cannot;
        int found;
        UTSlot *s = ut_probe(self, h, &found);
        if (found || last < 0) {
            PyErr_SetString(PyExc_ValueError, "a person twice, or a negative last tick");
            goto fail;
        }
        if (last > (long long)(UT_DIRTY - 1)) goto cannot;
        UTSlot slot;
        memset(&slot, 0, sizeof slot);
        memcpy(slot.h, h, 16);
        slot.last_tick = (uint32_t)last;
        if (!PyList_Check(periods) && !PyTuple_Check(periods)) goto cannot;
        PyObject *pseq = PySequence_Fast(periods, "periods");
        if (pseq == NULL) goto fail;
        Py_ssize_t np = PySequence_Fast_GET_SIZE(pseq);
        for (Py_ssize_t k = 0; k < np; k++) {
            PyObject *pr = PySequence_Fast_GET_ITEM(pseq, k);
            long long p, c;
            if (!PyTuple_Check(pr) || PyTuple_GET_SIZE(pr) != 3 ||
                ut_int(PyTuple_GET_ITEM(pr, 0), LLONG_MIN, LLONG_MAX, &p) < 0 ||
                ut_int(PyTuple_GET_ITEM(pr, 1), LLONG_MIN, LLONG_MAX, &c) < 0 ||
                !PyDict_CheckExact(PyTuple_GET_ITEM(pr, 2)) ||
                PyDict_GET_SIZE(PyTuple_GET_ITEM(pr, 2)) != 0) {
                Py_DECREF(pseq);
                goto cannot;
            }
            int twice = 0;
            for (int q = 0; q < k && q < 2; q++) twice |= (long long)slot.period[q] == p;
            if (c < 0 || c > (long long)self->max_events || twice) {
                PyErr_Format(PyExc_ValueError, "a period's counts (%lld) the bounds cannot give",
                             c);
                Py_DECREF(pseq);
                goto fail;
            }
            if (k >= 2 || c == 0 || p < 0 || p > (long long)UINT32_MAX) {
                Py_DECREF(pseq);
                goto cannot;
            }
            slot.period[k] = (uint32_t)p;
            slot.count[k] = (uint16_t)c;
        }
        Py_DECREF(pseq);
        if (ut_empty(&slot)) goto cannot;  /* no period and no tick: not a state admit makes */
        if ((self->n + 1) * 4 > self->cap * 3) {
            if (ut_reserve(self) < 0) goto fail;
            s = ut_probe(self, h, &found);
        }
        *s = slot;
        self->n++;
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
cannot:
    Py_DECREF(seq);
    return ut_cannot();
fail:
    Py_DECREF(seq);
    return NULL;
}

void ut_clear_dirty(UserTable *t) {
    for (size_t i = 0; i < t->ndirty; i++) {
        UTSlot *s = ut_find(t, t->dirty + 16 * i);
        if (s != NULL) s->last_tick &= ~UT_DIRTY;  /* (gone since: the caller writes a tombstone) */
    }
    t->ndirty = 0;
    if (t->dirty_cap > 65536) {  /* a burst's buffer is not kept for ever */
        PyMem_RawFree(t->dirty);
        PyMem_RawFree(t->dirty_was);
        t->dirty = NULL;
        t->dirty_was = NULL;
        t->dirty_cap = 0;
    }
}

static PyObject *UserTable_take_dirty(UserTable *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"states", NULL};
    int states = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|p", kwlist, &states)) return NULL;
    PyObject *out = PyList_New((Py_ssize_t)self->ndirty);
    if (out == NULL) return NULL;
    for (size_t i = 0; i < self->ndirty; i++) {
        const unsigned char *h = self->dirty + 16 * i;
        PyObject *b = PyBytes_FromStringAndSize((const char *)h, 16);
        if (b == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        if (states) {
            const UTSlot *was = &self->dirty_was[i];
            PyObject *state;
            if (ut_empty(was)) {
                state = Py_NewRef(Py_None);
            } else {
                UTSlot clean = *was;
                clean.last_tick &= ~UT_DIRTY;
                state = ut_state(&clean);
            }
            PyObject *pair = state == NULL ? NULL : PyTuple_Pack(2, b, state);
            Py_XDECREF(state);
            Py_DECREF(b);
            if (pair == NULL) {
                Py_DECREF(out);
                return NULL;
            }
            b = pair;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, b);
    }
    /* clear the marks only once the list exists: an error above leaves them to the next call */
    ut_clear_dirty(self);
    return out;
}

static PyObject *UserTable_get_tracking(UserTable *self, void *closure) {
    (void)closure;
    return PyBool_FromLong(self->tracking);
}

static int UserTable_set_tracking(UserTable *self, PyObject *value, void *closure) {
    (void)closure;
    int on = value == NULL ? 0 : PyObject_IsTrue(value);
    if (on < 0) return -1;
    self->tracking = on;
    return 0;
}

static Py_ssize_t UserTable_len(UserTable *self) { return (Py_ssize_t)self->n; }

static PyObject *UserTable_nbytes(UserTable *self, void *closure) {
    (void)closure;
    return PyLong_FromSize_t(sizeof(UserTable) + self->cap * sizeof(UTSlot) +
                             (16 + sizeof(UTSlot)) * self->dirty_cap);
}

static PyMethodDef UserTable_methods[] = {
    {"admit", (PyCFunction)(void (*)(void))UserTable_admit, METH_FASTCALL,
     "admit(person, tick, leaf=None) -> True (counted, recorded), False (over the bounds) or "
     "None (a state the table cannot hold: nothing changed)."},
    {"forget_before", (PyCFunction)(void (*)(void))UserTable_forget_before,
     METH_VARARGS | METH_KEYWORDS,
     "forget_before(period, open_tick=0) -> [person]: as Bounder.forget_before."},
    {"person", (PyCFunction)UserTable_person, METH_O,
     "person(person) -> (last_tick, [(period, count, {})]) or None: as Bounder.person."},
    {"export", (PyCFunction)UserTable_export, METH_NOARGS,
     "export() -> [(person, last_tick, [(period, count, {})])], in hash order."},
    {"load", (PyCFunction)UserTable_load, METH_O, load_doc},
    {"take_dirty", (PyCFunction)(void (*)(void))UserTable_take_dirty,
     METH_VARARGS | METH_KEYWORDS,
     "take_dirty(states=False) -> [person]: the persons counted since the last call while "
     "tracking (each once; some may be gone since); states=True: [(person, state before "
     "their first change since then, as person() gave it, or None for a new person)]."},
    {"changelog", (PyCFunction)ul_changelog, METH_VARARGS,
     "changelog(extra, mac_key, context_hash, digest_key) -> ([(person, value or None)], "
     "delta): the changelog records (agents.ingest.user_records: the state's bytes, tagged "
     "under mac_key unless it is None) of every person counted since the last take and of "
     "`extra` (persons a caller changed), in hash order, each once, None for a person gone; "
     "delta: the table digest's change over the persons counted (agents.ingest.user_digest: "
     "their new terms less their terms as last written), 32 bytes little endian, mod 2^256 "
     "(meaningless for persons in `extra` that were not counted: the caller sums the whole "
     "table then). Takes the persons as take_dirty does."},
    {"digest_sum", (PyCFunction)ul_digest_sum, METH_O,
     "digest_sum(digest_key) -> 32 bytes: the table digest's sum over every person "
     "(agents.ingest.user_digest.TableDigest.load), little endian, mod 2^256."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef UserTable_getset[] = {
    {"nbytes", (getter)UserTable_nbytes, NULL, "bytes the table holds (its slots)", NULL},
    {"tracking", (getter)UserTable_get_tracking, (setter)UserTable_set_tracking,
     "collect the persons counted for take_dirty (the changelog form)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods UserTable_as_sequence = {.sq_length = (lenfunc)UserTable_len};

PyDoc_STRVAR(UserTable_doc,
"UserTable(max_events, period_ticks, min_separation_ticks): the compact per-person table\n"
"(32 bytes a person) deciding as stream_dp.user_level.Bounder does without leaf bounds.");

static PyTypeObject UserTableType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "agents.ingest._fastingest.UserTable",
    .tp_basicsize = sizeof(UserTable),
    .tp_dealloc = (destructor)UserTable_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = UserTable_doc,
    .tp_methods = UserTable_methods,
    .tp_getset = UserTable_getset,
    .tp_as_sequence = &UserTable_as_sequence,
    .tp_init = (initproc)UserTable_init,
    .tp_new = PyType_GenericNew,
};

int usertable_add_type(PyObject *module) {
    if (PyType_Ready(&UserTableType) < 0) return -1;
    Py_INCREF(&UserTableType);
    if (PyModule_AddObject(module, "UserTable", (PyObject *)&UserTableType) < 0) {
        Py_DECREF(&UserTableType);
        return -1;
    }
    return 0;
}

int ut_check(PyObject *o) { return Py_IS_TYPE(o, &UserTableType); }
