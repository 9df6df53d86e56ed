/*
 * rlreplay.writers._blocks: the plan of one block of an n-step adder's calls (see
 * nstep_blocks.py, whose numpy settle is this kernel's twin and is tested against it).
 *
 * plan() replays the recorded calls of a block environment by environment, exactly as the
 * per-call path (episode_steps.py, pieces.py, nstep.py) does them, but without touching a
 * row of data: it says where each recorded step goes in the scratch rows, which pieces
 * are cut (by call, ended episodes before full chunks, by environment), which scratch
 * rows each piece stages with their discounts and the reward windows of their n-step
 * returns, the items of each piece, and the episodes' state after the block. The caller
 * moves the rows with numpy (one gather or scatter per field).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { K_, E_, PAD, N_, LAG, CHUNK, SPAN, STACK, SAME_STEP, WIDTH, LAST_E, LAST_S, HAS_LAST,
       CAP, NPARAMS };

#define NBUF 20

typedef struct {
    Py_buffer view[NBUF];
    int acquired;
} Buffers;

static void
release_all(Buffers *b)
{
    for (int j = 0; j < b->acquired; j++) {
        PyBuffer_Release(&b->view[j]);
    }
    b->acquired = 0;
}

/* Output cursor with a capacity: fails (returns 0) instead of writing past the end. */
typedef struct {
    int64_t *p;
    Py_ssize_t n, cap;
} Out;

static inline int
put(Out *o, int64_t v)
{
    if (o->n >= o->cap) {
        return 0;
    }
    o->p[o->n++] = v;
    return 1;
}

static PyObject *
plan(PyObject *self, PyObject *args)
{
    static const char *names[NBUF] = {
        "params", "truncated", "terminated", "powers", "steps", "appended", "serial", "next_item",
        "base", "awaiting", "steps_out", "first_out", "rows_out", "window_out", "disc_out",
        "pieces_out", "rel_out", "ext_out", "held_out", "origin"};
    static const Py_ssize_t item[NBUF] = {8, 1, 1, 8, 8, 8, 8, 8, 8, 1, 8, 8, 8, 8, 8, 8, 8, 8,
                                          8, 8};
    PyObject *obj[NBUF];
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOOOOOOOO:plan", &obj[0], &obj[1], &obj[2],
                          &obj[3], &obj[4], &obj[5], &obj[6], &obj[7], &obj[8], &obj[9],
                          &obj[10], &obj[11], &obj[12], &obj[13], &obj[14], &obj[15], &obj[16],
                          &obj[17], &obj[18], &obj[19])) {
        return NULL;
    }
    Buffers b = {.acquired = 0};
    for (int j = 0; j < NBUF; j++) {
        int writable = j >= 4 && j != 3;
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_ND | (writable ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(obj[j], &b.view[j], flags) < 0) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s must be a %sC-contiguous array", names[j],
                         writable ? "writable " : "");
            release_all(&b);
            return NULL;
        }
        b.acquired++;
        if (b.view[j].itemsize != item[j]) {
            PyErr_Format(PyExc_TypeError, "%s must hold %zd-byte items", names[j], item[j]);
            release_all(&b);
            return NULL;
        }
    }
