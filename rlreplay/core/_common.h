/*
 * Shared by rlreplay's compiled modules (_draws.c, _slots.c).
 *
 * SlotRecords             a table's per-slot item records (see item_index.py): 8 bytes
 *                         (generation, times sampled) or 16 (and the priority).
 * format_is(fmt, codes)   whether a struct format is one of the one-letter codes.
 * get_buffer(...)         a C-contiguous buffer of an array argument, checked; on failure
 *                         a TypeError naming the argument, and nothing acquired.
 * get_slot_records(...)   the table's records, passed as their bytes (uint8).
 * stream_copy(to, from, n) memcpy with streaming stores, for large copies.
 */

#ifndef RLREPLAY_COMMON_H
#define RLREPLAY_COMMON_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

/* The layout of ItemIndex.slot_state's dtype: generation u4, times_sampled u4 and, in the
 * 16-byte records of tables whose selectors use priorities, priority f8. One record per
 * slot, so an item's state is one cache line read, not three; tables whose selectors
 * ignore priorities keep no priority (8-byte records). */
typedef struct {
    uint32_t generation;
    uint32_t times_sampled;
} SlotState;

/* The records of a table's slots: `stride` bytes each (8 or 16); the priority, when the
 * records hold one, is the double at byte 8. */
typedef struct {
    char *base;
    Py_ssize_t stride;
    int has_priority;
} SlotRecords;

static inline SlotState *
slot_record(const SlotRecords *r, int64_t slot)
{
    return (SlotState *)(r->base + slot * r->stride);
}

static inline double *
slot_priority(const SlotRecords *r, int64_t slot)
{
    return (double *)(r->base + slot * r->stride + 8);
}

/* Keys and generations (see keys.py): key = generation << 32 | slot. A record's generation
 * field counts the slot's items, 1 .. 2**31 - 1 and round again (0: none yet); its top bit
 * is set once that count has gone round. A key's generation is that count moved by the
 * table's generation origin (0 .. 2**31 - 2), so tables issue different keys. */
#define KEY_SLOT_BITS 32
#define KEY_SLOT_MASK 0xFFFFFFFFLL
#define GENERATION_MASK 0x7FFFFFFFu
#define GENERATION_CYCLED 0x80000000u

/* The generation field after a new item takes the slot. */
static inline uint32_t
next_generation(uint32_t field)
{
    uint32_t g = field + 1; /* 0x7FFFFFFF + 1 and 0xFFFFFFFF + 1 both leave 0 below */
    return (g & GENERATION_MASK) == 0 ? (GENERATION_CYCLED | 1u) : g;
}

/* The key of the item in `slot` whose record's generation field is `field`, in a table
 * whose generation origin is `origin`. */
static inline int64_t
make_key(uint32_t field, int64_t slot, uint32_t origin)
{
    uint64_t g = (uint64_t)(field & GENERATION_MASK) + origin;
    if (g > GENERATION_MASK) {
        g -= GENERATION_MASK;
    }
    return (int64_t)((g << KEY_SLOT_BITS) | (uint64_t)slot);
}

/* The item count a key's generation `gen` (0 .. 2**31 - 1) stands for in a table whose
 * generation origin is `origin`: 1 .. 2**31 - 1, or 0 for generation 0 (never issued). */
static inline int64_t
relative_generation(int64_t gen, uint32_t origin)
{
    if (gen < 1) {
        return 0;
    }
    int64_t rel = gen - (int64_t)origin;
    return rel <= 0 ? rel + (int64_t)GENERATION_MASK : rel;
}

/* Whether item count `rel` (from relative_generation) can never have been issued for a
 * slot whose generation field is `field`: 0, or beyond the slot's count while it has not
 * cycled. */
static inline int
generation_unissued(int64_t rel, uint32_t field)
{
    return rel < 1 || (!(field & GENERATION_CYCLED) && rel > (int64_t)field);
}

