/*
 * kvtier.tiers.shared._checksum: the payload checksum (XXH3-128, `xxh3.h`) for Python callers,
 * with the GIL released for the whole call.
 *
 *   digest(buffer) -> bytes         the 16-byte checksum of a buffer (what `xxhash`'s
 *                                   xxh3_128_digest gives)
 *   copy_digest(dst, src) -> bytes  copy src into the start of dst and return src's checksum,
 *                                   hashing each piece right after it is copied, while it is
 *                                   still in CPU cache: one pass over memory instead of two
 *   Filling(buffer)                 the checksum of a buffer that fills from its start in
 *                                   pieces (a network stream landing in a host slot):
 *                                   feed(filled) after each piece folds what is new while it is
 *                                   still in cache; digest(length) gives the checksum of
 *                                   buffer[:length]. copy_in(source) appends source at
 *                                   the fill mark (the longest prefix fed), folding each
 *                                   piece right after it is copied: a message that arrived
 *                                   whole elsewhere lands in one pass. One thread at a time:
 *                                   a call while another thread is in one (without the GIL)
 *                                   raises RuntimeError.
 *
 * Optional like `_fastio`: `kvtier.tiers.shared.codec` falls back to the `xxhash` package.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "xxh3.h"

#define ABI_VERSION 2
#define COPY_PIECE (128 * 1024) /* well inside a core's L2 */
/* Filling.feed hashes a smaller step with the GIL held: releasing and retaking it costs more
 * than hashing a few KiB of network buffer (the obj tier feeds every received piece). */
#define FEED_UNLOCKED_FROM (128 * 1024)

static PyObject *checksum_digest(PyObject *self, PyObject *args)
{
    Py_buffer in;
    uint8_t out[16];
    if (!PyArg_ParseTuple(args, "y*", &in))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    xxh3_128(in.buf, (size_t)in.len, out);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&in);
    return PyBytes_FromStringAndSize((const char *)out, 16);
}

/* Copy src[:n] to buf[at:at + n], folding into `run` (a hash of buf[:len]) each piece right
 * after it is copied, while it is still in cache. */
static void copy_folding(struct xxh3_run *run, uint8_t *buf, size_t at, const uint8_t *src,
                         size_t n, size_t len)
{
    for (size_t done = 0; done < n;) {
        size_t piece = n - done < COPY_PIECE ? n - done : COPY_PIECE;
        memcpy(buf + at + done, src + done, piece);
        done += piece;
        xxh3_run_feed(run, buf, at + done, len);
    }
}

static void copy_hashing(uint8_t *dst, const uint8_t *src, size_t len, uint8_t out[16])
{
    struct xxh3_run run;
    xxh3_run_init(&run);
    copy_folding(&run, dst, 0, src, len, len);
    xxh3_run_finish(&run, dst, len, out);
}

/* Whether n bytes at a and b overlap. */
static int overlap(const char *a, const char *b, Py_ssize_t n)
{
    return a < b + n && b < a + n;
}

static PyObject *checksum_copy_digest(PyObject *self, PyObject *args)
{
    Py_buffer dst, src;
    uint8_t out[16];
    if (!PyArg_ParseTuple(args, "w*y*", &dst, &src))
        return NULL;
    if (dst.len < src.len || overlap(dst.buf, src.buf, src.len)) {
        PyBuffer_Release(&dst);
        PyBuffer_Release(&src);
        if (dst.len < src.len)
            return PyErr_Format(PyExc_ValueError, "copy_digest: %zd bytes do not fit in %zd",
                                src.len, dst.len);
        return PyErr_Format(PyExc_ValueError, "copy_digest: source and target overlap");
    }
    Py_BEGIN_ALLOW_THREADS
    copy_hashing(dst.buf, src.buf, (size_t)src.len, out);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    return PyBytes_FromStringAndSize((const char *)out, 16);
}

typedef struct {
    PyObject_HEAD
    Py_buffer target;
    struct xxh3_run run;
    size_t fed; /* the longest prefix fed so far */
    int busy;   /* a call released the GIL while it folds or copies: no other may start */
} Filling;

/* 0 while no call of this Filling runs without the GIL, else -1 with RuntimeError: a second
 * thread would fold into the same state, or copy to where the first one is copying. */
static int filling_idle(const Filling *self, const char *call)
{
    if (!self->busy)
        return 0;
    PyErr_Format(PyExc_RuntimeError, "Filling.%s: in use by another thread", call);
    return -1;
}

static int filling_init(Filling *self, PyObject *args, PyObject *kwargs)
{
    if (self->target.obj) {
        PyErr_SetString(PyExc_TypeError, "Filling: already initialised");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "y*", &self->target))
        return -1;
    xxh3_run_init(&self->run);
    self->fed = 0;
    return 0;
}

