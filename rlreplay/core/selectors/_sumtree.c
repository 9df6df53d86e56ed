/*
 * Compiled loops for rlreplay.core.selectors.sum_tree.KaryTree (16-ary float64 trees).
 *
 * The tree is passed as its list of levels: levels[0] holds the leaves padded to a
 * multiple of 16, each level above holds ceil(n / 16) nodes padded to a multiple of 16,
 * and the root is levels[-1][0]. Every array is a C-contiguous float64 buffer.
 *
 * find_prefix(levels, targets, out)  descends a sum tree once per target.
 * set_sum(levels, idx, values)        writes leaves, recomputes ancestors as sums.
 * set_min(levels, idx, values)        writes leaves, recomputes ancestors as the smallest
 *                                     positive child (inf when none is).
 * LeafWriter(levels[, min_levels]).set_many(idx, priorities, exponent): set_sum of
 *                                     priorities ** exponent, on trees held once.
 * With values None, the leaves are left as they are (a min tree over a sum tree's leaves,
 * which set_sum has just written) and only the ancestors are recomputed. set_sum also
 * takes min_levels, such a min tree, and recomputes it in the same pass.
 *
 * Parents are recomputed from their 16 children (never adjusted by deltas), so the
 * trees do not drift; near the root, where a batch shares few parents, each is recomputed
 * once. The GIL is released around the loops; the caller holds the lock
 * that protects the tree. Bad buffers raise TypeError (wrong kind) or ValueError (wrong
 * size) before anything is written.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define FANOUT 16
#define MAX_LEVELS 64
/* Blocks are fetched this many items ahead: the batch is walked one level at a time so
 * that the cache misses of different items overlap instead of queueing. */
#define AHEAD 8

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch((p))
#else
#define PREFETCH(p) ((void)(p))
#endif

/* A 16-node block is 128 bytes: up to three cache lines when not 64-byte aligned. */
static inline void
prefetch_block(const double *c)
{
    PREFETCH(c);
    PREFETCH(c + 8);
    PREFETCH(c + 15);
}

typedef struct {
    Py_buffer views[MAX_LEVELS];
    double *data[MAX_LEVELS];
    Py_ssize_t len[MAX_LEVELS];
    int count;
} Levels;

static void
levels_release(Levels *lv)
{
    for (int i = 0; i < lv->count; i++) {
        PyBuffer_Release(&lv->views[i]);
    }
    lv->count = 0;
}

/* Format of a float64 buffer: "d", optionally with a native/little-endian prefix. */
static int
format_is(const char *fmt, char code)
{
    if (fmt == NULL) {
        return 0;
    }
    if (fmt[0] == '@' || fmt[0] == '=' || fmt[0] == '<') {
        fmt++;
    }
    return fmt[0] == code && fmt[1] == '\0';
}

