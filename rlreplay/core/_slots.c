/*
 * Compiled loops for the per-slot state of a table's items (see item_slots.py).
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

static PyObject *
claim_range(PyObject *self, PyObject *args)
{
    Py_ssize_t start, origin = 0;
    double fill;
    PyObject *keys_obj, *state_obj, *live_obj, *prios_obj;
    if (!PyArg_ParseTuple(args, "nOOOOd|n:claim_range", &start, &keys_obj, &state_obj,
                          &live_obj, &prios_obj, &fill, &origin) ||
        check_origin(origin) < 0) {
        return NULL;
    }
    Py_buffer kv, sv, lv, pv;
    Py_ssize_t cap;
    SlotRecords records;
    int has_prios = prios_obj != Py_None;
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
    Py_ssize_t n = kv.shape[0];
    if (lv.shape[0] != cap) {
        PyErr_SetString(PyExc_ValueError, "state and live must have one entry per slot");
    }
    else if (start < 0 || n > cap - start) {
        PyErr_Format(PyExc_ValueError, "slots [%zd, %zd) leave the table's %zd slots", start,
                     start + n, cap);
    }
    else if (has_prios && pv.shape[0] != n) {
        PyErr_SetString(PyExc_ValueError, "priorities must have one entry per new item");
    }
    else {
        int64_t *keys = (int64_t *)kv.buf;
        const double *given = has_prios ? (const double *)pv.buf : NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            SlotState *rec = slot_record(&records, start + i);
            uint32_t g = next_generation(rec->generation);
            rec->generation = g;
            rec->times_sampled = 0;
            if (records.has_priority) {
                *slot_priority(&records, start + i) = given ? given[i] : fill;
            }
            keys[i] = make_key(g, start + i, (uint32_t)origin);
        }
        memset((char *)lv.buf + start, 1, (size_t)n);
        result = Py_NewRef(Py_None);
    }
    if (has_prios) {
        PyBuffer_Release(&pv);
    }
    PyBuffer_Release(&lv);
    PyBuffer_Release(&sv);
    PyBuffer_Release(&kv);
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
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "rlreplay.core._slots",
    "Compiled loops for the per-slot state of a table's items (see item_slots.py).", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__slots(void)
{
    return PyModule_Create(&module);
}