static void filling_dealloc(Filling *self)
{
    if (self->target.obj)
        PyBuffer_Release(&self->target);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Fold the whole blocks of target[:filled] not folded yet, as the checksum of the whole
 * target would (the GIL released for pieces large enough to be worth it). */
static PyObject *filling_feed(Filling *self, PyObject *arg)
{
    Py_ssize_t filled = PyLong_AsSsize_t(arg);
    if (filled == -1 && PyErr_Occurred())
        return NULL;
    if (!self->target.obj || filled < 0 || filled > self->target.len)
        return PyErr_Format(PyExc_ValueError, "Filling.feed: %zd is outside the buffer", filled);
    if (filling_idle(self, "feed") < 0)
        return NULL;
    const uint8_t *buf = self->target.buf;
    size_t len = (size_t)self->target.len;
    if ((size_t)filled - (self->fed < (size_t)filled ? self->fed : (size_t)filled) >= FEED_UNLOCKED_FROM) {
        self->busy = 1;
        Py_BEGIN_ALLOW_THREADS
        xxh3_run_feed(&self->run, buf, (size_t)filled, len);
        Py_END_ALLOW_THREADS
        self->busy = 0;
    } else {
        xxh3_run_feed(&self->run, buf, (size_t)filled, len);
    }
    if ((size_t)filled > self->fed)
        self->fed = (size_t)filled;
    Py_RETURN_NONE;
}

/* Why `src` may not be copied in at target[at:]: NULL when it may. */
static const char *copy_refusal(const Filling *self, size_t at, const Py_buffer *src)
{
    size_t room = (size_t)self->target.len - at;
    if (self->target.readonly)
        return "the target is read-only";
    if ((size_t)src->len > room)
        return "the bytes do not fit";
    if (overlap((const char *)self->target.buf + at, src->buf, src->len))
        return "the source overlaps the target";
    return NULL;
}

/* Copy a buffer into target at the fill mark, folding it in as it is copied (copy_folding);
 * the mark moves past it. ValueError when it does not fit, overlaps the target or the target
 * is read-only; RuntimeError while another thread is in a call of this Filling. */
static PyObject *filling_copy_in(Filling *self, PyObject *arg)
{
    Py_buffer src;
    if (!self->target.obj)
        return PyErr_Format(PyExc_ValueError, "Filling.copy_in: not initialised");
    if (filling_idle(self, "copy_in") < 0 || PyObject_GetBuffer(arg, &src, PyBUF_SIMPLE) < 0)
        return NULL;
    size_t at = self->fed, n = (size_t)src.len;
    const char *refusal = copy_refusal(self, at, &src);
    if (refusal != NULL) {
        PyErr_Format(PyExc_ValueError, "Filling.copy_in: %s (%zd bytes at %zu of %zd)", refusal,
                     src.len, at, self->target.len);
        PyBuffer_Release(&src);
        return NULL;
    }
    self->fed = at + n;
    if (n >= FEED_UNLOCKED_FROM) {
        self->busy = 1;
        Py_BEGIN_ALLOW_THREADS
        copy_folding(&self->run, self->target.buf, at, src.buf, n, self->target.len);
        Py_END_ALLOW_THREADS
        self->busy = 0;
    } else {
        copy_folding(&self->run, self->target.buf, at, src.buf, n, self->target.len);
    }
    PyBuffer_Release(&src);
    Py_RETURN_NONE;
}

/* The checksum of target[:length]: what was folded when length is the whole buffer, else a
 * fresh pass over the prefix (a short object: it fails its length check anyway). */
static PyObject *filling_digest(Filling *self, PyObject *arg)
{
    Py_ssize_t length = PyLong_AsSsize_t(arg);
    if (length == -1 && PyErr_Occurred())
        return NULL;
    if (!self->target.obj || length < 0 || length > self->target.len)
        return PyErr_Format(PyExc_ValueError, "Filling.digest: %zd is outside the buffer", length);
    if (filling_idle(self, "digest") < 0)
        return NULL;
    uint8_t out[16];
    const uint8_t *buf = self->target.buf;
    struct xxh3_run run = self->run; /* finishing changes the state: digest twice, same answer */
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    if (length == self->target.len)
        xxh3_run_finish(&run, buf, (size_t)length, out);
    else
        xxh3_128(buf, (size_t)length, out);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    return PyBytes_FromStringAndSize((const char *)out, 16);
}

static PyMethodDef filling_methods[] = {
    {"feed", (PyCFunction)filling_feed, METH_O, "Fold buffer[:filled] (whole blocks) in."},
    {"copy_in", (PyCFunction)filling_copy_in, METH_O,
     "Copy a buffer in at the fill mark, folding it in as it is copied."},
    {"digest", (PyCFunction)filling_digest, METH_O, "XXH3-128 of buffer[:length]."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FillingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvtier.tiers.shared._checksum.Filling",
    .tp_basicsize = sizeof(Filling),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The checksum of a buffer filling from its start, folded as it fills.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)filling_init,
    .tp_dealloc = (destructor)filling_dealloc,
    .tp_methods = filling_methods,
};

static PyMethodDef checksum_methods[] = {
    {"digest", checksum_digest, METH_VARARGS, "XXH3-128 of a buffer, canonical 16 bytes."},
    {"copy_digest", checksum_copy_digest, METH_VARARGS,
     "Copy src into dst's start; return src's XXH3-128, hashed piece by piece as copied."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef checksum_module = {
    PyModuleDef_HEAD_INIT, "_checksum", NULL, -1, checksum_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__checksum(void)
{
    if (PyType_Ready(&FillingType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&checksum_module);
    if (!module)
        return NULL;
    Py_INCREF(&FillingType);
    if (PyModule_AddIntConstant(module, "ABI", ABI_VERSION) < 0
        || PyModule_AddObject(module, "Filling", (PyObject *)&FillingType) < 0) {
        Py_DECREF(&FillingType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