static int
get_buffer(PyObject *obj, Py_buffer *view, int writable, char code, const char *what)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a %sC-contiguous buffer", what,
                     writable ? "writable " : "");
        return -1;
    }
    int ok = (code == 'd') ? (format_is(view->format, 'd') && view->itemsize == 8)
                           : ((format_is(view->format, 'q') || format_is(view->format, 'l')) &&
                              view->itemsize == 8);
    if (!ok || view->ndim > 1) {
        PyErr_Format(PyExc_TypeError, "%s must be a one-dimensional %s buffer (got format %s)",
                     what, code == 'd' ? "float64" : "int64",
                     view->format ? view->format : "B");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Acquire every level (writable) and check the sizes follow the KaryTree layout. */
static int
levels_acquire(PyObject *seq, Levels *lv)
{
    lv->count = 0;
    if (!PyList_Check(seq) && !PyTuple_Check(seq)) {
        PyErr_SetString(PyExc_TypeError, "levels must be a list of float64 arrays");
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > MAX_LEVELS) {
        PyErr_Format(PyExc_ValueError, "levels must hold 1 to %d arrays (got %zd)", MAX_LEVELS,
                     n);
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (get_buffer(items[i], &lv->views[i], 1, 'd', "each level") < 0) {
            levels_release(lv);
            return -1;
        }
        lv->count++;
        lv->data[i] = (double *)lv->views[i].buf;
        lv->len[i] = lv->views[i].len / 8;
        Py_ssize_t len = lv->len[i];
        if (len < FANOUT || len % FANOUT != 0) {
            PyErr_Format(PyExc_ValueError,
                         "level %zd has %zd nodes; every level must be a positive multiple of %d",
                         i, len, FANOUT);
            levels_release(lv);
            return -1;
        }
        if (i > 0) {
            Py_ssize_t need = lv->len[i - 1] / FANOUT;
            if (len < need || len - need >= FANOUT) {
                PyErr_Format(PyExc_ValueError,
                             "level %zd has %zd nodes but level %zd needs ceil(%zd / %d) "
                             "padded to a multiple of %d",
                             i, len, i - 1, lv->len[i - 1], FANOUT, FANOUT);
                levels_release(lv);
                return -1;
            }
        }
    }
    if (lv->len[n - 1] != FANOUT) {
        PyErr_Format(PyExc_ValueError, "the top level must have %d nodes (got %zd)", FANOUT,
                     lv->len[n - 1]);
        levels_release(lv);
        return -1;
    }
    return 0;
}

/* The child of a 16-node block holding target *u; *u becomes the remainder within that
 * child. Child j is the one whose cumulative range [prefix_j, prefix_j+1) holds the target,
 * found by counting the prefix sums at or below it: no data-dependent branch, so the
 * descents of a batch overlap in the pipeline. A child of weight 0 leaves the prefix as it
 * was, so it is counted past and never picked. Rounding can leave the target at or past
 * the block's total: then the last positive child is picked (rare). */
static inline Py_ssize_t
pick_child(const double *c, double *u)
{
    /* Prefix sums in four groups of four (short dependency chains): within group a,
     * q[4a + b] = c[4a] + ... + c[4a + b]; group a starts at g[a]. They never decrease, and
     * a child of weight 0 leaves the prefix exactly as it was. */
    double x = *u, q[FANOUT], g[FANOUT / 4], before = 0.0;
    for (int a = 0; a < FANOUT / 4; a++) {
        const double *w = c + 4 * a;
        q[4 * a] = w[0];
        q[4 * a + 1] = q[4 * a] + w[1];
        q[4 * a + 2] = q[4 * a + 1] + w[2];
        q[4 * a + 3] = q[4 * a + 2] + w[3];
    }
    g[0] = 0.0;
    for (int a = 1; a < FANOUT / 4; a++) {
        g[a] = g[a - 1] + q[4 * a - 1];
    }
    int j = 0;
    for (int k = 0; k < FANOUT; k++) {
        double p = g[k / 4] + q[k];
        int le = p <= x;
        j += le;
        before = le ? p : before;
    }
    if (j == FANOUT) {
        j = FANOUT - 1;
        while (j > 0 && !(c[j] > 0.0)) {
            j--;
        }
        before = 0.0;
        for (int k = 0; k < j; k++) {
            before += c[k];
        }
    }
    double r = x - before;
    *u = r > 0.0 ? r : 0.0;
    return j;
}

static PyObject *
find_prefix(PyObject *self, PyObject *args)
{
    PyObject *levels_obj, *targets_obj, *out_obj;
    if (!PyArg_ParseTuple(args, "OOO:find_prefix", &levels_obj, &targets_obj, &out_obj)) {
        return NULL;
    }
    Levels lv;
    Py_buffer tv, ov;
    if (levels_acquire(levels_obj, &lv) < 0) {
        return NULL;
    }
    if (get_buffer(targets_obj, &tv, 0, 'd', "targets") < 0) {
        levels_release(&lv);
        return NULL;
    }
    if (get_buffer(out_obj, &ov, 1, 'q', "out") < 0) {
        PyBuffer_Release(&tv);
        levels_release(&lv);
        return NULL;
    }
    Py_ssize_t n = tv.len / 8;
    if (ov.len / 8 != n) {
        PyErr_Format(PyExc_ValueError, "out has %zd items but targets has %zd", ov.len / 8, n);
        goto fail;
    }
    const double *t = (const double *)tv.buf;
    int64_t *o = (int64_t *)ov.buf;
    int top = lv.count - 1;
    int empty = 0, nomem = 0;
    double *u = (double *)PyMem_RawMalloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    Py_BEGIN_ALLOW_THREADS
    if (u == NULL) {
        nomem = 1;
    }
    else if (!(lv.data[top][0] > 0.0)) {
        empty = 1;
    }
    else {
        for (Py_ssize_t i = 0; i < n; i++) {
            u[i] = t[i] >= 0.0 ? t[i] : 0.0; /* NaN and negatives start at 0 */
            o[i] = 0;
        }
        for (int l = top - 1; l >= 0; l--) {
            const double *level = lv.data[l];
            for (Py_ssize_t i = 0; i < n; i++) {
                if (i + AHEAD < n) {
                    prefetch_block(level + o[i + AHEAD] * FANOUT);
                }
                Py_ssize_t idx = (Py_ssize_t)o[i];
                o[i] = (int64_t)(idx * FANOUT + pick_child(level + idx * FANOUT, &u[i]));
            }
        }
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(u);
    if (nomem) {
        PyErr_NoMemory();
        goto fail;
    }
    if (empty) {
        PyErr_SetString(PyExc_ValueError, "find_prefix needs a tree with a positive total");
        goto fail;
    }
    PyBuffer_Release(&ov);
    PyBuffer_Release(&tv);
    levels_release(&lv);
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&ov);
    PyBuffer_Release(&tv);
    levels_release(&lv);
    return NULL;
}

static inline double
reduce16(const double *c, int is_sum)
{
    if (is_sum) {
        /* In numpy's order for 16 values (eight running sums, then pairwise), so the
         * compiled and numpy paths agree. */
        double r0 = c[0] + c[8], r1 = c[1] + c[9], r2 = c[2] + c[10], r3 = c[3] + c[11];
        double r4 = c[4] + c[12], r5 = c[5] + c[13], r6 = c[6] + c[14], r7 = c[7] + c[15];
        return ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7));
    }
    /* The smallest positive child (weight-0 leaves do not count), inf when none is. */
