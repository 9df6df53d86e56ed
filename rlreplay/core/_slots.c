/*
 * Compiled loops for the per-slot state of a table's items (see item_index.py).
 *
 * held_slots(keys, state, live, values, out_slots, out_values, origin=0) -> (kept, stale)
 *     A key is generation << 32 | slot, its generation moved by the table's generation
 *     origin (see keys.py). For each key whose slot holds the item of that
 *     generation, the slot (and values[i], when values is given) is written to the
 *     outputs, once per slot: of several keys for one slot the last one wins, and the
 *     kept entries keep the order of those last occurrences. Keys of items no longer held
 *     are counted in `stale`, once per occurrence. values, when given, must be finite and
 *     >= 0 (priorities).
 *
 *     Returns None, writing nothing, when any key is not a key this table could have
 *     issued (negative, a slot outside the table, generation 0, or beyond the slot's item
 *     count while the slot's generation has not cycled; see keys.py)
 *     or any value is NaN, infinite or negative: the caller then takes its Python path,
 *     which names the bad entries in its error.
 *
 *     Buffers must be C-contiguous: keys and out_slots int64, state the bytes of the
 *     slots' records (uint8 of shape (slots, 8) or (slots, 16), see _common.h), live bool, values and out_values float64 (both None,
 *     or both given).
 *
 * claim_range(start, keys_out, state, live, priorities, fill, origin=0)
 *     New items in the slots start .. start + n - 1 (n = len(keys_out)): each slot's
 *     generation steps to the next (2**31 - 1 is followed by 1, see keys.py), its
 *     priority (in records that hold one) becomes priorities[i] (or fill when priorities is
 *     None), its sample count 0, it is marked live, and its key goes to keys_out[i]. Raises ValueError, writing nothing, when the range leaves the
 *     table or the sizes disagree.
 *
 * claim_slots(slots, keys_out, state, live, priorities, fill, origin=0)
 *     claim_range for the distinct slots listed in slots (int64, C-contiguous): keys_out[i]
 *     is the key of slots[i]. Raises ValueError, writing nothing, when a slot lies outside
 *     the table or the sizes disagree.
 *
 * sparse_delete(dense, where, size, slots) -> new size
 *     Takes the distinct held slots (int64) out of a sparse set (dense int32: the held
 *     slots in its first `size` entries; where int32: each slot's position in dense) as
 *     Uniform.delete's numpy path does: the holes they leave below the new size, in the
 *     order of slots, take the kept entries of the tail in tail order. Raises ValueError,
 *     writing nothing, when a slot is not held or the sizes disagree.
 *
 * The caller holds the lock that protects the per-slot arrays.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_common.h"

#define SLOT_BITS KEY_SLOT_BITS
#define SLOT_MASK KEY_SLOT_MASK
#define EMPTY (-1)

/* Open-addressing set of slots (capacity a power of two, at least twice the keys). */
static inline int
seen_before(int64_t *set, size_t mask, int64_t slot)
{
    size_t h = ((uint64_t)slot * 0x9E3779B97F4A7C15ULL) >> 20;
    for (;; h++) {
        int64_t *cell = &set[h & mask];
        if (*cell == slot) {
            return 1;
        }
        if (*cell == EMPTY) {
            *cell = slot;
            return 0;
        }
    }
}

