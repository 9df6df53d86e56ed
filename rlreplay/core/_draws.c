/*
 * Compiled loops for rlreplay.core.item_draws: reading sampled items out of the step store.
 *
 * gather(sources, rows, outs, threads=1)
 *     For each column j and each i: outs[j][i] = sources[j][rows[j][i]], whole rows copied.
 *     Sampled rows are scattered over a store of up to millions of rows, so nearly every
 *     read misses the caches. numpy's take() copies one row after another and waits on
 *     each miss in turn; here the rows of every column are fetched AHEAD draws before
 *     they are copied, so the misses overlap. With threads > 1, a batch of THREAD_BYTES
 *     or more (image frames) is split over two threads.
 *
 * mark_sampled(slots, state, keys, priorities, times_out, origin=0)
 *     The per-item bookkeeping of a draw in one pass over the slots' records (state: the
 *     bytes of ItemIndex.slot_state, see _common.h): the key (generation << 32 | slot, the
 *     generation moved by the table's generation origin, see keys.py), the priority (left
 *     as the caller filled it when the records hold none), and the sample count,
 *     incremented once per draw in batch order so that a slot drawn twice sees its count
 *     as of each draw.
 *
 * Every buffer must be C-contiguous. Indices are checked before anything is written
 * (ValueError when out of range, TypeError for a wrong buffer kind); the GIL is released
 * around the loops, and the caller holds the lock that protects the arrays.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_common.h"

#define MAX_COLUMNS 64
/* Rows are fetched this many draws before they are copied. */
#define AHEAD 8
/* A batch of at least this many bytes is copied on two threads when allowed. */
#define THREAD_BYTES (4 << 20)
#if !defined(_WIN32)
#include <pthread.h>
#define HAVE_PTHREADS 1
#endif
/* Rows at least this large (an image frame) are copied with streaming stores. */
#define STREAM_ROW_BYTES 4096
/* Lines of a row fetched ahead; past that the hardware prefetcher follows the copy. */
#define PREFETCH_BYTES 256

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch((p))
#define PREFETCH_W(p) __builtin_prefetch((p), 1)
#else
#define PREFETCH(p) ((void)(p))
#define PREFETCH_W(p) ((void)(p))
#endif

#define INT64_CODES "ql"
#define UINT32_CODES "IL"

typedef struct {
    Py_buffer src, rows, out;
    const char *src_data;
    const int64_t *row_data;
    char *out_data;
    Py_ssize_t n, row_bytes;
} Column;

static void
columns_release(Column *cols, Py_ssize_t acquired)
{
    for (Py_ssize_t j = 0; j < acquired; j++) {
        PyBuffer_Release(&cols[j].src);
        PyBuffer_Release(&cols[j].rows);
        PyBuffer_Release(&cols[j].out);
    }
}

/* Acquire column j's three buffers and check their sizes and its rows. */
static int
column_acquire(Column *c, PyObject *src, PyObject *rows, PyObject *out, Py_ssize_t j)
{
    if (get_buffer(src, &c->src, 0, NULL, 0, "each source") < 0) {
        return -1;
    }
    if (get_buffer(rows, &c->rows, 0, INT64_CODES, 8, "each rows array") < 0) {
        PyBuffer_Release(&c->src);
        return -1;
    }
    if (get_buffer(out, &c->out, 1, NULL, 0, "each output") < 0) {
        PyBuffer_Release(&c->src);
        PyBuffer_Release(&c->rows);
        return -1;
    }
    Py_ssize_t src_rows = c->src.shape[0];
    c->n = c->rows.shape[0];
    c->row_bytes = src_rows ? c->src.len / src_rows : 0;
    Py_ssize_t out_row_bytes = c->out.shape[0] ? c->out.len / c->out.shape[0] : 0;
    const char *problem = NULL;
    if (c->out.shape[0] != c->n) {
        problem = "output j must have one row per entry of rows j";
    }
    else if (c->n && out_row_bytes != c->row_bytes) {
        problem = "output j's rows must have as many bytes as source j's";
    }
    c->src_data = (const char *)c->src.buf;
    c->row_data = (const int64_t *)c->rows.buf;
    c->out_data = (char *)c->out.buf;
    for (Py_ssize_t i = 0; problem == NULL && i < c->n; i++) {
        if (c->row_data[i] < 0 || c->row_data[i] >= src_rows) {
            problem = "rows j holds a row outside source j";
        }
    }
    if (problem != NULL) {
        PyErr_Format(PyExc_ValueError, "%s (column %zd)", problem, j);
        PyBuffer_Release(&c->src);
        PyBuffer_Release(&c->rows);
        PyBuffer_Release(&c->out);
        return -1;
    }
    return 0;
}

