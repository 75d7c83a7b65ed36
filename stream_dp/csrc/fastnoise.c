/* stream_dp._fastnoise: the vectorised common path of the exact samplers and of blt's buffer
 * update, one pass per array in C (issue #35). Pure functions of their inputs; the Python code
 * in stream_dp/noise/laplace.py, gaussian.py and stream_dp/strategies/blt/mechanism.py is
 * authoritative and computes the same results (tests/unit/test_fastnoise.py).
 *
 * Exactness: the samplers' float comparisons only decide outside a relative margin of the true
 * threshold (see laplace.py / gaussian.py); anything closer is returned as "exact" and settled
 * in Python with rational arithmetic. So exp() here may differ from NumPy's by an ulp without
 * changing a sample. The double-double update repeats _dd.mul and _dd.add operation by
 * operation; it is compiled with -ffp-contract=off -fno-fast-math (setup.py), so each operation
 * is one IEEE binary64 rounding, exactly as NumPy's ufuncs do it.
 *
 * Arrays are passed as buffers (NumPy arrays, C-contiguous); no NumPy headers are needed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

/* status codes of one attempt (laplace_attempt, gaussian_accept) */
#define ST_REJECT 0 /* start over */
#define ST_ACCEPT 1 /* values[i] is the sample */
#define ST_EXACT 2  /* undecided: settle in Python (laplace: the D test) */
#define ST_EXACT_V 3 /* laplace: D accepted, V undecided: settle in Python */

#define TAB_BITS 14

static int check_len(Py_buffer *b, Py_ssize_t want, const char *what) {
    if (b->len != want) {
        PyErr_Format(PyExc_ValueError, "%s has %zd bytes, expected %zd", what, b->len, want);
        return -1;
    }
    return 0;
}

/* laplace_attempt(words, tp, neg_inv_t, j, margin, table, thresh, exp_digits, status, values)
 * words: n blocks (w0, w1) uint64; table: 2**14 int64; thresh: m ascending int64;
 * exp_digits: 3×1024 float64, exp(−x·2^(10k)/t) for the 10-bit digits x of U (k = 0, 1, 2),
 * or empty (then exp(U·neg_inv_t)); both within a relative 2^-49 of exp(−U/t), far inside the
 * margin (stream_dp/noise/laplace.py);
 * status: n uint8 (out); values: n int64 (out, meaningful where status == ST_ACCEPT). */
static PyObject *laplace_attempt(PyObject *self, PyObject *args) {
    Py_buffer words, table, thresh, edig, status, values;
    unsigned long long tp;
    double neg_inv_t, margin;
    int j;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*Kdidy*y*y*w*w*", &words, &tp, &neg_inv_t, &j, &margin, &table,
                          &thresh, &edig, &status, &values))
        return NULL;
    PyObject *ret = NULL;
    Py_ssize_t n = status.len;
    if (check_len(&words, 16 * n, "words") || check_len(&values, 8 * n, "values") ||
        check_len(&table, 8 * ((Py_ssize_t)1 << TAB_BITS), "table") || thresh.len % 8 ||
        tp == 0 || j < 0 || j > 63 || (edig.len != 0 && edig.len != 8 * 3 * 1024) ||
        (edig.len != 0 && tp > ((unsigned long long)1 << 30))) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bad laplace_attempt arguments");
        goto done;
    }
    {
        const uint64_t *w = (const uint64_t *)words.buf;
        const int64_t *tab = (const int64_t *)table.buf;
        const int64_t *thr = (const int64_t *)thresh.buf;
        const double *ed = edig.len ? (const double *)edig.buf : NULL;
        Py_ssize_t m = thresh.len / 8;
        uint8_t *st = (uint8_t *)status.buf;
        int64_t *val = (int64_t *)values.buf;
        const uint64_t t64 = (uint64_t)tp;
        const int pow2 = (t64 & (t64 - 1)) == 0;
        /* 2**64 mod tp; w0 is usable iff w0 < 2**64 − r (all w0 when r = 0) */
        const uint64_t r = (UINT64_MAX % t64 + 1) % t64;
        const uint64_t limit = (uint64_t)0 - r;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            uint64_t w0 = w[2 * i], w1 = w[2 * i + 1];
            uint64_t u;
            if (pow2) {
                u = w0 & (t64 - 1);
            } else {
                if (r != 0 && w0 >= limit) {
                    st[i] = ST_REJECT;
                    continue;
                }
                u = w0 % t64;
            }
            double p31;
            if (ed) {
                p31 = ed[u & 1023] * ed[1024 + ((u >> 10) & 1023)];
                p31 *= ed[2048 + (u >> 20)];
            } else {
                p31 = exp((double)u * neg_inv_t);
            }
            p31 *= 2147483648.0;
            double diff = p31 - (double)(w1 >> 33);
            p31 *= margin;
            int acc_d = diff >= p31 + 1.0;
            int rej_d = diff <= -p31;
            if (rej_d) {
                st[i] = ST_REJECT;
                continue;
            }
            if (!acc_d) {
                st[i] = ST_EXACT;
                continue;
            }
            int64_t v = tab[(w1 >> (33 - TAB_BITS)) & (((uint64_t)1 << TAB_BITS) - 1)];
            if (v < 0) {
                int64_t ww = (int64_t)((w1 >> 1) & 0xFFFFFFFFu);
                /* pos = #{thresholds <= ww} (searchsorted, side="right") */
                Py_ssize_t lo = 0, hi = m;
                while (lo < hi) {
                    Py_ssize_t mid = lo + (hi - lo) / 2;
                    if (thr[mid] <= ww) lo = mid + 1; else hi = mid;
                }
                if (ww == 0 || (lo > 0 && thr[lo - 1] == ww)) {
                    st[i] = ST_EXACT_V;
                    continue;
                }
                v = (int64_t)(m - lo);
            }
            uint64_t y = (uint64_t)v * t64 + u;
            if (j) y >>= j;
            if (w1 & 1) {
                if (y == 0) {
                    st[i] = ST_REJECT;
                    continue;
                }
                y = (uint64_t)0 - y;
            }
            val[i] = (int64_t)y;
            st[i] = ST_ACCEPT;
        }
        Py_END_ALLOW_THREADS
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    PyBuffer_Release(&words);
    PyBuffer_Release(&table);
    PyBuffer_Release(&thresh);
    PyBuffer_Release(&edig);
    PyBuffer_Release(&status);
    PyBuffer_Release(&values);
    return ret;
}

