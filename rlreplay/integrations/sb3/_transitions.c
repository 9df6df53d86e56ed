/*
 * Compiled sampling of the SB3 buffers' uniform batches (see steps.py).
 *
 * transitions(draw, envs, ring, columns, side, final_at, steps, outs)
 *     Gathers transitions of an ObservationRing as its numpy path does
 *     (ObservationRing.transitions and .sample):
 *       draw      the SB3 positions (int64, with `envs` their environments), or a tuple
 *                 (bitgen, high): draw len(outs' rows) positions in 0 .. high - 1, then
 *                 as many environments when n_envs > 1 (else 0), from the bit generator
 *                 behind the capsule `bitgen` (np.random.get_bit_generator().capsule) with
 *                 numpy's legacy bounded draw: the numbers np.random.randint(0, high,
 *                 size=n) and np.random.randint(0, n_envs, size=n) give, the generator left
 *                 as they leave it (the caller holds the generator's lock; `envs` is None);
 *       ring      (count, per_env, n_envs): the ring's add calls so far and its sizes;
 *       columns   the store's observation columns, (per_env + 1) * n_envs rows each;
 *       side      the side store's arrays of final observations, one per column;
 *       final_at  int32, per transition (position * n_envs + env): 1 + the side slot of
 *                 its final observation, or 0 when its next observation is the next row;
 *       steps     (actions, rewards, dones, timeouts): per transition, actions of any
 *                 dtype, rewards float32, dones and timeouts bool;
 *       outs      (obs_outs, next_outs, actions_out, rewards_out, dones_out): obs_outs and
 *                 next_outs one array per column, one row per transition; rewards_out and
 *                 dones_out float32 (dones_out: done and not a timeout).
 *     Raises TypeError for a wrong buffer kind and ValueError for wrong sizes, an index
 *     out of range or high outside 1 .. per_env; nothing is written then.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../../core/_common.h"

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

/* numpy's legacy bounded draw (RandomState.randint for int64): n numbers in 0 .. high - 1
 * (1 <= high <= 2**32), each a 32-bit draw masked to the next power of two, drawn again
 * while above high - 1 (none drawn when high is 1). */