#if defined(__SSE2__)
    /* Two lanes at a time: children that are not positive (or NaN) become inf, then
     * minima (exact in any order). */
    const __m128d zero = _mm_setzero_pd(), inf = _mm_set1_pd(INFINITY);
    __m128d m = inf;
    for (int k = 0; k < FANOUT; k += 2) {
        __m128d x = _mm_loadu_pd(c + k);
        __m128d positive = _mm_cmpgt_pd(x, zero);
        m = _mm_min_pd(m, _mm_or_pd(_mm_and_pd(positive, x), _mm_andnot_pd(positive, inf)));
    }
    m = _mm_min_sd(m, _mm_unpackhi_pd(m, m));
    return _mm_cvtsd_f64(m);
#else
    double m = INFINITY;
    for (int k = 0; k < FANOUT; k++) {
        m = (c[k] > 0.0 && c[k] < m) ? c[k] : m;
    }
    return m;
#endif
}

/* Levels small enough that the parents of a batch are made distinct before they are
 * recomputed (a bitmap of this many bits on the stack, and of at most a bit per 64
 * leaves of the batch, so that clearing it costs less than the batch): near the root most
 * of a batch shares a few parents, and recomputing each once saves most of the work. */
#define DISTINCT_NODES 65536

/* Recompute, level by level, the ancestors of the leaves p[0..n) (already written) in the
 * sum or min tree lv and, when mv->count, in the min tree mv over the same leaves. p is
 * overwritten (with the parents of each level). Runs without the GIL. */
