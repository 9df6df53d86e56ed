/*
 * Compiled writes of steps into the step store's columns (see storage.py).
 *
 * put_row(array_type, columns, paths, row, step) -> bool
 *     step is a dict with one value per path. When every value is one the store can take
 *     as it is, writes value j into columns[j][row] for every j and returns True:
 *       - an array of exactly array_type (numpy.ndarray), C-contiguous, with the column's
 *         element format and one row's shape;
 *       - for a scalar column, a Python bool, int or float, or a numpy scalar (bool_,
 *         signed or unsigned integer, float32, float64) that the signature's casting rule
 *         admits for the column and that fits it (see specs.py): a bool into any numeric
 *         column, an integer into an integer column whose range holds it or into a float
 *         column, a float into a float column (rounded to float32 there).
 *     Otherwise (another key set, a value that needs a cast this code does not make, that
 *     does not fit, a wrong shape, any other type, or a column whose element type this code
 *     does not write: complex, byte-swapped, datetime, strings, ...) returns False and
 *     writes nothing: the caller then validates the step in Python, which converts what
 *     the rule admits and names what is wrong. So a step is stored identically with and
 *     without this module.
 *
 * put_rows(array_type, columns, paths, start, n, steps) -> bool
 *     The same for a batch: every value an array as above with a leading axis of n,
 *     written to rows start .. start + n - 1 (which must lie in the columns).
 *
 * Rows outside the columns raise ValueError. The caller holds the store's lock. A batch of
 * RELEASE_GIL_BYTES or more is copied with the GIL released, so that other threads (a
 * learner) run meanwhile.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_common.h"

#define MAX_COLUMNS 64
/* Writes at least this large use streaming stores (see _common.h). */
#define STREAM_BYTES (1 << 18)
/* Batches of at least this many bytes are copied with the GIL released (see put). */
#define RELEASE_GIL_BYTES (1 << 20)

/* The element code of a struct format ('f', 'd', 'B', ...), skipping a byte-order prefix
 * that means native order here; 0 for anything longer than one code. */
static char
element_code(const char *fmt)
{
    if (fmt == NULL) {
        return 'B';
    }
    if (fmt[0] == '@' || fmt[0] == '=' || fmt[0] == '<') {
        fmt++;
    }
    return (fmt[0] != '\0' && fmt[1] == '\0') ? fmt[0] : 0;
}

typedef struct {
    Py_buffer col;
    Py_buffer val;
    int has_val;   /* val holds an array buffer to copy from */
    char code;     /* the column's element code */
    char bytes[8]; /* a scalar value, converted to the column's element type */
} Field;

static void
release(Field *fields, Py_ssize_t count)
{
    for (Py_ssize_t j = 0; j < count; j++) {
        if (fields[j].has_val) {
            PyBuffer_Release(&fields[j].val);
        }
        PyBuffer_Release(&fields[j].col);
    }
}

/* Whether this module writes columns of element code `code` and size `itemsize`. */
static int
column_supported(char code, Py_ssize_t itemsize)
{
    switch (code) {
    case '?':
        return itemsize == 1;
    case 'f':
        return itemsize == 4;
    case 'd':
        return itemsize == 8;
    case 'b': case 'h': case 'i': case 'l': case 'q':
    case 'B': case 'H': case 'I': case 'L': case 'Q':
        return itemsize == 1 || itemsize == 2 || itemsize == 4 || itemsize == 8;
    default:
        return 0;
    }
}

/* A scalar read from a Python or numpy scalar: kind 'b' (bool), 'i' (signed), 'u'
 * (unsigned, above the signed range) or 'f' (float). */
typedef struct {
    char kind;
    long long i;
    unsigned long long u;
    double f;
} Scalar;

