/* The compact per-person table of privacy_unit = "user" (agents/ingest/csrc/usertable.c). */
#ifndef STREAM_DP_USERTABLE_H
#define STREAM_DP_USERTABLE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* One person: 32 bytes. `count[i] == 0` means "no period i"; period 0 is the one inserted first
 * (the order agents.ingest.users exports in). Empty slot: last_tick == 0 and no period. */
typedef struct {
    unsigned char h[16];  /* the keyed hash (BLAKE2b-128 of the identifier) */
    uint32_t last_tick;   /* the largest counted tick (< 2^31; 0 = none) | UT_DIRTY */
    uint32_t period[2];
    uint16_t count[2];
} UTSlot;

/* last_tick's top bit: the person changed since the last take_dirty (changelog form) */
#define UT_DIRTY 0x80000000u
#define UT_TICK(s) ((s)->last_tick & ~UT_DIRTY)

typedef struct {
    PyObject_HEAD
    UTSlot *slots;
    size_t cap;  /* slots allocated (any size: index = h0 * cap >> 64) */
    size_t n;    /* persons held */
    uint32_t max_events, period_ticks, sep;
    int tracking;            /* collect the persons counted (UserState.changelog) */
    unsigned char *dirty;    /* their hashes, 16 bytes each, each once until taken */
    UTSlot *dirty_was;       /* each one's slot before its first change since then (the
                                table digest takes that record's term out); empty: new */
    size_t ndirty, dirty_cap;
} UserTable;

static inline uint64_t ut_h0(const unsigned char *h) {
    uint64_t v;
    memcpy(&v, h, 8);
    return v;
}

/* A person's home slot (the hash is uniform: its first 8 bytes scaled to the capacity). */
static inline size_t ut_home(const unsigned char *h, size_t cap) {
    return (size_t)(((unsigned __int128)ut_h0(h) * cap) >> 64);
}

/* Start fetching the home slot of ``h`` (a hint: the table may grow before it is used). */
static inline void ut_prefetch(const UserTable *t, const unsigned char *h) {
    __builtin_prefetch(&t->slots[ut_home(h, t->cap)]);
}

/* The person's next event at `tick` (>= 1): 1 counted (recorded; with `tracking`, the person
 * listed for the next take_dirty), 0 dropped, -1 the table cannot represent it (a third open
 * period, a tick beyond 2^31 - 1; nothing changed), -2 out of memory (a Python error is set). */
int ut_admit(UserTable *t, const unsigned char h[16], long long tick);

static inline int ut_empty(const UTSlot *s) { return s->last_tick == 0 && s->count[0] == 0; }

/* The slot holding `h`, or NULL. */
UTSlot *ut_find(const UserTable *t, const unsigned char h[16]);

/* Forget the persons listed since the last take (their marks and the list). */
void ut_clear_dirty(UserTable *t);

int usertable_add_type(PyObject *module);
/* whether `o` is a UserTable */
int ut_check(PyObject *o);

#endif