static void
recompute_ancestors(const Levels *lv, const Levels *mv, Py_ssize_t *p, Py_ssize_t n,
                    int is_sum)
{
    uint64_t seen[DISTINCT_NODES / 64];
    int seen_clear = 0;
    for (int l = 1; l < lv->count; l++) {
        if (lv->len[l] <= DISTINCT_NODES && lv->len[l] <= 64 * n) {
            if (!seen_clear) { /* the largest such level comes first; bits are cleared
                                * after each level, so once is enough */
                memset(seen, 0, (size_t)((lv->len[l] + 63) / 64) * sizeof(uint64_t));
                seen_clear = 1;
            }
            Py_ssize_t m = 0;
            for (Py_ssize_t i = 0; i < n; i++) {
                Py_ssize_t q = p[i] / FANOUT;
                uint64_t bit = (uint64_t)1 << (q & 63);
                if (!(seen[q >> 6] & bit)) {
                    seen[q >> 6] |= bit;
                    p[m++] = q;
                }
            }
            for (Py_ssize_t i = 0; i < m; i++) {
                seen[p[i] >> 6] = 0;
            }
            n = m;
        }
        else {
            for (Py_ssize_t i = 0; i < n; i++) {
                p[i] /= FANOUT; /* a parent shared by several leaves is recomputed more than
                                 * once, with the same result */
            }
        }
        const double *lower = lv->data[l - 1];
        double *upper = lv->data[l];
        /* With a min tree, its node is recomputed in the same pass, so the cache misses on
         * both trees overlap. */
        const double *min_lower = mv->count ? mv->data[l - 1] : NULL;
        double *min_upper = mv->count ? mv->data[l] : NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (i + AHEAD < n) {
                Py_ssize_t q = p[i + AHEAD];
                prefetch_block(lower + q * FANOUT);
                PREFETCH(upper + q);
                if (min_upper != NULL) {
                    prefetch_block(min_lower + q * FANOUT);
                    PREFETCH(min_upper + q);
                }
            }
            Py_ssize_t q = p[i];
            upper[q] = reduce16(lower + q * FANOUT, is_sum);
            if (min_upper != NULL) {
                min_upper[q] = reduce16(min_lower + q * FANOUT, 0);
            }
        }
    }
}

/* Write leaves idx[0..n) (val[i], or left as they are when val is NULL; duplicates: the
 * last wins; val_step 0: val[0] for every leaf), then recompute their ancestors (see
 * recompute_ancestors). The indexes must be checked already; with exponent other than 1,
 * each value written is val ** exponent. Returns -1 (MemoryError set) when the scratch
 * cannot be allocated, before anything is written. Called with the GIL, released around
 * the loops of batches larger than SMALL_BATCH (smaller ones take less time than the
 * release and its scratch). */
#define SMALL_BATCH 64
static int
write_many(const Levels *lv, const Levels *mv, const int64_t *idx, const double *val,
           Py_ssize_t val_step, Py_ssize_t n, int is_sum, double exponent)
{
    Py_ssize_t small[SMALL_BATCH];
    Py_ssize_t *p = small;
    if (n > SMALL_BATCH) {
        p = (Py_ssize_t *)PyMem_RawMalloc((size_t)n * sizeof(Py_ssize_t));
        if (p == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    PyThreadState *released = n > SMALL_BATCH ? PyEval_SaveThread() : NULL;
    double *leaf = lv->data[0];
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + AHEAD < n) {
            prefetch_block(leaf + (idx[i + AHEAD] / FANOUT) * FANOUT);
        }
        if (val != NULL) {
            double v = val[i * val_step];
            leaf[idx[i]] = exponent == 1.0 ? v : pow(v, exponent);
        }
        p[i] = (Py_ssize_t)idx[i];
    }
    recompute_ancestors(lv, mv, p, n, is_sum);
    if (released != NULL) {
        PyEval_RestoreThread(released);
        PyMem_RawFree(p);
    }
    return 0;
}

/* 0 if every idx[i] is a leaf of a tree with `leaves` leaves, else -1 with ValueError. */
static int
check_indexes(const int64_t *idx, Py_ssize_t n, Py_ssize_t leaves, const char *name)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (idx[i] < 0 || idx[i] >= leaves) {
            PyErr_Format(PyExc_ValueError, "%s: idx[%zd]=%lld is outside [0, %zd)", name, i,
                         (long long)idx[i], leaves);
            return -1;
        }
    }
    return 0;
}

/* Every buffer set_leaves holds starts as not held (a view's obj NULL, a tree's count 0)
 * and is released once, at its one exit, whatever path led there: an error found after
 * some buffers were acquired cannot leave a reference behind. */
