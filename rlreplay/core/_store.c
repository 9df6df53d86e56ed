/*
 * Compiled writes of steps into the step store's columns (see storage.py).
 *
 * put_row(array_type, columns, paths, row, step) -> bool
 *     step is a dict with one value per path. When every value is one the store can take
 *     without conversion, writes value j into columns[j][row] for every j and returns True:
 *       - an array of exactly array_type (numpy.ndarray), C-contiguous, with the column's
 *         element format and one row's shape;
 *       - a Python float (or int) for a scalar float32/float64 column, an int for a scalar
 *         int64 column, a bool for a scalar bool column.
 *     Otherwise (another key set, a dtype that needs a cast, a shape that is wrong, any
 *     other type) returns False and writes nothing: the caller then validates the step in
 *     Python, which converts what it may and names what is wrong.
 *
 * put_rows(array_type, columns, paths, start, n, steps) -> bool
 *     The same for a batch: every value an array as above with a leading axis of n,
 *     written to rows start .. start + n - 1 (which must lie in the columns).
 *
 * Each column must be a C-contiguous array with at least one dimension (TypeError
 * otherwise); rows outside the columns raise ValueError. The caller holds the store's lock.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_common.h"

#define MAX_COLUMNS 64
/* Writes at least this large use streaming stores (see _common.h). */
#define STREAM_BYTES (1 << 18)

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
    int has_val; /* val holds an array buffer to copy from */
    char code;   /* the column's element code */
    union {
        double f;
        long long i;
        char b;
    } scalar;
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
    if (PyFloat_CheckExact(v) && (f->code == 'f' || f->code == 'd')) {
        f->scalar.f = PyFloat_AS_DOUBLE(v);
        return 1;
    }
    if (PyLong_CheckExact(v)) {
        int overflow = 0;
        long long i = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (i == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
        if (f->code == 'f' || f->code == 'd') {
            f->scalar.f = (double)i;
            return 1;
        }
        if ((f->code == 'q' || f->code == 'l') && c->itemsize == 8) {
            f->scalar.i = i;
            return 1;
        }
        return 0;
    }
    if (PyBool_Check(v) && f->code == '?') {
        f->scalar.b = (char)(v == Py_True);
        return 1;
    }
    return 0;
}

static void
write_value(const Field *f, Py_ssize_t row)
{
    Py_ssize_t row_bytes = f->col.len / f->col.shape[0];
    char *to = (char *)f->col.buf + row * row_bytes;
    if (f->has_val) {
        if (f->val.len >= STREAM_BYTES) {
            stream_copy(to, (const char *)f->val.buf, (size_t)f->val.len);
        }
        else {
            memcpy(to, f->val.buf, (size_t)f->val.len);
        }
        return;
    }
    switch (f->code) {
    case 'f': {
        float x = (float)f->scalar.f;
        memcpy(to, &x, sizeof x);
        break;
    }
    case 'd':
        memcpy(to, &f->scalar.f, sizeof(double));
        break;
    case '?':
        *to = f->scalar.b;
        break;
    default: { /* int64 */
        int64_t x = (int64_t)f->scalar.i;
        memcpy(to, &x, sizeof x);
    }
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
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "column %zd must be a writable C-contiguous array", j);
            release(fields, acquired);
            return NULL;
        }
        acquired++;
        f->code = element_code(f->col.format);
        if (f->col.ndim < 1 || f->code == 0) {
            PyErr_SetString(PyExc_TypeError, "each column must be an array of one element type "
                                             "with at least one dimension");
            release(fields, acquired);
            return NULL;
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
        for (Py_ssize_t j = 0; j < count; j++) {
            write_value(&fields[j], row);
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
     "array_type with the column's dtype and row shape, or a Python scalar for a scalar "
     "float, int64 or bool column); otherwise write nothing and return False.\n"
     "Raises TypeError for a column that is not a C-contiguous array, ValueError for a row "
     "outside the columns."},
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