/* A numpy scalar (a zero-dimensional buffer) of a bool, integer or float32/64 format. */
static int
read_buffer_scalar(PyObject *v, Scalar *s)
{
    Py_buffer b;
    if (PyObject_GetBuffer(v, &b, PyBUF_FORMAT | PyBUF_ND) < 0) {
        PyErr_Clear();
        return 0;
    }
    int ok = b.ndim == 0;
    char code = ok ? element_code(b.format) : 0;
    const char *p = (const char *)b.buf;
    if (code == '?' && b.itemsize == 1) {
        s->kind = 'b';
        s->i = *p != 0;
    }
    else if (code == 'f' && b.itemsize == 4) {
        float x;
        memcpy(&x, p, 4);
        s->kind = 'f';
        s->f = x;
    }
    else if (code == 'd' && b.itemsize == 8) {
        s->kind = 'f';
        memcpy(&s->f, p, 8);
    }
    else if (code != 0 && strchr("bhilq", code) != NULL) {
        s->kind = 'i';
        switch (b.itemsize) {
        case 1: { int8_t x; memcpy(&x, p, 1); s->i = x; break; }
        case 2: { int16_t x; memcpy(&x, p, 2); s->i = x; break; }
        case 4: { int32_t x; memcpy(&x, p, 4); s->i = x; break; }
        case 8: { int64_t x; memcpy(&x, p, 8); s->i = x; break; }
        default: ok = 0;
        }
    }
    else if (code != 0 && strchr("BHILQ", code) != NULL) {
        unsigned long long u = 0;
        switch (b.itemsize) {
        case 1: { uint8_t x; memcpy(&x, p, 1); u = x; break; }
        case 2: { uint16_t x; memcpy(&x, p, 2); u = x; break; }
        case 4: { uint32_t x; memcpy(&x, p, 4); u = x; break; }
        case 8: { uint64_t x; memcpy(&x, p, 8); u = x; break; }
        default: ok = 0;
        }
        if (u > (unsigned long long)INT64_MAX) {
            s->kind = 'u';
            s->u = u;
        }
        else {
            s->kind = 'i';
            s->i = (long long)u;
        }
    }
    else {
        ok = 0;
    }
    PyBuffer_Release(&b);
    return ok;
}