/* Parse a generation origin argument; -1 with ValueError when outside 0 .. 2**31 - 2. */
static inline int
check_origin(Py_ssize_t origin)
{
    if (origin < 0 || origin >= (Py_ssize_t)GENERATION_MASK) {
        PyErr_Format(PyExc_ValueError, "origin=%zd must be in 0 .. 2**31 - 2", origin);
        return -1;
    }
    return 0;
}

/* Whether a buffer format is the one-letter struct code `code`, ignoring a byte-order
 * prefix that means native order on this machine. */
static inline int
format_is(const char *fmt, const char *codes)
{
    if (fmt == NULL) {
        return 0;
    }
    if (fmt[0] == '@' || fmt[0] == '=' || fmt[0] == '<') {
        fmt++;
    }
    return fmt[0] != '\0' && fmt[1] == '\0' && strchr(codes, fmt[0]) != NULL;
}

/* A C-contiguous buffer; with `codes`, also one-dimensional of that element kind. */
static inline int
get_buffer(PyObject *obj, Py_buffer *view, int writable, const char *codes, Py_ssize_t itemsize,
           const char *what)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_ND | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a %sC-contiguous array", what,
                     writable ? "writable " : "");
        return -1;
    }
    if (codes != NULL &&
        (view->ndim != 1 || view->itemsize != itemsize || !format_is(view->format, codes))) {
        PyErr_Format(PyExc_TypeError, "%s must be a one-dimensional array of %zd-byte '%s' "
                     "items (got format %s, %d dimensions)", what, itemsize, codes,
                     view->format ? view->format : "B", view->ndim);
        PyBuffer_Release(view);
        return -1;
    }
    if (codes == NULL && view->ndim < 1) {
        PyErr_Format(PyExc_TypeError, "%s must have at least one dimension", what);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* The records of a table's slots from their bytes: a uint8 array of shape (slots, 8) or
 * (slots, 16), or one-dimensional holding 16-byte records; *count gets the slots. */
static inline int
get_slot_records(PyObject *obj, Py_buffer *view, SlotRecords *records, Py_ssize_t *count)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_ND | PyBUF_WRITABLE;
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "state must be a writable C-contiguous array");
        return -1;
    }
    Py_ssize_t stride = view->ndim == 2 ? view->shape[1] : 16;
    if (view->itemsize != 1 || !format_is(view->format, "B") || view->ndim < 1 ||
        view->ndim > 2 || (stride != 8 && stride != 16) || view->len % stride != 0 ||
        ((uintptr_t)view->buf % 8) != 0) {
        PyErr_SetString(PyExc_TypeError,
                        "state must be the bytes of aligned slot records: uint8 of shape "
                        "(slots, 8) or (slots, 16), or one-dimensional of 16-byte records");
        PyBuffer_Release(view);
        return -1;
    }
    records->base = (char *)view->buf;
    records->stride = stride;
    records->has_priority = stride == 16;
    *count = view->len / stride;
    return 0;
}

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#define HAVE_STREAM 1
#endif

/* memcpy with streaming stores: for copies larger than the caches anyway (a batch of
 * image frames into the store, sampled frames into a batch), which are then not read
 * back at once. Streaming stores skip reading every destination line into the cache
 * first, a third of the memory traffic of the copy. */
static inline void
stream_copy(char *to, const char *from, size_t n)
{
#ifdef HAVE_STREAM
    size_t head = (16 - ((uintptr_t)to & 15)) & 15;
    if (n < head + 64) {
        memcpy(to, from, n);
        return;
    }
    memcpy(to, from, head);
    to += head;
    from += head;
    n -= head;
    size_t blocks = n / 64;
    for (size_t i = 0; i < blocks; i++, to += 64, from += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)from);
        __m128i b = _mm_loadu_si128((const __m128i *)(from + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(from + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(from + 48));
        _mm_stream_si128((__m128i *)to, a);
        _mm_stream_si128((__m128i *)(to + 16), b);
        _mm_stream_si128((__m128i *)(to + 32), c);
        _mm_stream_si128((__m128i *)(to + 48), d);
    }
    _mm_sfence();
    memcpy(to, from, n % 64);
#else
    memcpy(to, from, n);
#endif
}

#endif