static PyObject *
held_slots(PyObject *self, PyObject *args)
{
    PyObject *objs[6];
    Py_ssize_t origin_arg = 0;
    if (!PyArg_ParseTuple(args, "OOOOOO|n:held_slots", &objs[0], &objs[1], &objs[2], &objs[3],
                          &objs[4], &objs[5], &origin_arg) ||
        check_origin(origin_arg) < 0) {
        return NULL;
    }
    const uint32_t origin = (uint32_t)origin_arg;
    int with_values = objs[3] != Py_None;
    if (with_values != (objs[5] != Py_None)) {
        PyErr_SetString(PyExc_TypeError, "values and out_values must both be None or arrays");
        return NULL;
    }
    static const char *names[6] = {"keys", "state", "live", "values", "out_slots",
                                   "out_values"};
    static const char *codes[6] = {"ql", "B", "?", "d", "ql", "d"};
    static const Py_ssize_t sizes[6] = {8, 1, 1, 8, 8, 8};
    static const int writable[6] = {0, 0, 0, 0, 1, 1};
    Py_buffer v[6];
    int acquired[6] = {0};
    PyObject *result = NULL;
    int64_t *set = NULL;
    Py_ssize_t cap = 0;
    SlotRecords records;
    for (int a = 0; a < 6; a++) {
        if (objs[a] == Py_None) {
            continue;
        }
        int failed = a == 1 ? get_slot_records(objs[a], &v[a], &records, &cap)
                            : get_buffer(objs[a], &v[a], writable[a], codes[a], sizes[a],
                                         names[a]);
        if (failed < 0) {
            goto done;
        }
        acquired[a] = 1;
    }
    Py_ssize_t n = v[0].shape[0];
    if (v[2].shape[0] != cap) {
        PyErr_SetString(PyExc_ValueError, "state and live must have one entry per slot");
        goto done;
    }
    if (v[4].shape[0] != n || (with_values && (v[3].shape[0] != n || v[5].shape[0] != n))) {
        PyErr_SetString(PyExc_ValueError,
                        "values, out_slots and out_values must have one entry per key");
        goto done;
    }
    const int64_t *keys = (const int64_t *)v[0].buf;
    const char *live = (const char *)v[2].buf;
    const double *values = with_values ? (const double *)v[3].buf : NULL;
    int64_t *out_slots = (int64_t *)v[4].buf;
    double *out_values = with_values ? (double *)v[5].buf : NULL;
    for (Py_ssize_t i = 0; i < n; i++) { /* anything the Python path must name: no writes */
        int64_t k = keys[i];
        int64_t slot = k & SLOT_MASK;
        if (k < 0 || slot >= cap ||
            generation_unissued(relative_generation(k >> SLOT_BITS, origin),
                                slot_record(&records, slot)->generation) ||
            (with_values && !(values[i] >= 0.0 && values[i] < INFINITY))) {
            result = Py_NewRef(Py_None);
            goto done;
        }
    }
    size_t slots_in_set = 16;
    while (slots_in_set < (size_t)n * 2) {
        slots_in_set <<= 1;
    }
    set = (int64_t *)PyMem_RawMalloc(slots_in_set * sizeof(int64_t));
    if (set == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    memset(set, 0xFF, slots_in_set * sizeof(int64_t)); /* every cell EMPTY (-1) */
    Py_ssize_t kept = 0, stale = 0;
    Py_BEGIN_ALLOW_THREADS
    /* Backwards, so the last key of a slot is the one kept; reversed afterwards. */
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        int64_t slot = keys[i] & SLOT_MASK;
        uint32_t field = slot_record(&records, slot)->generation;
        if (!live[slot] || (int64_t)(field & GENERATION_MASK) !=
                               relative_generation(keys[i] >> SLOT_BITS, origin)) {
            stale++;
        }
        else if (!seen_before(set, slots_in_set - 1, slot)) {
            out_slots[kept] = slot;
            if (with_values) {
                out_values[kept] = values[i];
            }
            kept++;
        }
    }
    for (Py_ssize_t a = 0, b = kept - 1; a < b; a++, b--) {
        int64_t s = out_slots[a];
        out_slots[a] = out_slots[b];
        out_slots[b] = s;
        if (with_values) {
            double x = out_values[a];
            out_values[a] = out_values[b];
            out_values[b] = x;
        }
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("nn", kept, stale);
done:
    PyMem_RawFree(set);
    for (int a = 0; a < 6; a++) {
        if (acquired[a]) {
            PyBuffer_Release(&v[a]);
        }
    }
    return result;
}

/* claim_range (slots_obj NULL: the slots start .. start + n - 1) and claim_slots (the
 * slots listed in slots_obj): checks everything, then writes. */
static PyObject *
claim_common(Py_ssize_t start, PyObject *slots_obj, PyObject *keys_obj, PyObject *state_obj,
             PyObject *live_obj, PyObject *prios_obj, double fill, Py_ssize_t origin)
{
    if (check_origin(origin) < 0) {
        return NULL;
    }
    Py_buffer kv, sv, lv, pv, xv;
    Py_ssize_t cap;
    SlotRecords records;
    int has_prios = prios_obj != Py_None;
    int listed = slots_obj != NULL;
    PyObject *result = NULL;
    if (get_buffer(keys_obj, &kv, 1, "ql", 8, "keys_out") < 0) {
        return NULL;
    }
    if (get_slot_records(state_obj, &sv, &records, &cap) < 0) {
        PyBuffer_Release(&kv);
        return NULL;
    }
    if (get_buffer(live_obj, &lv, 1, "?", 1, "live") < 0) {
        PyBuffer_Release(&sv);
        PyBuffer_Release(&kv);
        return NULL;
    }
    if (has_prios && get_buffer(prios_obj, &pv, 0, "d", 8, "priorities") < 0) {
        PyBuffer_Release(&lv);
        PyBuffer_Release(&sv);
        PyBuffer_Release(&kv);
        return NULL;
    }
    if (listed && get_buffer(slots_obj, &xv, 0, "ql", 8, "slots") < 0) {
        if (has_prios) {
            PyBuffer_Release(&pv);
        }
        PyBuffer_Release(&lv);
        PyBuffer_Release(&sv);
        PyBuffer_Release(&kv);
        return NULL;
    }
    Py_ssize_t n = kv.shape[0];
    const int64_t *slots = listed ? (const int64_t *)xv.buf : NULL;
    Py_ssize_t outside = -1;
    if (listed) {
        for (Py_ssize_t i = 0; i < xv.shape[0] && outside < 0; i++) {
            if (slots[i] < 0 || slots[i] >= cap) {
                outside = i;
            }
        }
    }
    if (lv.shape[0] != cap) {
        PyErr_SetString(PyExc_ValueError, "state and live must have one entry per slot");
    }
    else if (!listed && (start < 0 || n > cap - start)) {
        PyErr_Format(PyExc_ValueError, "slots [%zd, %zd) leave the table's %zd slots", start,
                     start + n, cap);
    }
    else if (listed && xv.shape[0] != n) {
        PyErr_SetString(PyExc_ValueError, "slots and keys_out must have one entry per new item");
    }
    else if (outside >= 0) {
        PyErr_Format(PyExc_ValueError, "slot %lld leaves the table's %zd slots",
                     (long long)slots[outside], cap);
    }
    else if (has_prios && pv.shape[0] != n) {
        PyErr_SetString(PyExc_ValueError, "priorities must have one entry per new item");
    }
    else {
        int64_t *keys = (int64_t *)kv.buf;
        char *live = (char *)lv.buf;
        const double *given = has_prios ? (const double *)pv.buf : NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_ssize_t slot = listed ? (Py_ssize_t)slots[i] : start + i;
            SlotState *rec = slot_record(&records, slot);
            uint32_t g = next_generation(rec->generation);
            rec->generation = g;
            rec->times_sampled = 0;
            if (records.has_priority) {
                *slot_priority(&records, slot) = given ? given[i] : fill;
            }
            keys[i] = make_key(g, slot, (uint32_t)origin);
            if (listed) {
                live[slot] = 1;
            }
        }
        if (!listed) {
            memset(live + start, 1, (size_t)n);
        }
        result = Py_NewRef(Py_None);
    }
    if (listed) {
        PyBuffer_Release(&xv);
    }
    if (has_prios) {
        PyBuffer_Release(&pv);
    }
    PyBuffer_Release(&lv);
    PyBuffer_Release(&sv);
    PyBuffer_Release(&kv);
    return result;
}

