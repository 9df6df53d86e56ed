/*
 * Compiled sampling of the SB3 buffers' uniform batches (see sb3/steps.py).
 *
 * randint(bitgen, high, out)
 *     Fills the int64 array `out` with the numbers np.random.randint(0, high, size=len(out))
 *     returns when numpy's global generator holds the bit generator behind the capsule
 *     `bitgen` (np.random.get_bit_generator().capsule), and leaves that generator in the
 *     state the call would leave it: numpy's legacy bounded draw, a 32-bit draw masked to
 *     the next power of two and drawn again while above high - 1 (none drawn when high is
 *     1). high is in 1 .. 2**32. The caller holds the generator's lock.
 *
 * transitions(positions, envs, ring, columns, side, final_at, steps, outs)
 *     Gathers the transitions at SB3 positions `positions` of environments `envs` (int64;
 *     negative ones count from the end, as numpy's indexing counts them) from an
 *     ObservationRing, as its numpy path does (ObservationRing.transitions):
 *       ring      (count, per_env, n_envs): the ring's add calls so far and its sizes;
 *       columns   the store's observation columns, (per_env + 1) * n_envs rows each;
 *       side      the side store's arrays of final observations, one per column;
 *       final_at  int32, per transition (position * n_envs + env): 1 + the side slot of
 *                 its final observation, or 0 when its next observation is the next row;
 *       steps     (actions, rewards, dones, timeouts): per transition, actions of any
 *                 dtype, rewards float32, dones and timeouts bool;
 *       outs      (obs_outs, next_outs, actions_out, rewards_out, dones_out): obs_outs and
 *                 next_outs one array per column, one row per position; rewards_out and
 *                 dones_out float32 (dones_out: done and not a timeout).
 *     Raises IndexError for a position or environment out of range (as numpy's indexing),
 *     TypeError for a wrong buffer kind and ValueError for wrong sizes; nothing is written
 *     then.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../core/_common.h"

#define MAX_FIELDS 64
#define INT64_CODES "ql"

/* numpy's bitgen_t (numpy/random/bitgen.h), the interface behind a BitGenerator's capsule */
typedef struct {
    void *state;
    uint64_t (*next_uint64)(void *st);
    uint32_t (*next_uint32)(void *st);
    double (*next_double)(void *st);
    uint64_t (*next_raw)(void *st);
} bitgen_t;

static PyObject *
randint(PyObject *self, PyObject *args)
{
    PyObject *capsule, *out_obj;
    long long high;
    if (!PyArg_ParseTuple(args, "OLO:randint", &capsule, &high, &out_obj)) {
        return NULL;
    }
    if (high < 1 || high > 0x100000000LL) {
        PyErr_Format(PyExc_ValueError, "high=%lld must be in 1 .. 2**32", high);
        return NULL;
    }
    bitgen_t *bitgen = (bitgen_t *)PyCapsule_GetPointer(capsule, "BitGenerator");
    if (bitgen == NULL) {
        return NULL;
    }
    Py_buffer out;
    if (get_buffer(out_obj, &out, 1, INT64_CODES, 8, "out") < 0) {
        return NULL;
    }
    int64_t *values = (int64_t *)out.buf;
    const Py_ssize_t n = out.shape[0];
    const uint32_t top = (uint32_t)(high - 1);
    if (top == 0) {
        memset(values, 0, (size_t)n * sizeof(int64_t));
    }
    else {
        uint32_t mask = top; /* the smallest 2**b - 1 >= top */
        mask |= mask >> 1;
        mask |= mask >> 2;
        mask |= mask >> 4;
        mask |= mask >> 8;
        mask |= mask >> 16;
        for (Py_ssize_t i = 0; i < n; i++) {
            uint32_t value;
            while ((value = bitgen->next_uint32(bitgen->state) & mask) > top) {
            }
            values[i] = (int64_t)value;
        }
    }
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* Acquired buffers, released together. */
typedef struct {
    Py_buffer views[4 * MAX_FIELDS + 16];
    int count;
} Views;

static void
views_release(Views *v)
{
    for (int i = 0; i < v->count; i++) {
        PyBuffer_Release(&v->views[i]);
    }
    v->count = 0;
}

/* The next buffer of `obj`: with `codes`, as get_buffer takes it (one-dimensional, of that
 * element kind and `itemsize` bytes: the arrays the ring keeps, whose buffer description
 * numpy caches); without, any C-contiguous array of one or more dimensions, its format not
 * asked for (the fresh outs and the columns, copied as bytes). NULL with an error set. */
static Py_buffer *
acquire(Views *v, PyObject *obj, int writable, const char *codes, Py_ssize_t itemsize,
        const char *what)
{
    Py_buffer *view = &v->views[v->count];
    if (codes != NULL) {
        if (get_buffer(obj, view, writable, codes, itemsize, what) < 0) {
            return NULL;
        }
    }
    else {
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_ND | (writable ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(obj, view, flags) < 0) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s must be a %sC-contiguous array", what,
                         writable ? "writable " : "");
            return NULL;
        }
        if (view->ndim < 1) {
            PyBuffer_Release(view);
            PyErr_Format(PyExc_TypeError, "%s must have at least one dimension", what);
            return NULL;
        }
    }
    v->count++;
    return view;
}