static inline void
prefetch_row(const Column *c, Py_ssize_t i)
{
    const char *p = c->src_data + c->row_data[i] * c->row_bytes;
    Py_ssize_t last = c->row_bytes < PREFETCH_BYTES ? c->row_bytes : PREFETCH_BYTES;
    for (Py_ssize_t o = 0; o < last; o += 64) {
        PREFETCH(p + o);
    }
    PREFETCH(p + last - 1);
}

static inline void
copy_row(const Column *c, Py_ssize_t i)
{
    const char *from = c->src_data + c->row_data[i] * c->row_bytes;
    char *to = c->out_data + i * c->row_bytes;
    switch (c->row_bytes) {
    case 4:
        memcpy(to, from, 4);
        break;
    case 8:
        memcpy(to, from, 8);
        break;
    default:
        if (c->row_bytes >= STREAM_ROW_BYTES) {
            stream_copy(to, from, (size_t)c->row_bytes);
        }
        else {
            memcpy(to, from, (size_t)c->row_bytes);
        }
    }
}

/* Rows [n * part / parts, n * (part + 1) / parts) of every column, fetched ahead. */
typedef struct {
    const Column *cols;
    Py_ssize_t count;
    int part, parts;
} Share;

static void
gather_share(const Share *s)
{
    Py_ssize_t first[MAX_COLUMNS], end[MAX_COLUMNS], longest = 0;
    for (Py_ssize_t j = 0; j < s->count; j++) {
        Py_ssize_t n = s->cols[j].n;
        first[j] = n * s->part / s->parts;
        end[j] = n * (s->part + 1) / s->parts;
        if (end[j] - first[j] > longest) {
            longest = end[j] - first[j];
        }
    }
    for (Py_ssize_t i = 0; i < longest + AHEAD; i++) {
        for (Py_ssize_t j = 0; j < s->count; j++) {
            const Column *c = &s->cols[j];
            Py_ssize_t ahead = first[j] + i, k = ahead - AHEAD;
            if (ahead < end[j]) {
                prefetch_row(c, ahead);
            }
            if (k >= first[j] && k < end[j]) {
                copy_row(c, k);
            }
        }
    }
}

#ifdef HAVE_PTHREADS
static void *
gather_worker(void *arg)
{
    gather_share((const Share *)arg);
    return NULL;
}
#endif

/* Copy every column's rows, on two threads for a large batch: one core's copy does not
 * reach the memory bandwidth that two reach. */
static void
gather_all(const Column *cols, Py_ssize_t count, int threads)
{
    Share whole = {cols, count, 0, 1};
#ifdef HAVE_PTHREADS
    if (threads > 1) {
        Py_ssize_t bytes = 0;
        for (Py_ssize_t j = 0; j < count; j++) {
            bytes += cols[j].n * cols[j].row_bytes;
        }
        if (bytes >= THREAD_BYTES) {
            Share halves[2] = {{cols, count, 0, 2}, {cols, count, 1, 2}};
            pthread_t helper;
            if (pthread_create(&helper, NULL, gather_worker, &halves[1]) == 0) {
                gather_share(&halves[0]);
                pthread_join(helper, NULL);
                return;
            }
        }
    }
#else
    (void)threads;
#endif
    gather_share(&whole);
}

