/* fastpickle.c - the pickles of frames of scalars, written and read without the pickle module.
 *
 * pickle.dumps makes a Pickler, a memo table and a 4 KiB output buffer for
 * every frame, pickle.loads an Unpickler with its stacks: most of their
 * ~0.3 us and ~0.2 us for the small frames of a call through a known site
 * and its VALUE reply, two of each on every round trip (B1, issue 30).  A
 * frame that holds only None, bools, ints of 64 bits, floats, strs and
 * tuples of them (exact types, 4 levels at most, 512 bytes at most) is
 * written here as the opcodes pickle.dumps(frame, 5) would write, less its
 * FRAME and MEMOIZE; pickle.loads reads it back equal, of the same types.
 * The reader takes exactly those opcodes (and BININT2, FRAME) and leaves
 * anything else to pickle.loads, so a frame pickle.dumps wrote, a malformed
 * one included, goes where it went before.
 */
#include "fastpickle.h"

#include <stdint.h>
#include <string.h>

/* --- writing --------------------------------------------------------------- */

enum { FAST_MAX = 512, FAST_DEPTH = 4 };

typedef struct {
    char buf[FAST_MAX];
    Py_ssize_t n;
} Fast;

static int fast_put(Fast *f, const void *bytes, Py_ssize_t len) {
    if (f->n + len > FAST_MAX) return 0;
    memcpy(f->buf + f->n, bytes, (size_t)len);
    f->n += len;
    return 1;
}

static int fast_op(Fast *f, unsigned char op) { return fast_put(f, &op, 1); }

/* 1 written, 0 not a frame of scalars (or too long): pickle.dumps's; -1 error. */
static int fast_object(Fast *f, PyObject *obj, int depth) {
    if (obj == Py_None) return fast_op(f, 'N');
    if (obj == Py_True) return fast_op(f, 0x88);
    if (obj == Py_False) return fast_op(f, 0x89);
    if (PyLong_CheckExact(obj)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
        unsigned char b[9];
        if (overflow) return 0;
        if (v == -1 && PyErr_Occurred()) return -1;
        if (v >= 0 && v < 256) {
            b[0] = 'K';
            b[1] = (unsigned char)v;
            return fast_put(f, b, 2);
        }
        if (v >= INT32_MIN && v <= INT32_MAX) {
            uint32_t u = (uint32_t)(int32_t)v;
            b[0] = 'J';
            for (int i = 0; i < 4; i++) b[1 + i] = (unsigned char)(u >> (8 * i));
            return fast_put(f, b, 5);
        }
        {
            uint64_t u = (uint64_t)v; /* LONG1: little-endian two's complement, 8 bytes */
            unsigned char l[10];
            l[0] = 0x8a;
            l[1] = 8;
            for (int i = 0; i < 8; i++) l[2 + i] = (unsigned char)(u >> (8 * i));
            return fast_put(f, l, 10);
        }
    }
    if (PyFloat_CheckExact(obj)) {
        unsigned char b[9];
        b[0] = 'G';
        if (PyFloat_Pack8(PyFloat_AS_DOUBLE(obj), (char *)b + 1, 0) < 0) return -1; /* big-endian, as pickle */
        return fast_put(f, b, 9);
    }
    if (PyUnicode_CheckExact(obj)) {
        Py_ssize_t len;
        const char *utf8 = PyUnicode_AsUTF8AndSize(obj, &len);
        unsigned char b[5];
        if (utf8 == NULL) { /* a lone surrogate: pickle writes it with surrogatepass */
            PyErr_Clear();
            return 0;
        }
        if (len < 256) {
            b[0] = 0x8c;
            b[1] = (unsigned char)len;
            return fast_put(f, b, 2) && fast_put(f, utf8, len);
        }
        if (len > FAST_MAX) return 0;
        b[0] = 'X';
        for (int i = 0; i < 4; i++) b[1 + i] = (unsigned char)((uint32_t)len >> (8 * i));
        return fast_put(f, b, 5) && fast_put(f, utf8, len);
    }
    if (PyTuple_CheckExact(obj) && depth < FAST_DEPTH) {
        Py_ssize_t i, n = PyTuple_GET_SIZE(obj);
        int rc;
        if (n == 0) return fast_op(f, ')');
        if (n > 3 && !fast_op(f, '(')) return 0;
        for (i = 0; i < n; i++) {
            rc = fast_object(f, PyTuple_GET_ITEM(obj, i), depth + 1);
            if (rc <= 0) return rc;
        }
        return fast_op(f, n == 1 ? 0x85 : n == 2 ? 0x86 : n == 3 ? 0x87 : 't');
    }
    return 0;
}

PyObject *mpimesh_fast_dumps(PyObject *frame) {
    Fast f;
    int rc;
    f.buf[0] = (char)0x80; /* PROTO 5 */
    f.buf[1] = 5;
    f.n = 2;
    rc = fast_object(&f, frame, 0);
    if (rc <= 0 || !fast_op(&f, '.')) return NULL;
    return PyBytes_FromStringAndSize(f.buf, f.n);
}


/* --- reading --------------------------------------------------------------- */

enum { LOAD_STACK = 64, LOAD_MARKS = FAST_DEPTH + 1 };

typedef struct {
    PyObject *stack[LOAD_STACK];
    int top, marks[LOAD_MARKS], nmarks;
} Load;