#define LEN(j) (b.view[j].len / item[j])
    const int64_t *prm = (const int64_t *)b.view[0].buf;
    if (LEN(0) < NPARAMS) {
        PyErr_SetString(PyExc_ValueError, "params is too short");
        release_all(&b);
        return NULL;
    }
    const int64_t K = prm[K_], E = prm[E_], pad = prm[PAD], n = prm[N_], lag = prm[LAG];
    const int64_t chunk = prm[CHUNK], span = prm[SPAN], stack = prm[STACK];
    const int same_step = prm[SAME_STEP] != 0;
    const int64_t W = prm[WIDTH], cap = prm[CAP];
    int64_t last_e = prm[LAST_E], last_s = prm[LAST_S];
    int has_last = prm[HAS_LAST] != 0;
    if (K < 0 || E < 1 || LEN(1) < K * E || LEN(2) < K * E || LEN(3) < n + 1 || LEN(4) < E ||
        LEN(5) < E || LEN(6) < E || LEN(7) < E || LEN(8) < E || LEN(9) < E || LEN(18) < E * (cap + 1) || LEN(19) < E ||
        LEN(13) < LEN(12) * n || LEN(14) < LEN(12) || LEN(17) < LEN(16)) {
        PyErr_SetString(PyExc_ValueError, "an array is shorter than the block needs");
        release_all(&b);
        return NULL;
    }
    const uint8_t *trunc = (const uint8_t *)b.view[1].buf;
    const uint8_t *term = (const uint8_t *)b.view[2].buf;
    const double *powers = (const double *)b.view[3].buf;
    int64_t *steps = (int64_t *)b.view[4].buf, *appended = (int64_t *)b.view[5].buf;
    int64_t *serial = (int64_t *)b.view[6].buf, *next_item = (int64_t *)b.view[7].buf;
    int64_t *base = (int64_t *)b.view[8].buf;
    uint8_t *awaiting = (uint8_t *)b.view[9].buf;
    /* (source, destination) pairs: sources in the first half, destinations in the second */
    Out steps_src = {(int64_t *)b.view[10].buf, 0, LEN(10) / 2};
    Out steps_dst = {(int64_t *)b.view[10].buf + LEN(10) / 2, 0, LEN(10) / 2};
    Out first_src = {(int64_t *)b.view[11].buf, 0, LEN(11) / 2};
    Out first_dst = {(int64_t *)b.view[11].buf + LEN(11) / 2, 0, LEN(11) / 2};
    Out rows_out = {(int64_t *)b.view[12].buf, 0, LEN(12)};
    int64_t *window_out = (int64_t *)b.view[13].buf;
    const int64_t zero = E * W - 1; /* a scratch row never written: its reward is 0 */
    double *disc_out = (double *)b.view[14].buf;
    Out pieces_out = {(int64_t *)b.view[15].buf, 0, LEN(15)};
    Out rel_out = {(int64_t *)b.view[16].buf, 0, LEN(16)};
    int64_t *ext_out = (int64_t *)b.view[17].buf;
    int64_t *held_out = (int64_t *)b.view[18].buf;
    /* origin[i]: scratch position (within env i's W rows) of its first held row (of a
     * waiting env: where its next episode starts); updated for the next block */
    int64_t *origin = (int64_t *)b.view[19].buf;

    /* cur: scratch position (within the env's W rows) of the current row, the one whose
     * observation is known and whose step comes next; z: position of episode row 0. An
     * env waiting for its reset starts its next episode at cur. */
    int64_t *cur = PyMem_Malloc(sizeof(int64_t) * 2 * (size_t)E);
    if (cur == NULL) {
        release_all(&b);
        return PyErr_NoMemory();
    }
    int64_t *z = cur + E;
    for (int64_t i = 0; i < E; i++) {
        cur[i] = awaiting[i] ? origin[i] : origin[i] + pad + steps[i] - base[i];
        z[i] = origin[i] - base[i];
    }
    int64_t copied = 0, episodes = 0;
    int ok = 1;

/* Cut env i's piece (see EpisodePieces.cut): its complete rows since the last piece and
 * the items they allow. */