/* Reads a Python bool, int or float, or a numpy scalar; 0 for anything else. */
static int
read_scalar(PyObject *v, Scalar *s)
{
    if (PyBool_Check(v)) {
        s->kind = 'b';
        s->i = v == Py_True;
        return 1;
    }
    if (PyFloat_Check(v)) { /* numpy.float64 too */
        s->kind = 'f';
        s->f = PyFloat_AS_DOUBLE(v);
        return 1;
    }
    if (PyLong_Check(v)) {
        int overflow = 0;
        long long i = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (i == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        if (!overflow) {
            s->kind = 'i';
            s->i = i;
            return 1;
        }
        if (overflow < 0) {
            return 0;
        }
        unsigned long long u = PyLong_AsUnsignedLongLong(v);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        s->kind = 'u';
        s->u = u;
        return 1;
    }
    if (Py_TYPE(v)->tp_as_buffer != NULL && !PyBytes_Check(v) && !PyByteArray_Check(v)) {
        return read_buffer_scalar(v, s);
    }
    return 0;
}

/* Converts s into a column of element code `code` and size `itemsize` at `to` (8 bytes)
 * when the casting rule admits it and it fits; 0 otherwise, writing nothing. */
static int
convert_scalar(const Scalar *s, char code, Py_ssize_t itemsize, char *to)
{
    if (code == '?') {
        if (s->kind != 'b') {
            return 0;
        }
        *to = (char)s->i;
        return 1;
    }
    if (code == 'f' || code == 'd') {
        double x;
        switch (s->kind) {
        case 'u': x = (double)s->u; break;
        case 'f': x = s->f; break;
        default: x = (double)s->i; /* bool or signed */
        }
        if (code == 'f') {
            float y = (float)x;
            if (isfinite(x) && !isfinite(y)) {
                return 0; /* it would become inf: refused by the Python path */
            }
            memcpy(to, &y, 4);
        }
        else {
            memcpy(to, &x, 8);
        }
        return 1;
    }
    if (s->kind == 'f') {
        return 0; /* a float into an integer column: refused by the Python path */
    }
    int is_signed = strchr("bhilq", code) != NULL;
    int bits = (int)itemsize * 8;
    if (s->kind == 'u') { /* above INT64_MAX: only a uint64 column holds it */
        if (is_signed || bits != 64) {
            return 0;
        }
        memcpy(to, &s->u, 8);
        return 1;
    }
    long long i = s->i;
    if (is_signed) {
        long long lo = bits == 64 ? INT64_MIN : -(1LL << (bits - 1));
        long long hi = bits == 64 ? INT64_MAX : (1LL << (bits - 1)) - 1;
        if (i < lo || i > hi) {
            return 0;
        }
    }
    else if (i < 0 || (bits < 64 && i > (long long)((1ULL << bits) - 1))) {
        return 0;
    }
    switch (itemsize) { /* the value fits: the low bytes are the value (two's complement) */
    case 1: { int8_t x = (int8_t)i; memcpy(to, &x, 1); break; }
    case 2: { int16_t x = (int16_t)i; memcpy(to, &x, 2); break; }
    case 4: { int32_t x = (int32_t)i; memcpy(to, &x, 4); break; }
    default: { int64_t x = (int64_t)i; memcpy(to, &x, 8); }
    }
    return 1;
}

/* Whether v can go into field f as is (1) or not (0); fills f's source. batch < 0: v is
 * one row (scalars allowed); else an array of batch rows. */
static int
accept_value(Field *f, PyObject *v, PyObject *array_type, Py_ssize_t batch)
{
    const Py_buffer *c = &f->col;
    if (Py_TYPE(v) == (PyTypeObject *)array_type) {
        if (PyObject_GetBuffer(v, &f->val, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_ND) < 0) {
            PyErr_Clear();
            return 0;
        }
        f->has_val = 1;
        int lead = batch < 0 ? 0 : 1; /* dimensions before one row's shape */
        if (element_code(f->val.format) != f->code || f->val.itemsize != c->itemsize ||
            f->val.ndim != c->ndim - 1 + lead || (lead && f->val.shape[0] != batch)) {
            return 0;
        }
        for (int d = 1; d < c->ndim; d++) {
            if (f->val.shape[d - 1 + lead] != c->shape[d]) {
                return 0;
            }
        }
        return 1;
    }
    if (batch >= 0 || c->ndim != 1) {
        return 0;
    }
    Scalar s;
    return read_scalar(v, &s) && convert_scalar(&s, f->code, c->itemsize, f->bytes);
}

static void
write_value(const Field *f, Py_ssize_t row)
{
    Py_ssize_t row_bytes = f->col.len / f->col.shape[0];
    char *to = (char *)f->col.buf + row * row_bytes;
    if (!f->has_val) {
        memcpy(to, f->bytes, (size_t)f->col.itemsize);
    }
    else if (f->val.len >= STREAM_BYTES) {
        stream_copy(to, (const char *)f->val.buf, (size_t)f->val.len);
    }
    else {
        memcpy(to, f->val.buf, (size_t)f->val.len);
    }
}

/* put_row (batch < 0) and put_rows (batch rows from row on). */
static PyObject *
put(PyObject *array_type, PyObject *columns, PyObject *paths, Py_ssize_t row,
    Py_ssize_t batch, PyObject *step)
{
    Py_ssize_t count = PyTuple_GET_SIZE(columns);
    if (PyTuple_GET_SIZE(paths) != count || count > MAX_COLUMNS || !PyType_Check(array_type)) {
        PyErr_Format(PyExc_ValueError,
                     "columns and paths must be tuples of one length (at most %d) and "
                     "array_type a type",
                     MAX_COLUMNS);
        return NULL;
    }
    if (!PyDict_CheckExact(step) || PyDict_GET_SIZE(step) != count) {
        Py_RETURN_FALSE;
    }
    Py_ssize_t rows = batch < 0 ? 1 : batch;
    Field fields[MAX_COLUMNS];
    Py_ssize_t acquired = 0;
    int ok = 1;
    for (Py_ssize_t j = 0; j < count && ok; j++) {
        Field *f = &fields[j];
        f->has_val = 0;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(columns, j), &f->col,
                               PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_ND | PyBUF_WRITABLE) <
            0) {
            PyErr_Clear(); /* e.g. datetime columns, which numpy exports no buffer for */
            ok = 0;
            break;
        }
        acquired++;
        f->code = element_code(f->col.format);
        if (f->col.ndim < 1 || !column_supported(f->code, f->col.itemsize)) {
            ok = 0; /* complex, byte-swapped, strings, ...: the Python path writes them */
            break;
        }
        if (row < 0 || rows < 1 || row > f->col.shape[0] - rows) {
            PyErr_Format(PyExc_ValueError, "rows [%zd, %zd) are outside the columns' %zd rows",
                         row, row + rows, f->col.shape[0]);
            release(fields, acquired);
            return NULL;
        }
        PyObject *v = PyDict_GetItemWithError(step, PyTuple_GET_ITEM(paths, j));
        if (v == NULL) {
            if (PyErr_Occurred()) {
                release(fields, acquired);
                return NULL;
            }
            ok = 0; /* a key the step lacks: the Python path names it */
            break;
        }
        ok = accept_value(f, v, array_type, batch);
    }
    if (ok) {
        Py_ssize_t total = 0;
        for (Py_ssize_t j = 0; j < count; j++) {
            total += fields[j].has_val ? fields[j].val.len : 0;
        }
        if (total >= RELEASE_GIL_BYTES) {
            /* Safe without the GIL: the copies touch only the buffers acquired above,
             * which keep the columns' and the values' memory alive and unresized until
             * release(); the caller holds the store's lock, which every writer and
             * reader of these rows takes (the overwrite protocol has freed them), and
             * the numpy write path copies with the GIL released as well. */
            Py_BEGIN_ALLOW_THREADS
            for (Py_ssize_t j = 0; j < count; j++) {
                write_value(&fields[j], row);
            }
            Py_END_ALLOW_THREADS
        }
        else {
            for (Py_ssize_t j = 0; j < count; j++) {
                write_value(&fields[j], row);
            }
        }
    }
    release(fields, acquired);
    return PyBool_FromLong(ok);
}