static void
draw_bounded(bitgen_t *bitgen, int64_t high, int64_t *values, Py_ssize_t n)
{
    uint32_t top = (uint32_t)(high - 1);
    if (top == 0) {
        memset(values, 0, (size_t)n * sizeof(int64_t));
        return;
    }
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

/* The next buffer of `obj` (see get_buffer; with no `codes`, any C-contiguous array of
 * one or more dimensions, its format not asked for: only its bytes are copied), or NULL
 * with an error set. */
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

/* Bytes per row of an array of `rows` rows, or -1 with ValueError naming `what`. */
static Py_ssize_t
row_bytes(const Py_buffer *view, Py_ssize_t rows, const char *what)
{
    if (view->shape[0] != rows || (rows > 0 && view->len % rows != 0)) {
        PyErr_Format(PyExc_ValueError, "%s has %zd rows; %zd expected", what, view->shape[0],
                     rows);
        return -1;
    }
    return rows > 0 ? view->len / rows : 0;
}

static PyObject *
transitions(PyObject *self, PyObject *args)
{
    PyObject *draw, *envs_obj, *columns, *side, *final_obj, *steps, *outs;
    long long count, per_env, n_envs;
    if (!PyArg_ParseTuple(args, "OO(LLL)O!O!OO!O!:transitions", &draw, &envs_obj,
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
    Py_ssize_t fields = PyTuple_GET_SIZE(columns);
    if (fields < 1 || fields > MAX_FIELDS || PyTuple_GET_SIZE(side) != fields ||
        PyTuple_GET_SIZE(obs_outs) != fields || PyTuple_GET_SIZE(next_outs) != fields) {
        PyErr_Format(PyExc_ValueError,
                     "columns, side and the outs' observation tuples must hold one array per "
                     "field, 1 .. %d", MAX_FIELDS);
        return NULL;
    }
    if (count < 0 || per_env < 1 || n_envs < 1) {
        PyErr_SetString(PyExc_ValueError, "ring must be (count >= 0, per_env >= 1, n_envs >= 1)");
        return NULL;
    }
    bitgen_t *bitgen = NULL;
    long long high = 0;
    if (PyTuple_Check(draw)) {
        PyObject *capsule;
        if (!PyArg_ParseTuple(draw, "OL;draw must be positions or (bitgen, high)", &capsule,
                              &high)) {
            return NULL;
        }
        if (high < 1 || high > per_env) {
            PyErr_Format(PyExc_ValueError, "high=%lld must be in 1 .. per_env (%lld)", high,
                         per_env);
            return NULL;
        }
        if ((bitgen = (bitgen_t *)PyCapsule_GetPointer(capsule, "BitGenerator")) == NULL) {
            return NULL;
        }
    }
    Views v = {.count = 0};
    Py_buffer *pos_v = NULL, *env_v = NULL, *final_v, *act_v, *rew_v, *done_v, *tout_v,
              *aout_v, *rout_v, *dout_v;
    if ((bitgen == NULL &&
         ((pos_v = acquire(&v, draw, 0, INT64_CODES, 8, "positions")) == NULL ||
          (env_v = acquire(&v, envs_obj, 0, INT64_CODES, 8, "envs")) == NULL)) ||
        (final_v = acquire(&v, final_obj, 0, NULL, 0, "final_at")) == NULL ||
        (act_v = acquire(&v, step_objs[0], 0, NULL, 0, "actions")) == NULL ||
        (rew_v = acquire(&v, step_objs[1], 0, NULL, 0, "rewards")) == NULL ||
        (done_v = acquire(&v, step_objs[2], 0, NULL, 0, "dones")) == NULL ||
        (tout_v = acquire(&v, step_objs[3], 0, NULL, 0, "timeouts")) == NULL ||
        (aout_v = acquire(&v, out_objs[0], 1, NULL, 0, "actions out")) == NULL ||
        (rout_v = acquire(&v, out_objs[1], 1, NULL, 0, "rewards out")) == NULL ||
        (dout_v = acquire(&v, out_objs[2], 1, NULL, 0, "dones out")) == NULL) {
        views_release(&v);
        return NULL;
    }
    const Py_ssize_t n = bitgen != NULL ? rout_v->shape[0] : pos_v->shape[0];
    const Py_ssize_t slots = (Py_ssize_t)(per_env * n_envs);
    const Py_ssize_t capacity = (Py_ssize_t)((per_env + 1) * n_envs);
    Py_ssize_t action_bytes;
    if ((env_v != NULL && env_v->shape[0] != n) || row_bytes(final_v, slots, "final_at") != 4 ||
        (action_bytes = row_bytes(act_v, slots, "actions")) < 0 ||
        row_bytes(rew_v, slots, "rewards") != 4 || row_bytes(done_v, slots, "dones") != 1 ||
        row_bytes(tout_v, slots, "timeouts") != 1 ||
        row_bytes(aout_v, n, "actions out") != action_bytes ||
        row_bytes(rout_v, n, "rewards out") != 4 || row_bytes(dout_v, n, "dones out") != 4) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError,
                            "envs must match positions; final_at, rewards and dones out are "
                            "4-byte, dones and timeouts 1-byte, outs as their sources' rows");
        }
        views_release(&v);
        return NULL;
    }
    const char *col[MAX_FIELDS], *side_buf[MAX_FIELDS];
    char *obs_out[MAX_FIELDS], *next_out[MAX_FIELDS];
    Py_ssize_t field_bytes[MAX_FIELDS], side_rows = -1;
    for (Py_ssize_t j = 0; j < fields; j++) {
        Py_buffer *c, *s, *o, *x;
        if ((c = acquire(&v, PyTuple_GET_ITEM(columns, j), 0, NULL, 0, "a column")) == NULL ||
            (s = acquire(&v, PyTuple_GET_ITEM(side, j), 0, NULL, 0, "a side array")) == NULL ||
            (o = acquire(&v, PyTuple_GET_ITEM(obs_outs, j), 1, NULL, 0, "an obs out")) == NULL ||
            (x = acquire(&v, PyTuple_GET_ITEM(next_outs, j), 1, NULL, 0, "a next out")) == NULL) {
            views_release(&v);
            return NULL;
        }
        Py_ssize_t rb = row_bytes(c, capacity, "a column");
        if (rb < 0 || (s->shape[0] > 0 && s->len / s->shape[0] != rb) ||
            (side_rows >= 0 && s->shape[0] != side_rows) ||
            row_bytes(o, n, "an obs out") != rb || row_bytes(x, n, "a next out") != rb) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError,
                                "side arrays and outs must have their column's row bytes, and "
                                "the side arrays one length");
            }
            views_release(&v);
            return NULL;
        }
        side_rows = s->shape[0];
        col[j] = (const char *)c->buf;
        side_buf[j] = (const char *)s->buf;
        obs_out[j] = (char *)o->buf;
        next_out[j] = (char *)x->buf;
        field_bytes[j] = rb;
    }
    const int64_t *positions, *envs;
    int64_t *drawn = NULL;
    if (bitgen != NULL) {
        if ((drawn = PyMem_Malloc((size_t)(2 * n + 1) * sizeof(int64_t))) == NULL) {
            views_release(&v);
            return PyErr_NoMemory();
        }
        draw_bounded(bitgen, high, drawn, n);
        draw_bounded(bitgen, n_envs, drawn + n, n);
        positions = drawn;
        envs = drawn + n;
    }
    else {
        positions = (const int64_t *)pos_v->buf;
        envs = (const int64_t *)env_v->buf;
    }
    const int32_t *final_at = (const int32_t *)final_v->buf;
    for (Py_ssize_t i = 0; i < n; i++) { /* validate, then write */
        if (positions[i] < 0 || positions[i] >= per_env || envs[i] < 0 || envs[i] >= n_envs) {
            PyErr_Format(PyExc_ValueError,
                         "positions must be in 0 .. %lld and envs in 0 .. %lld (entry %zd: "
                         "%lld, %lld)", per_env - 1, n_envs - 1, i, (long long)positions[i],
                         (long long)envs[i]);
            PyMem_Free(drawn);
            views_release(&v);
            return NULL;
        }
        int32_t at = final_at[positions[i] * n_envs + envs[i]];
        if (at < 0 || at > side_rows) {
            PyErr_Format(PyExc_ValueError, "final_at names side slot %d of %zd", at - 1,
                         side_rows);
            PyMem_Free(drawn);
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
        const int64_t p = positions[i], e = envs[i], flat = p * n_envs + e;
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
    PyMem_Free(drawn);
    views_release(&v);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"transitions", transitions, METH_VARARGS,
     "transitions(draw, envs, ring, columns, side, final_at, steps, outs): transitions at "
     "SB3 positions of envs, or drawn as SB3 draws them, gathered into outs (see the "
     "module's source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "rlreplay.integrations.sb3._transitions",
    "Compiled uniform sampling of the SB3 buffers (see steps.py).", -1, methods,
};

PyMODINIT_FUNC
PyInit__transitions(void)
{
    return PyModule_Create(&module);
}