static PyObject *
claim_range(PyObject *self, PyObject *args)
{
    Py_ssize_t start, origin = 0;
    double fill;
    PyObject *keys_obj, *state_obj, *live_obj, *prios_obj;
    if (!PyArg_ParseTuple(args, "nOOOOd|n:claim_range", &start, &keys_obj, &state_obj,
                          &live_obj, &prios_obj, &fill, &origin)) {
        return NULL;
    }
    return claim_common(start, NULL, keys_obj, state_obj, live_obj, prios_obj, fill, origin);
}

static PyObject *
claim_slots(PyObject *self, PyObject *args)
{
    Py_ssize_t origin = 0;
    double fill;
    PyObject *slots_obj, *keys_obj, *state_obj, *live_obj, *prios_obj;
    if (!PyArg_ParseTuple(args, "OOOOOd|n:claim_slots", &slots_obj, &keys_obj, &state_obj,
                          &live_obj, &prios_obj, &fill, &origin)) {
        return NULL;
    }
    return claim_common(0, slots_obj, keys_obj, state_obj, live_obj, prios_obj, fill, origin);
}

/* sparse_delete(dense, where, size, slots) -> new size: see the comment at the top. */
static PyObject *
sparse_delete(PyObject *self, PyObject *args)
{
    Py_ssize_t size;
    PyObject *dense_obj, *where_obj, *slots_obj;
    if (!PyArg_ParseTuple(args, "OOnO:sparse_delete", &dense_obj, &where_obj, &size,
                          &slots_obj)) {
        return NULL;
    }
    Py_buffer dv, wv, xv;
    if (get_buffer(dense_obj, &dv, 1, "i", 4, "dense") < 0) {
        return NULL;
    }
    if (get_buffer(where_obj, &wv, 1, "i", 4, "where") < 0) {
        PyBuffer_Release(&dv);
        return NULL;
    }
    if (get_buffer(slots_obj, &xv, 0, "ql", 8, "slots") < 0) {
        PyBuffer_Release(&wv);
        PyBuffer_Release(&dv);
        return NULL;
    }
    int32_t *dense = (int32_t *)dv.buf, *where = (int32_t *)wv.buf;
    const int64_t *slots = (const int64_t *)xv.buf;
    Py_ssize_t cap = dv.shape[0], k = xv.shape[0];
    PyObject *result = NULL;
    Py_ssize_t bad = -1;
    if (wv.shape[0] == cap && size >= k && size <= cap) {
        for (Py_ssize_t i = 0; i < k && bad < 0; i++) {
            int64_t s = slots[i];
            if (s < 0 || s >= cap || where[s] < 0 || where[s] >= size || dense[where[s]] != s) {
                bad = i;
            }
        }
    }
    if (wv.shape[0] != cap) {
        PyErr_SetString(PyExc_ValueError, "dense and where must have one entry per slot");
    }
    else if (size < k || size > cap) {
        PyErr_Format(PyExc_ValueError, "size %zd cannot hold %zd held slots", size, k);
    }
    else if (bad >= 0) {
        PyErr_Format(PyExc_ValueError, "slot %lld is not held", (long long)slots[bad]);
    }
    else {
        Py_ssize_t new_size = size - k, t = new_size;
        for (Py_ssize_t i = 0; i < k; i++) {  /* mark the deleted entries of the tail */
            int32_t p = where[slots[i]];
            if (p >= new_size) {
                dense[p] = EMPTY;
            }
        }
        for (Py_ssize_t i = 0; i < k; i++) {  /* holes in slot order take the kept tail */
            int32_t p = where[slots[i]];
            if (p < new_size) {
                while (dense[t] == EMPTY) {
                    t++;
                }
                int32_t keeper = dense[t++];
                dense[p] = keeper;
                where[keeper] = p;
            }
        }
        for (Py_ssize_t i = 0; i < k; i++) {  /* the tail as it was (past the new size) */
            int32_t p = where[slots[i]];
            if (p >= new_size) {
                dense[p] = (int32_t)slots[i];
            }
        }
        result = PyLong_FromSsize_t(new_size);
    }
    PyBuffer_Release(&xv);
    PyBuffer_Release(&wv);
    PyBuffer_Release(&dv);
    return result;
}