#define CUT(i, is_end, is_term)                                                              \
    do {                                                                                     \
        int64_t lo = appended[i], total = steps[i];                                          \
        int64_t hi = pad + ((is_end) ? total + 1 : (total - lag + 1 > 0 ? total - lag + 1 : 0)); \
        int64_t first = lo, count = 0, sw = 0;                                               \
        if (hi > lo) {                                                                       \
            if (!has_last || last_e != (i) || last_s != serial[i]) {                         \
                first = lo - (span - 1) > 0 ? lo - (span - 1) : 0;                           \
                sw = 1;                                                                      \
                copied += lo - first;                                                        \
            }                                                                                \
            count = hi - first;                                                              \
            for (int64_t r = first; r < hi; r++) {                                           \
                int64_t step_ = r - pad, left = total - step_;                               \
                Py_ssize_t at = rows_out.n;                                                  \
                ok &= put(&rows_out, (i) * W + z[i] + r);                                    \
                if (!ok) break;                                                              \
                double d;                                                                    \
                if (step_ < 0) {                                                             \
                    d = 0.0;                                                                 \
                    left = 0;                                                                \
                }                                                                            \
                else if (is_end) {                                                           \
                    d = left <= 0 ? 0.0 : powers[left < n ? left : n];                       \
                    if ((is_term) && left <= n) d = 0.0;                                     \
                }                                                                            \
                else {                                                                       \
                    d = powers[n];                                                           \
                }                                                                            \
                for (int64_t j = 0; j < n; j++)                                              \
                    window_out[at * n + j] = j < left ? (i) * W + z[i] + r + j : zero;       \
                disc_out[at] = d;                                                            \
            }                                                                                \
            has_last = 1;                                                                    \
            last_e = (i);                                                                    \
            last_s = serial[i];                                                              \
            if (!(is_end)) appended[i] = hi;                                                 \
        }                                                                                    \
        int64_t fi = next_item[i];                                                           \
        int64_t stop = (is_end) ? total : (hi - n - stack + 1 > fi ? hi - n - stack + 1 : fi); \
        for (int64_t t = fi; t < stop && ok; t++) {                                          \
            Py_ssize_t at = rel_out.n;                                                       \
            ok &= put(&rel_out, t - hi + rows_out.n); /* minus all rows, below */           \
            if (ok) ext_out[at] = stack + ((is_end) ? (total - t < n ? total - t : n) : n);  \
        }                                                                                    \
        next_item[i] = (is_end) ? 0 : stop;                                                  \
        if (count || stop > fi) {                                                            \
            ok &= put(&pieces_out, count);                                                   \
            ok &= put(&pieces_out, sw);                                                      \
            ok &= put(&pieces_out, stop > fi ? stop - fi : 0);                               \
        }                                                                                    \
        if (!(is_end)) {                                                                     \
            int64_t keep = hi - (span - 1);                                                  \
            if (keep > base[i]) base[i] = keep;                                              \
        }                                                                                    \
    } while (0)

    for (int64_t k = 0; k < K && ok; k++) {
        for (int64_t i = 0; i < E && ok; i++) {
            int64_t src = k * E + i;
            if (!same_step && awaiting[i]) { /* the ignored step starts the next episode */
                for (int64_t j = 0; j <= pad; j++) {
                    ok &= put(&first_src, src);
                    ok &= put(&first_dst, i * W + cur[i] + j);
                }
                awaiting[i] = 0;
                serial[i] += 1;
                steps[i] = appended[i] = next_item[i] = base[i] = 0;
                z[i] = cur[i];
                cur[i] += pad;
                continue;
            }
            ok &= put(&steps_src, src);
            ok &= put(&steps_dst, i * W + cur[i]);
            steps[i] += 1;
            cur[i] += 1;
            if (!term[src] && !trunc[src]) {
                continue;
            }
            CUT(i, 1, term[src]);
            episodes += 1;
            steps[i] = appended[i] = next_item[i] = base[i] = 0;
            if (same_step) { /* the returned observation starts the next episode now */
                for (int64_t j = 0; j <= pad; j++) {
                    ok &= put(&first_src, src);
                    ok &= put(&first_dst, i * W + cur[i] + 1 + j);
                }
                serial[i] += 1;
                z[i] = cur[i] + 1;
                cur[i] += 1 + pad;
            }
            else {
                awaiting[i] = 1;
                cur[i] += 1;
            }
        }
        for (int64_t i = 0; i < E && ok; i++) { /* open episodes holding a full chunk */
            /* not an env whose episode ended in this call (now waiting, or restarted with
             * no step yet: neither holds a chunk) */
            if (awaiting[i] || (same_step && (term[k * E + i] || trunc[k * E + i]))) {
                continue;
            }
            int64_t ready = pad + (steps[i] - lag + 1 > 0 ? steps[i] - lag + 1 : 0);
            if (ready - appended[i] >= chunk) {
                CUT(i, 0, 0);
            }
        }
    }
#undef CUT
    /* item starts relative to the block's last staged row */
    for (Py_ssize_t k = 0; k < rel_out.n; k++) {
        rel_out.p[k] -= rows_out.n;
    }
    for (int64_t i = 0; i < E; i++) { /* the rows each env still holds, and where */
        int64_t from = awaiting[i] ? cur[i] : z[i] + base[i];
        origin[i] = from;
        for (int64_t j = 0; j < cap; j++) { /* (rows past the env's W are never held) */
            held_out[i * cap + j] = i * W + (from + j < W ? from + j : W - 1);
        }
        held_out[E * cap + i] = awaiting[i] ? 0 : pad + steps[i] + 1 - base[i];
    }
    PyMem_Free(cur);
    release_all(&b);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "an output array is too short for the block");
        return NULL;
    }
    return Py_BuildValue("nnnnnLLLLi", steps_src.n, first_src.n, rows_out.n,
                         pieces_out.n / 3, rel_out.n, (long long)copied, (long long)episodes,
                         (long long)last_e, (long long)last_s, has_last);
#undef LEN
}

/* copy_rows(dst, dst_rows, src, src_rows, offset): dst[dst_rows[k] + offset] = src[src_rows[k]]
 * for every k, rows of the two arrays' first axis (a None index: rows 0, 1, ...). */