/* gaussian_accept(words, y, q, two_s2, margin2, tiny, status)
 * The acceptance test of CKS Alg. 3 (stream_dp/noise/gaussian.py): status ST_ACCEPT/ST_REJECT,
 * or ST_EXACT (|y| ≥ 2**52 or too close to call). */
static PyObject *gaussian_accept(PyObject *self, PyObject *args) {
    Py_buffer words, ys, status;
    double q, two_s2, margin2, tiny;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*ddddw*", &words, &ys, &q, &two_s2, &margin2, &tiny,
                          &status))
        return NULL;
    PyObject *ret = NULL;
    Py_ssize_t n = status.len;
    if (check_len(&words, 16 * n, "words") || check_len(&ys, 8 * n, "y")) goto done;
    {
        const uint64_t *w = (const uint64_t *)words.buf;
        const int64_t *y = (const int64_t *)ys.buf;
        uint8_t *st = (uint8_t *)status.buf;
        const double two53 = 1.0 / 9007199254740992.0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            double a = (double)(w[2 * i] >> 11);
            a *= two53;
            /* |y| with NumPy's wrap-around for the (impossible) minimum */
            int64_t ay = (int64_t)(y[i] < 0 ? (uint64_t)0 - (uint64_t)y[i] : (uint64_t)y[i]);
            if (ay >= ((int64_t)1 << 52)) {
                st[i] = ST_EXACT;
                continue;
            }
            double g = (double)ay;
            g -= q;
            g *= g;
            g /= two_s2;
            double p = exp(-g);
            g += 1.0;
            g *= margin2;
            g *= p;
            g += tiny;
            if (a + two53 <= p - g) st[i] = ST_ACCEPT;
            else if (a >= p + g) st[i] = ST_REJECT;
            else st[i] = ST_EXACT;
        }
        Py_END_ALLOW_THREADS
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    PyBuffer_Release(&words);
    PyBuffer_Release(&ys);
    PyBuffer_Release(&status);
    return ret;
}

/* dd_update(buffers, buffers_lo, theta, clipped): s_i ← θ_i·s_i + clipped in double-double,
 * in place, exactly as stream_dp.strategies._dd.mul then _dd.add (b_lo = 0.0). buffers and
 * buffers_lo: k×n float64; theta: k float64; clipped: n float64. */