static PyObject *
set_leaves(PyObject *args, int is_sum, const char *name)
{
    PyObject *levels_obj, *idx_obj, *val_obj, *mins_obj = Py_None;
    if (!PyArg_ParseTuple(args, "OOO|O", &levels_obj, &idx_obj, &val_obj, &mins_obj)) {
        return NULL;
    }
    Levels lv, mv;
    lv.count = 0;
    mv.count = 0;
    Py_buffer iv = {0}, vv = {0};
    PyObject *result = NULL;
    int has_values = val_obj != Py_None;
    if (levels_acquire(levels_obj, &lv) < 0) {
        goto done;
    }
    if (mins_obj != Py_None) {
        if (!is_sum) {
            PyErr_SetString(PyExc_TypeError, "only set_sum takes min_levels");
            goto done;
        }
        if (levels_acquire(mins_obj, &mv) < 0) {
            goto done;
        }
        if (mv.count != lv.count || mv.data[0] != lv.data[0]) {
            PyErr_SetString(PyExc_ValueError,
                            "min_levels must be a tree of as many levels over the same leaves");
            goto done;
        }
    }
    if (get_buffer(idx_obj, &iv, 0, 'q', "idx") < 0) {
        goto done;
    }
    if (!has_values) { /* the leaves are written already: an empty stand-in buffer */
        if (PyObject_GetBuffer(idx_obj, &vv, PyBUF_SIMPLE) < 0) {
            goto done;
        }
    }
    else if (get_buffer(val_obj, &vv, 0, 'd', "values") < 0) {
        goto done;
    }
    Py_ssize_t n = iv.len / 8;
    const int64_t *idx = (const int64_t *)iv.buf;
    const double *val = (const double *)vv.buf;
    if (has_values && vv.len / 8 != n) {
        PyErr_Format(PyExc_ValueError, "%s: values has %zd items but idx has %zd", name,
                     vv.len / 8, n);
        goto done;
    }
    if (check_indexes(idx, n, lv.len[0], name) < 0 ||
        write_many(&lv, &mv, idx, has_values ? val : NULL, 1, n, is_sum, 1.0) < 0) {
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&vv); /* a view never acquired has obj NULL: nothing to release */
    PyBuffer_Release(&iv);
    levels_release(&mv);
    levels_release(&lv);
    return result;
}

static PyObject *
set_sum(PyObject *self, PyObject *args)
{
    return set_leaves(args, 1, "set_sum");
}

static PyObject *
set_min(PyObject *self, PyObject *args)
{
    return set_leaves(args, 0, "set_min");
}

/* Acquire a min tree's levels over the leaves of lv (nothing acquired for None). */
static int
mins_acquire(PyObject *mins_obj, const Levels *lv, Levels *mv)
{
    mv->count = 0;
    if (mins_obj == Py_None) {
        return 0;
    }
    if (levels_acquire(mins_obj, mv) < 0) {
        return -1;
    }
    if (mv->data[0] != lv->data[0]) {
        PyErr_SetString(PyExc_ValueError, "min_levels must be a tree over the same leaves");
        levels_release(mv);
        return -1;
    }
    return 0;
}

/* LeafWriter(levels, min_levels=None): a sum tree (and a min tree over its leaves) held
 * for a prioritized selector's writes; the levels are acquired once, checked as set_sum
 * checks them, and kept (so they cannot be resized) until the writer is freed. */
typedef struct {
    PyObject_HEAD
    Levels sums;
    Levels mins;
} LeafWriter;