static PyObject *
copy_rows(PyObject *self, PyObject *args)
{
    PyObject *dst_obj, *dst_idx_obj, *src_obj, *src_idx_obj;
    Py_ssize_t offset;
    if (!PyArg_ParseTuple(args, "OOOOn:copy_rows", &dst_obj, &dst_idx_obj, &src_obj,
                          &src_idx_obj, &offset)) {
        return NULL;
    }
    Py_buffer v[4];
    int got = 0;
    PyObject *objs[4] = {dst_obj, src_obj, dst_idx_obj, src_idx_obj};
    int flags[4] = {PyBUF_C_CONTIGUOUS | PyBUF_ND | PyBUF_WRITABLE, PyBUF_C_CONTIGUOUS | PyBUF_ND,
                    PyBUF_C_CONTIGUOUS | PyBUF_ND, PyBUF_C_CONTIGUOUS | PyBUF_ND};
    int have[4] = {1, 1, dst_idx_obj != Py_None, src_idx_obj != Py_None};
    PyObject *result = NULL;
    for (int j = 0; j < 4; j++) {
        if (!have[j]) {
            continue;
        }
        if (PyObject_GetBuffer(objs[j], &v[j], flags[j]) < 0) {
            goto done;
        }
        got |= 1 << j;
        if (j >= 2 && v[j].itemsize != 8) {
            PyErr_SetString(PyExc_TypeError, "row indexes must be int64");
            goto done;
        }
        if (j < 2 && v[j].ndim < 1) {
            PyErr_SetString(PyExc_ValueError, "dst and src must have a first axis");
            goto done;
        }
    }
    Py_ssize_t dst_n = v[0].shape[0], src_n = v[1].shape[0];
    Py_ssize_t row = dst_n ? v[0].len / dst_n : 0;
    if (src_n && v[1].len / src_n != row) {
        PyErr_SetString(PyExc_ValueError, "dst and src rows differ in size");
        goto done;
    }
    Py_ssize_t m = have[2] ? v[2].len / 8 : (have[3] ? v[3].len / 8 : src_n);
    if ((have[2] && v[2].len / 8 != m) || (have[3] && v[3].len / 8 != m)) {
        PyErr_SetString(PyExc_ValueError, "dst_rows and src_rows differ in length");
        goto done;
    }
    const int64_t *di = have[2] ? (const int64_t *)v[2].buf : NULL;
    const int64_t *si = have[3] ? (const int64_t *)v[3].buf : NULL;
    char *dst = (char *)v[0].buf;
    const char *src = (const char *)v[1].buf;
    for (Py_ssize_t k = 0; k < m; k++) {
        int64_t d = (di ? di[k] : k) + offset, s_ = si ? si[k] : k;
        if (d < 0 || d >= dst_n || s_ < 0 || s_ >= src_n) {
            PyErr_Format(PyExc_IndexError, "row %lld -> %lld is outside src (%zd) or dst (%zd)",
                         (long long)s_, (long long)d, src_n, dst_n);
            goto done;
        }
        memcpy(dst + d * row, src + s_ * row, (size_t)row);
    }
    result = Py_None;
    Py_INCREF(result);
done:
    for (int j = 0; j < 4; j++) {
        if (got & (1 << j)) {
            PyBuffer_Release(&v[j]);
        }
    }
    return result;
}

static PyMethodDef methods[] = {
    {"copy_rows", copy_rows, METH_VARARGS,
     "copy_rows(dst, dst_rows, src, src_rows, offset): dst[dst_rows[k] + offset] = "
     "src[src_rows[k]] for every k (rows of the first axis; None: rows 0, 1, ...); both "
     "arrays C-contiguous with rows of one size, the indexes int64.\n"
     "Raises IndexError for a row outside either array (rows before it are copied)."},
    {"plan", plan, METH_VARARGS,
     "plan(params, truncated, terminated, powers, steps, appended, serial, next_item, base, "
     "awaiting, steps_out, first_out, rows_out, window_out, disc_out, pieces_out, rel_out, "
     "ext_out, held_out, origin) -> (steps, firsts, rows, pieces, items, copied_rows, episodes, "
     "last_env, last_serial, has_last): the plan of one block of an n-step adder's calls "
     "(see NStepBlock._run_plan); updates the episode state arrays in place."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "rlreplay.writers._blocks",
    "The plan of a block of an n-step adder's calls (see nstep_blocks.py).", -1, methods,
};

PyMODINIT_FUNC
PyInit__blocks(void)
{
    return PyModule_Create(&module);
}