static int load_push(Load *l, PyObject *obj) {
    if (obj == NULL) return -1;
    if (l->top == LOAD_STACK) {
        Py_DECREF(obj);
        return 0;
    }
    l->stack[l->top++] = obj;
    return 1;
}

/* The top n items as a tuple, in place of them: 1 done, 0 not enough items, -1 error. */
static int load_tuple(Load *l, int n) {
    PyObject *tuple;
    if (n > l->top) return 0;
    tuple = PyTuple_New(n);
    if (tuple == NULL) return -1;
    for (int i = 0; i < n; i++) PyTuple_SET_ITEM(tuple, i, l->stack[l->top - n + i]);
    l->top -= n;
    l->stack[l->top++] = tuple;
    return 1;
}

static uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

PyObject *mpimesh_fast_loads(const char *data, Py_ssize_t len) {
    const unsigned char *p = (const unsigned char *)data, *end = p + len;
    Load l;
    int rc = 0;
    PyObject *result = NULL;
    l.top = l.nmarks = 0;
    if (len < 3 || p[0] != 0x80 || p[1] > 5) return NULL;
    p += 2;
    while (p < end) {
        unsigned char op = *p++;
        Py_ssize_t n;
#define NEED(k) \
    if (end - p < (k)) goto out;
        switch (op) {
        case 'N': rc = load_push(&l, Py_NewRef(Py_None)); break;
        case 0x88: rc = load_push(&l, Py_NewRef(Py_True)); break;
        case 0x89: rc = load_push(&l, Py_NewRef(Py_False)); break;
        case 'K':
            NEED(1) rc = load_push(&l, PyLong_FromLong(p[0]));
            p += 1;
            break;
        case 'M':
            NEED(2) rc = load_push(&l, PyLong_FromLong((long)le(p, 2)));
            p += 2;
            break;
        case 'J':
            NEED(4) rc = load_push(&l, PyLong_FromLong((long)(int32_t)(uint32_t)le(p, 4)));
            p += 4;
            break;
        case 0x8a: /* LONG1: up to 8 bytes, little-endian two's complement */
            NEED(1) n = p[0];
            if (n > 8) goto out;
            p += 1;
            NEED(n) {
                uint64_t v = le(p, (int)n);
                if (n == 0) {
                    v = 0;
                } else if (n < 8 && (p[n - 1] & 0x80)) {
                    v |= ~(uint64_t)0 << (8 * n); /* sign-extend */
                }
                rc = load_push(&l, PyLong_FromLongLong((long long)v));
            }
            p += n;
            break;
        case 'G':
            NEED(8) {
                double d = PyFloat_Unpack8((const char *)p, 0);
                if (d == -1.0 && PyErr_Occurred()) goto out;
                rc = load_push(&l, PyFloat_FromDouble(d));
            }
            p += 8;
            break;
        case 0x8c: /* SHORT_BINUNICODE */
            NEED(1) n = p[0];
            p += 1;
            NEED(n) rc = load_push(&l, PyUnicode_DecodeUTF8((const char *)p, n, "surrogatepass"));
            p += n;
            break;
        case 'X': /* BINUNICODE */
            NEED(4) n = (Py_ssize_t)le(p, 4);
            p += 4;
            NEED(n) rc = load_push(&l, PyUnicode_DecodeUTF8((const char *)p, n, "surrogatepass"));
            p += n;
            break;
        case 0x95: /* FRAME: its length, then the frame's opcodes */
            NEED(8) p += 8;
            rc = 1;
            break;
        case ')': rc = load_push(&l, PyTuple_New(0)); break;
        case 0x85: rc = load_tuple(&l, 1); break;
        case 0x86: rc = load_tuple(&l, 2); break;
        case 0x87: rc = load_tuple(&l, 3); break;
        case '(':
            if (l.nmarks == LOAD_MARKS) goto out;
            l.marks[l.nmarks++] = l.top;
            rc = 1;
            break;
        case 't':
            if (l.nmarks == 0) goto out;
            l.nmarks--;
            rc = load_tuple(&l, l.top - l.marks[l.nmarks]);
            break;
        case '.':
            if (p == end && l.top == 1 && l.nmarks == 0) {
                result = l.stack[0];
                l.top = 0;
            }
            goto out;
        default: /* anything else (MEMOIZE, a class, bytes, ...): pickle.loads's */
            goto out;
        }
#undef NEED
        if (rc <= 0) {
            if (rc < 0 && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) PyErr_Clear(); /* pickle's to say */
            goto out;
        }
    }
out:
    while (l.top > 0) Py_DECREF(l.stack[--l.top]);
    return result;
}

/* --- for tests ---------------------------------------------------------------- */

PyObject *mpimesh_fast_dumps_py(PyObject *self, PyObject *obj) {
    PyObject *data;
    (void)self;
    data = mpimesh_fast_dumps(obj);
    if (data == NULL && !PyErr_Occurred()) Py_RETURN_NONE;
    return data;
}

PyObject *mpimesh_fast_loads_py(PyObject *self, PyObject *data) {
    PyObject *obj;
    (void)self;
    if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "fast_loads(data): data must be bytes");
        return NULL;
    }
    obj = mpimesh_fast_loads(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data));
    if (obj == NULL) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(N)", obj);
}