static PyMethodDef methods[] = {
    {"held_slots", held_slots, METH_VARARGS,
     "held_slots(keys, state, live, values, out_slots, out_values, origin=0) -> "
     "(kept, stale) or None.\n"
     "Writes the slots of held items among keys (last key of a slot wins) and their values "
     "to the first `kept` entries of the outputs and counts stale keys; returns None, "
     "writing nothing, if a key was never issued (for the table's generation origin) or a "
     "value is not finite and >= 0.\n"
     "Raises TypeError for a wrong buffer kind, ValueError for wrong sizes or origin."},
    {"claim_range", claim_range, METH_VARARGS,
     "claim_range(start, keys_out, state, live, priorities, fill, origin=0): "
     "new items in slots start .. start + len(keys_out) - 1: next generation, priority "
     "priorities[i] (fill when None; in records of 16 bytes), times 0, live; their keys "
     "(for the table's generation origin) written to keys_out.\n"
     "Raises TypeError for a wrong buffer kind, ValueError for a range outside the table or "
     "wrong sizes (nothing is written then)."},
    {"sparse_delete", sparse_delete, METH_VARARGS,
     "sparse_delete(dense, where, size, slots) -> new size: the distinct held slots taken "
     "out of a sparse set as Uniform.delete's numpy path does.\n"
     "Raises TypeError for a wrong buffer kind, ValueError for a slot not held or wrong "
     "sizes (nothing is written then)."},
    {"claim_slots", claim_slots, METH_VARARGS,
     "claim_slots(slots, keys_out, state, live, priorities, fill, origin=0): "
     "claim_range for the distinct slots listed in slots (int64), keys_out[i] the key of "
     "slots[i].\n"
     "Raises TypeError for a wrong buffer kind, ValueError for a slot outside the table or "
     "wrong sizes (nothing is written then)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "rlreplay.core._slots",
    "Compiled loops for the per-slot state of a table's items (see item_index.py).", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__slots(void)
{
    return PyModule_Create(&module);
}