/* Bytes per row of an array (its item size times its shape past the first axis). */
static Py_ssize_t
row_bytes(const Py_buffer *view)
{
    Py_ssize_t bytes = view->itemsize;
    for (int d = 1; d < view->ndim; d++) {
        bytes *= view->shape[d];
    }
    return bytes;
}

/* Whether `view` has `rows` rows of `bytes` bytes; else ValueError naming `what`. */
static int
rows_of(const Py_buffer *view, Py_ssize_t rows, Py_ssize_t bytes, const char *what)
{
    if (view->shape[0] == rows && row_bytes(view) == bytes) {
        return 1;
    }
    PyErr_Format(PyExc_ValueError, "%s has %zd rows of %zd bytes; %zd of %zd expected", what,
                 view->shape[0], row_bytes(view), rows, bytes);
    return 0;
}

/* An index in 0 .. size - 1 from `i` in -size .. size - 1 (numpy's indexing), or -1. */
static inline int64_t
wrapped(int64_t i, int64_t size)
{
    if (i < 0) {
        i += size;
    }
    return (i < 0 || i >= size) ? -1 : i;
}

static PyObject *
transitions(PyObject *self, PyObject *args)
{
    PyObject *positions_obj, *envs_obj, *columns, *side, *final_obj, *steps, *outs;
    long long count, per_env, n_envs;
    if (!PyArg_ParseTuple(args, "OO(LLL)O!O!OO!O!:transitions", &positions_obj, &envs_obj,
                          &count, &per_env, &n_envs, &PyTuple_Type, &columns, &PyTuple_Type,
                          &side, &final_obj, &PyTuple_Type, &steps, &PyTuple_Type, &outs)) {
        return NULL;
    }
    PyObject *obs_outs, *next_outs, *out_objs[3], *step_objs[4];
    if (!PyArg_ParseTuple(steps, "OOOO;steps must be (actions, rewards, dones, timeouts)",
                          &step_objs[0], &step_objs[1], &step_objs[2], &step_objs[3]) ||
        !PyArg_ParseTuple(outs, "O!O!OOO;outs must be (obs_outs, next_outs, actions, rewards, "
                                "dones)",
                          &PyTuple_Type, &obs_outs, &PyTuple_Type, &next_outs, &out_objs[0],
                          &out_objs[1], &out_objs[2])) {
        return NULL;
    }
    const Py_ssize_t fields = PyTuple_GET_SIZE(columns);
    if (fields < 1 || fields > MAX_FIELDS || PyTuple_GET_SIZE(side) != fields ||
        PyTuple_GET_SIZE(obs_outs) != fields || PyTuple_GET_SIZE(next_outs) != fields) {
        PyErr_Format(PyExc_ValueError,
                     "columns, side and the outs' observation tuples must hold one array per "
                     "field, 1 .. %d", MAX_FIELDS);
        return NULL;
    }
    /* (per_env + 1) * n_envs rows must be countable: no product below overflows */
    if (count < 0 || per_env < 1 || n_envs < 1 || per_env >= PY_SSIZE_T_MAX / n_envs - 1) {
        PyErr_SetString(PyExc_ValueError, "ring must be (count >= 0, per_env >= 1, n_envs >= 1) "
                                          "of fewer than 2**63 rows");
        return NULL;
    }
    Views v = {.count = 0};
    Py_buffer *pos_v, *env_v, *final_v, *act_v, *rew_v, *done_v, *tout_v, *aout_v, *rout_v,
        *dout_v;
    if ((pos_v = acquire(&v, positions_obj, 0, INT64_CODES, 8, "positions")) == NULL ||
        (env_v = acquire(&v, envs_obj, 0, INT64_CODES, 8, "envs")) == NULL ||
        (final_v = acquire(&v, final_obj, 0, "i", 4, "final_at")) == NULL ||
        (act_v = acquire(&v, step_objs[0], 0, NULL, 0, "actions")) == NULL ||
        (rew_v = acquire(&v, step_objs[1], 0, "f", 4, "rewards")) == NULL ||
        (done_v = acquire(&v, step_objs[2], 0, "?", 1, "dones")) == NULL ||
        (tout_v = acquire(&v, step_objs[3], 0, "?", 1, "timeouts")) == NULL ||
        (aout_v = acquire(&v, out_objs[0], 1, NULL, 0, "actions out")) == NULL ||
        (rout_v = acquire(&v, out_objs[1], 1, NULL, 0, "rewards out")) == NULL ||
        (dout_v = acquire(&v, out_objs[2], 1, NULL, 0, "dones out")) == NULL) {
        views_release(&v);
        return NULL;
    }
    const Py_ssize_t n = pos_v->shape[0];
    const Py_ssize_t slots = (Py_ssize_t)(per_env * n_envs);
    const Py_ssize_t capacity = (Py_ssize_t)((per_env + 1) * n_envs);
    const Py_ssize_t action_bytes = row_bytes(act_v);
    if (!rows_of(pos_v, n, 8, "positions") || !rows_of(env_v, n, 8, "envs") ||
        !rows_of(final_v, slots, 4, "final_at") ||
        !rows_of(act_v, slots, action_bytes, "actions") ||
        !rows_of(rew_v, slots, 4, "rewards") || !rows_of(done_v, slots, 1, "dones") ||
        !rows_of(tout_v, slots, 1, "timeouts") ||
        !rows_of(aout_v, n, action_bytes, "actions out") ||
        !rows_of(rout_v, n, 4, "rewards out") || !rows_of(dout_v, n, 4, "dones out")) {
        views_release(&v);
        return NULL;
    }
    const char *col[MAX_FIELDS], *side_buf[MAX_FIELDS];
    char *obs_out[MAX_FIELDS], *next_out[MAX_FIELDS];
    Py_ssize_t field_bytes[MAX_FIELDS], side_rows = 0;
    for (Py_ssize_t j = 0; j < fields; j++) {
        Py_buffer *c, *s, *o, *x;
        if ((c = acquire(&v, PyTuple_GET_ITEM(columns, j), 0, NULL, 0, "a column")) == NULL ||
            (s = acquire(&v, PyTuple_GET_ITEM(side, j), 0, NULL, 0, "a side array")) == NULL ||
            (o = acquire(&v, PyTuple_GET_ITEM(obs_outs, j), 1, NULL, 0, "an obs out")) == NULL ||
            (x = acquire(&v, PyTuple_GET_ITEM(next_outs, j), 1, NULL, 0, "a next out")) == NULL) {
            views_release(&v);
            return NULL;
        }
        const Py_ssize_t rb = row_bytes(c);
        if (j == 0) {
            side_rows = s->shape[0];
        }
        if (!rows_of(c, capacity, rb, "a column") || !rows_of(s, side_rows, rb, "a side array") ||
            !rows_of(o, n, rb, "an obs out") || !rows_of(x, n, rb, "a next out")) {
            views_release(&v);
            return NULL;
        }
        col[j] = (const char *)c->buf;
        side_buf[j] = (const char *)s->buf;
        obs_out[j] = (char *)o->buf;
        next_out[j] = (char *)x->buf;
        field_bytes[j] = rb;
    }
    const int64_t *positions = (const int64_t *)pos_v->buf;
    const int64_t *envs = (const int64_t *)env_v->buf;
    const int32_t *final_at = (const int32_t *)final_v->buf;
    for (Py_ssize_t i = 0; i < n; i++) { /* validate, then write */
        const int64_t p = wrapped(positions[i], per_env), e = wrapped(envs[i], n_envs);
        if (p < 0 || e < 0) {
            PyErr_Format(PyExc_IndexError,
                         "index %lld is out of bounds for %s of size %lld",
                         (long long)(p < 0 ? positions[i] : envs[i]),
                         p < 0 ? "positions" : "environments", p < 0 ? per_env : n_envs);
            views_release(&v);
            return NULL;
        }
        const int32_t at = final_at[p * n_envs + e];
        if (at < 0 || at > side_rows) {
            PyErr_Format(PyExc_ValueError, "final_at names side slot %d of %zd", at - 1,
                         side_rows);
            views_release(&v);
            return NULL;
        }
    }
    const int64_t ring = per_env + 1, base = count - per_env;
    const char *actions = (const char *)act_v->buf;
    const float *rewards = (const float *)rew_v->buf;
    const uint8_t *dones = (const uint8_t *)done_v->buf, *timeouts = (const uint8_t *)tout_v->buf;
    char *actions_out = (char *)aout_v->buf;
    float *rewards_out = (float *)rout_v->buf, *dones_out = (float *)dout_v->buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t p = wrapped(positions[i], per_env), e = wrapped(envs[i], n_envs);
        const int64_t flat = p * n_envs + e;
        /* the add call k that wrote position p: p itself until the ring turns */
        int64_t k = p;
        if (count > per_env) {
            k = base + (((p - base) % per_env) + per_env) % per_env;
        }
        const int64_t row = (k % ring) * n_envs + e, next = ((k + 1) % ring) * n_envs + e;
        const int32_t at = final_at[flat];
        for (Py_ssize_t j = 0; j < fields; j++) {
            const Py_ssize_t rb = field_bytes[j];
            memcpy(obs_out[j] + i * rb, col[j] + row * rb, rb);
            const char *from = at ? side_buf[j] + (at - 1) * rb : col[j] + next * rb;
            memcpy(next_out[j] + i * rb, from, rb);
        }
        memcpy(actions_out + i * action_bytes, actions + flat * action_bytes, action_bytes);
        rewards_out[i] = rewards[flat];
        dones_out[i] = (dones[flat] && !timeouts[flat]) ? 1.0f : 0.0f;
    }
    views_release(&v);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"randint", randint, METH_VARARGS,
     "randint(bitgen, high, out): out filled as np.random.randint(0, high, size=len(out)) "
     "fills it from the generator behind the capsule bitgen, which is left as it leaves it."},
    {"transitions", transitions, METH_VARARGS,
     "transitions(positions, envs, ring, columns, side, final_at, steps, outs): the "
     "transitions at SB3 positions of envs gathered into outs (see the module's source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "rlreplay.integrations._sb3_transitions",
    "Compiled uniform sampling of the SB3 buffers (see steps.py).", -1, methods,
};

PyMODINIT_FUNC
PyInit__sb3_transitions(void)
{
    return PyModule_Create(&module);
}