static PyObject *dd_update(PyObject *self, PyObject *args) {
    Py_buffer hib, lob, thb, cb;
    (void)self;
    if (!PyArg_ParseTuple(args, "w*w*y*y*", &hib, &lob, &thb, &cb)) return NULL;
    PyObject *ret = NULL;
    Py_ssize_t n = cb.len / 8, k = thb.len / 8;
    if (cb.len % 8 || thb.len % 8 || check_len(&hib, 8 * n * k, "buffers") ||
        check_len(&lob, 8 * n * k, "buffers_lo")) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bad dd_update arguments");
        goto done;
    }
    {
        double *H = (double *)hib.buf, *L = (double *)lob.buf;
        const double *th = (const double *)thb.buf, *c = (const double *)cb.buf;
        const double splitter = 134217729.0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t r = 0; r < k; r++) {
            const double b = th[r];
            const double bc = splitter * b;
            const double b_hi = bc - (bc - b);
            const double b_lo = b - b_hi;
            double *h = H + r * n, *l = L + r * n;
            for (Py_ssize_t i = 0; i < n; i++) {
                const double a = h[i], lo = l[i];
                /* _dd.mul(hi, lo, b) */
                double p = a * b;
                double ac = splitter * a;
                double a_hi = ac - (ac - a);
                double a_lo = a - a_hi;
                double e = ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo;
                e = e + lo * b;
                double s = p + e;
                double e2 = e - (s - p);
                /* _dd.add(s, e2, clipped, 0.0) */
                double x = c[i];
                double s2 = s + x;
                double bb = s2 - s;
                double e3 = (s - (s2 - bb)) + (x - bb);
                e3 = e3 + (e2 + 0.0);
                double out = s2 + e3;
                h[i] = out;
                l[i] = e3 - (out - s2);
            }
        }
        Py_END_ALLOW_THREADS
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    PyBuffer_Release(&hib);
    PyBuffer_Release(&lob);
    PyBuffer_Release(&thb);
    PyBuffer_Release(&cb);
    return ret;
}

/* dd_feedback(buffers, w, out): out = w_0·s_0 + w_1·s_1 + … left to right (blt's feedback). */
static PyObject *dd_feedback(PyObject *self, PyObject *args) {
    Py_buffer hib, wb, ob;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*w*", &hib, &wb, &ob)) return NULL;
    PyObject *ret = NULL;
    Py_ssize_t n = ob.len / 8, k = wb.len / 8;
    if (ob.len % 8 || wb.len % 8 || k < 1 || check_len(&hib, 8 * n * k, "buffers")) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bad dd_feedback arguments");
        goto done;
    }
    {
        const double *H = (const double *)hib.buf, *wt = (const double *)wb.buf;
        double *o = (double *)ob.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) o[i] = wt[0] * H[i];
        for (Py_ssize_t r = 1; r < k; r++) {
            const double wr = wt[r];
            const double *h = H + r * n;
            for (Py_ssize_t i = 0; i < n; i++) o[i] = o[i] + wr * h[i];
        }
        Py_END_ALLOW_THREADS
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    PyBuffer_Release(&hib);
    PyBuffer_Release(&wb);
    PyBuffer_Release(&ob);
    return ret;
}

/* prf_input(ids, node_hi, counters, blocks) -> max counter: the AES input blocks
 * (id, node_hi | counter) of stream_dp.noise.prf.BlockPRF.blocks, in one pass; ids, counters:
 * n uint64; blocks: 2n uint64 (out). */
static PyObject *prf_input(PyObject *self, PyObject *args) {
    Py_buffer idb, cb, ob;
    unsigned long long node_hi;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*Ky*w*", &idb, &node_hi, &cb, &ob)) return NULL;
    PyObject *ret = NULL;
    Py_ssize_t n = idb.len / 8;
    if (idb.len % 8 || check_len(&cb, 8 * n, "counters") || ob.len < 16 * n) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bad prf_input arguments");
        goto done;
    }
    {
        const uint64_t *id = (const uint64_t *)idb.buf, *c = (const uint64_t *)cb.buf;
        uint64_t *o = (uint64_t *)ob.buf;
        const uint64_t hi = (uint64_t)node_hi;
        uint64_t mx = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            uint64_t ci = c[i];
            mx = ci > mx ? ci : mx;
            o[2 * i] = id[i];
            o[2 * i + 1] = hi | ci;
        }
        Py_END_ALLOW_THREADS
        ret = PyLong_FromUnsignedLongLong(mx);
    }
done:
    PyBuffer_Release(&idb);
    PyBuffer_Release(&cb);
    PyBuffer_Release(&ob);
    return ret;
}

static PyMethodDef methods[] = {
    {"prf_input", prf_input, METH_VARARGS,
     "The AES input blocks (id, node << 16 | counter) and the largest counter."},
    {"laplace_attempt", laplace_attempt, METH_VARARGS,
     "One discrete Laplace attempt per block (stream_dp.noise.laplace)."},
    {"gaussian_accept", gaussian_accept, METH_VARARGS,
     "The discrete Gaussian acceptance test per block (stream_dp.noise.gaussian)."},
    {"dd_update", dd_update, METH_VARARGS, "blt's double-double buffer update, in place."},
    {"dd_feedback", dd_feedback, METH_VARARGS, "blt's feedback sum over the buffers."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "stream_dp._fastnoise",
    "Compiled common path of the exact samplers and blt's buffers (optional; see setup.py).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastnoise(void) { return PyModule_Create(&module); }