static PyObject *
gather(PyObject *self, PyObject *args)
{
    PyObject *sources, *rows, *outs;
    int threads = 1;
    if (!PyArg_ParseTuple(args, "OOO|i:gather", &sources, &rows, &outs, &threads)) {
        return NULL;
    }
    if (!PyTuple_Check(sources) || !PyTuple_Check(rows) || !PyTuple_Check(outs)) {
        PyErr_SetString(PyExc_TypeError, "sources, rows and outs must be tuples of arrays");
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(sources);
    if (PyTuple_GET_SIZE(rows) != count || PyTuple_GET_SIZE(outs) != count ||
        count > MAX_COLUMNS) {
        PyErr_Format(PyExc_ValueError,
                     "sources, rows and outs must be tuples of one length, at most %d",
                     MAX_COLUMNS);
        return NULL;
    }
    Column cols[MAX_COLUMNS];
    for (Py_ssize_t j = 0; j < count; j++) {
        if (column_acquire(&cols[j], PyTuple_GET_ITEM(sources, j), PyTuple_GET_ITEM(rows, j),
                           PyTuple_GET_ITEM(outs, j), j) < 0) {
            columns_release(cols, j);
            return NULL;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    gather_all(cols, count, threads);
    Py_END_ALLOW_THREADS
    columns_release(cols, count);
    Py_RETURN_NONE;
}

static PyObject *
mark_sampled(PyObject *self, PyObject *args)
{
    PyObject *objs[5];
    Py_ssize_t origin_arg = 0;
    if (!PyArg_ParseTuple(args, "OOOOO|n:mark_sampled", &objs[0], &objs[1], &objs[2], &objs[3],
                          &objs[4], &origin_arg) ||
        check_origin(origin_arg) < 0) {
        return NULL;
    }
    const uint32_t origin = (uint32_t)origin_arg;
    Py_buffer sv, v[4]; /* v: slots, keys, priorities, times_out */
    static const int arg[4] = {0, 2, 3, 4};
    static const char *names[4] = {"slots", "keys", "priorities", "times_out"};
    static const char *codes[4] = {INT64_CODES, INT64_CODES, "d", UINT32_CODES};
    static const Py_ssize_t sizes[4] = {8, 8, 8, 4};
    static const int writable[4] = {0, 1, 1, 1};
    Py_ssize_t cap;
    SlotRecords records;
    if (get_slot_records(objs[1], &sv, &records, &cap) < 0) {
        return NULL;
    }
    for (int a = 0; a < 4; a++) {
        if (get_buffer(objs[arg[a]], &v[a], writable[a], codes[a], sizes[a], names[a]) < 0) {
            for (int b = 0; b < a; b++) {
                PyBuffer_Release(&v[b]);
            }
            PyBuffer_Release(&sv);
            return NULL;
        }
    }
    Py_ssize_t n = v[0].shape[0];
    const char *problem = NULL;
    if (v[1].shape[0] != n || v[2].shape[0] != n || v[3].shape[0] != n) {
        problem = "keys, priorities and times_out must have one entry per slot drawn";
    }
    const int64_t *slots = (const int64_t *)v[0].buf;
    for (Py_ssize_t i = 0; problem == NULL && i < n; i++) {
        if (slots[i] < 0 || slots[i] >= cap) {
            problem = "slots holds a slot outside the table";
        }
    }
    if (problem == NULL) {
        int64_t *keys = (int64_t *)v[1].buf;
        double *prios = (double *)v[2].buf;
        uint32_t *times_out = (uint32_t *)v[3].buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            if (i + AHEAD < n) {
                PREFETCH_W(slot_record(&records, slots[i + AHEAD]));
            }
            int64_t s = slots[i];
            SlotState *rec = slot_record(&records, s);
            keys[i] = make_key(rec->generation, s, origin);
            if (records.has_priority) {
                prios[i] = *slot_priority(&records, s);
            }
            times_out[i] = ++rec->times_sampled;
        }
        Py_END_ALLOW_THREADS
    }
    for (int a = 0; a < 4; a++) {
        PyBuffer_Release(&v[a]);
    }
    PyBuffer_Release(&sv);
    if (problem != NULL) {
        PyErr_SetString(PyExc_ValueError, problem);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"gather", gather, METH_VARARGS,
     "gather(sources, rows, outs, threads=1): outs[j][i] = sources[j][rows[j][i]] for every "
     "column j, whole rows copied, rows fetched ahead of their copy; with threads > 1 a "
     "batch of 4 MiB or more is copied on two threads.\n"
     "sources, rows and outs are tuples of C-contiguous arrays; rows[j] is int64 and outs[j] "
     "has one row per entry of rows[j], of the same bytes as a row of sources[j].\n"
     "Raises TypeError for a wrong buffer kind, ValueError for wrong sizes or a row out of "
     "range (nothing is written then)."},
    {"mark_sampled", mark_sampled, METH_VARARGS,
     "mark_sampled(slots, state, keys, priorities, times_out, origin=0): for each drawn slot "
     "s, in order, with its record in state (the bytes of the slot records): keys[i] = "
     "the key of s (its generation moved by origin, see keys.py), priorities[i] = "
     "priority (records of 16 bytes; else left as given), times_sampled += 1 and "
     "times_out[i] = times_sampled.\n"
     "slots and keys are int64, priorities float64, times_out uint32.\n"
     "Raises TypeError for a wrong buffer kind, ValueError for wrong sizes, a slot out of "
     "range or an origin outside 0 .. 2**31 - 2 (nothing is written then)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "rlreplay.core._draws",
    "Compiled loops for reading sampled items (see item_draws.py).", -1, methods,
};

PyMODINIT_FUNC
PyInit__draws(void)
{
    return PyModule_Create(&module);
}