static void
LeafWriter_dealloc(LeafWriter *self)
{
    levels_release(&self->mins);
    levels_release(&self->sums);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
LeafWriter_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"levels", "min_levels", NULL};
    PyObject *levels_obj, *mins_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O:LeafWriter", kwlist, &levels_obj,
                                     &mins_obj)) {
        return NULL;
    }
    LeafWriter *self = (LeafWriter *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->sums.count = 0;
    self->mins.count = 0;
    if (levels_acquire(levels_obj, &self->sums) < 0 ||
        mins_acquire(mins_obj, &self->sums, &self->mins) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* set_many(idx, priorities, exponent): set_sum (with the min tree) of priorities **
 * exponent for int64 leaf indexes and float64 priorities given as buffers, on the held
 * trees. */
static PyObject *
LeafWriter_set_many(LeafWriter *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError,
                     "set_many takes (idx, priorities, exponent) (%zd arguments given)", nargs);
        return NULL;
    }
    double exponent = PyFloat_AsDouble(args[2]);
    if (exponent == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    Py_buffer iv, vv;
    if (get_buffer(args[0], &iv, 0, 'q', "idx") < 0) {
        return NULL;
    }
    if (get_buffer(args[1], &vv, 0, 'd', "values") < 0) {
        PyBuffer_Release(&iv);
        return NULL;
    }
    Py_ssize_t n = iv.len / 8;
    const int64_t *idx = (const int64_t *)iv.buf;
    Py_ssize_t step = vv.len / 8 == 1 ? 0 : 1; /* one priority for all */
    int rc = -1;
    if (vv.len / 8 != n && step) {
        PyErr_Format(PyExc_ValueError,
                     "set_many: priorities has %zd items but idx has %zd (give one per "
                     "index, or one for all)",
                     vv.len / 8, n);
    }
    else if (check_indexes(idx, n, self->sums.len[0], "set_many") == 0) {
        const Levels *sums = &self->sums, *mins = &self->mins;
        if (mins->count == 0 || mins->count == sums->count) {
            rc = write_many(sums, mins, idx, (const double *)vv.buf, step, n, 1, exponent);
        }
        else { /* a min tree with another number of levels: its own pass */
            Levels none;
            none.count = 0;
            rc = write_many(sums, &none, idx, (const double *)vv.buf, step, n, 1, exponent);
            if (rc == 0) {
                rc = write_many(mins, &none, idx, NULL, 0, n, 0, 1.0);
            }
        }
    }
    PyBuffer_Release(&vv);
    PyBuffer_Release(&iv);
    if (rc < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef LeafWriter_methods[] = {
    {"set_many", (PyCFunction)(void (*)(void))LeafWriter_set_many, METH_FASTCALL,
     "set_many(idx, priorities, exponent): set_sum on the held trees of priorities ** "
     "exponent, for an int64 buffer of leaves and a float64 buffer of priorities, one "
     "per leaf or one for all (duplicates: the last wins); nothing is written when an "
     "index is out of range (ValueError)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LeafWriterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "rlreplay.core.selectors._sumtree.LeafWriter",
    .tp_basicsize = sizeof(LeafWriter),
    .tp_dealloc = (destructor)LeafWriter_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "LeafWriter(levels, min_levels=None): a sum tree's levels (and a min tree's "
              "over the same leaves) held for set_many, without acquiring the levels on "
              "every call.\n"
              "Raises TypeError for a wrong buffer kind, ValueError for wrong sizes or "
              "min_levels over other leaves.",
    .tp_methods = LeafWriter_methods,
    .tp_new = LeafWriter_new,
};

static PyMethodDef methods[] = {
    {"find_prefix", find_prefix, METH_VARARGS,
     "find_prefix(levels, targets, out): for each float64 target, the leaf of the sum tree "
     "whose cumulative range holds it, written to the int64 buffer out. Never a zero-weight "
     "leaf; a target at or past the total picks the last positive child.\n"
     "Raises TypeError for a wrong buffer kind, ValueError for wrong sizes or an empty tree."},
    {"set_sum", set_sum, METH_VARARGS,
     "set_sum(levels, idx, values, min_levels=None): write leaves (duplicates: last wins) "
     "and recompute their ancestors as sums of their 16 children; with min_levels (a min "
     "tree over the same leaves), recompute its ancestors of idx in the same pass.\n"
     "Raises TypeError for a wrong buffer kind, ValueError for wrong sizes or an index out of "
     "range (nothing is written then)."},
    {"set_min", set_min, METH_VARARGS,
     "set_min(levels, idx, values): like set_sum, each ancestor the smallest positive child "
     "(inf when none is). values=None (also for set_sum) keeps the leaves and only "
     "recomputes the ancestors of idx."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "rlreplay.core.selectors._sumtree",
    "Compiled loops for the 16-ary sum and min trees (see sum_tree.py).", -1, methods,
};

PyMODINIT_FUNC
PyInit__sumtree(void)
{
    if (PyType_Ready(&LeafWriterType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&LeafWriterType);
    if (PyModule_AddObject(m, "LeafWriter", (PyObject *)&LeafWriterType) < 0) {
        Py_DECREF(&LeafWriterType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