static PyObject *
put_row(PyObject *self, PyObject *args)
{
    PyObject *array_type, *columns, *paths, *step;
    Py_ssize_t row;
    if (!PyArg_ParseTuple(args, "OO!O!nO:put_row", &array_type, &PyTuple_Type, &columns,
                          &PyTuple_Type, &paths, &row, &step)) {
        return NULL;
    }
    return put(array_type, columns, paths, row, -1, step);
}

static PyObject *
put_rows(PyObject *self, PyObject *args)
{
    PyObject *array_type, *columns, *paths, *steps;
    Py_ssize_t start, n;
    if (!PyArg_ParseTuple(args, "OO!O!nnO:put_rows", &array_type, &PyTuple_Type, &columns,
                          &PyTuple_Type, &paths, &start, &n, &steps)) {
        return NULL;
    }
    if (n < 1) {
        PyErr_Format(PyExc_ValueError, "n=%zd must be at least 1", n);
        return NULL;
    }
    return put(array_type, columns, paths, start, n, steps);
}

static PyMethodDef methods[] = {
    {"put_row", put_row, METH_VARARGS,
     "put_row(array_type, columns, paths, row, step) -> bool: write step[paths[j]] into "
     "columns[j][row] for every j when every value fits its column as is (an array of "
     "array_type with the column's dtype and row shape, or a Python or numpy scalar that "
     "the casting rule admits and that fits a scalar column); otherwise, or for a column "
     "of an element type this module does not write, write nothing and return False.\n"
     "Raises ValueError for a row outside the columns."},
    {"put_rows", put_rows, METH_VARARGS,
     "put_rows(array_type, columns, paths, start, n, steps) -> bool: put_row for a batch: "
     "each value an array of n rows, written to rows start .. start + n - 1.\n"
     "Raises as put_row, and ValueError when those rows leave the columns."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "rlreplay.core._store",
    "Compiled writes of steps into the step store's columns (see storage.py).", -1, methods,
};

PyMODINIT_FUNC
PyInit__store(void)
{
    return PyModule_Create(&module);
}
