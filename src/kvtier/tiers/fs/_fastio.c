/*
 * kvtier.tiers.fs._fastio: one chunk file written or read in one call that releases the GIL
 * once. Wrapped by native.py, which documents the contract; files.py decides what to write.
 *
 * Why compiled: a 256 KiB chunk costs ~6 system calls (open the level directory, open the
 * file, transfer, close, rename or fstat/cachestat, close). Through the os module each one
 * releases and retakes the GIL, and with 16 I/O threads every retake is a futex handoff that
 * costs more CPU than the call itself (strace: ~90 futex calls per stored chunk). Here the
 * calls run back to back with the GIL released once.
 *
 * Safety is the same as the Python path's (fs/paths.py, fs/pin.py): every path is resolved
 * below the namespace's descriptor, held open since start, with openat2 and
 * RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH (no link anywhere is followed); before that, the
 * namespace's path must still name the directory pinned at start (lstat: same st_dev and
 * st_ino), else the call fails with ESTALE and Python names it. Files are opened O_NOFOLLOW
 * and O_NONBLOCK (a FIFO never blocks), and a read checks S_ISREG with fstat before any byte
 * is read. Checksums and header checks stay in Python: nothing here decides whether bytes are
 * right.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef SYS_openat2
#define SYS_openat2 437
#endif
#ifndef SYS_cachestat
#define SYS_cachestat 451
#endif

#define PAGE_BYTES 4096

struct cachestat_range {
    unsigned long long off, len;
};

struct cachestat {
    unsigned long long nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};

/* openat2 of `path` below directory `dir`, following no link; -1 with errno on failure. */
static int open_no_links(int dir, const char *path, int flags)
{
    struct open_how how = {
        .flags = (unsigned long long)(flags | O_CLOEXEC),
        .mode = 0,
        .resolve = RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH,
    };
    return (int)syscall(SYS_openat2, dir, path, &how, sizeof how);
}

/* The namespace as pinned at start (fs/pin.py): its descriptor, its path, and the st_dev and
 * st_ino that lstat of the path gave then. */
struct pin {
    int fd;
    const char *path;
    unsigned long long dev, ino;
};

/* 0 while the path still names the pinned entry, else -1 with errno ESTALE (swapped or gone:
 * Python's check names which). */
static int still_pinned(const struct pin *p)
{
    struct stat st;
    int gone = fstatat(AT_FDCWD, p->path, &st, AT_SYMLINK_NOFOLLOW) < 0;
    if (gone || (unsigned long long)st.st_dev != p->dev
        || (unsigned long long)st.st_ino != p->ino) {
        errno = ESTALE;
        return -1;
    }
    return 0;
}

/* Drop the first `done` bytes of iov[0..*n); returns the new start. */
static struct iovec *advance(struct iovec *iov, int *n, size_t done)
{
    while (*n > 0 && done >= iov->iov_len) {
        done -= iov->iov_len;
        iov++;
        (*n)--;
    }
    if (*n > 0) {
        iov->iov_base = (char *)iov->iov_base + done;
        iov->iov_len -= done;
    }
    return iov;
}

/* pwritev every byte (resuming short writes); 0, or -1 with errno. */
static int write_all(int fd, struct iovec *iov, int n)
{
    off_t offset = 0;
    while (n > 0) {
        ssize_t done = pwritev(fd, iov, n, offset);
        if (done < 0 && errno == EINTR)
            continue;
        if (done == 0)
            errno = EIO; /* no progress: fail rather than spin with the GIL released */
        if (done <= 0)
            return -1;
        offset += done;
        iov = advance(iov, &n, (size_t)done);
    }
    return 0;
}

/* preadv up to `want` bytes (resuming short reads, stopping at end of file); bytes or -1. */
static ssize_t read_upto(int fd, struct iovec *iov, int n, ssize_t want)
{
    ssize_t total = 0;
    while (n > 0 && total < want) {
        ssize_t done = preadv(fd, iov, n, total);
        if (done < 0 && errno == EINTR)
            continue;
        if (done <= 0)
            return done < 0 ? -1 : total;
        total += done;
        iov = advance(iov, &n, (size_t)done);
    }
    return total;
}

/* Whether every page of the open file is in the page cache (false when unknown). */
static int all_cached(int fd, off_t size)
{
    struct cachestat_range whole = {0, 0};
    struct cachestat stat;
    if (syscall(SYS_cachestat, fd, &whole, &stat, 0) != 0)
        return 0;
    return (long long)stat.nr_cache * PAGE_BYTES >= (long long)size;
}

#define DIR_FLAGS (O_RDONLY | O_DIRECTORY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC)

struct store_args {
    struct pin pin;
    const char *levels[2], *tmp, *name;
    Py_buffer header, payload;
    Py_ssize_t truncate_to;
    int flags, sync;
    unsigned int dir_mode, file_mode; /* of what is created (the umask may narrow them) */
};

/* <level 1>/<level 2> below the pinned namespace, made (dir_mode) where missing: one openat2
 * when it exists, else the walk from the namespace with mkdirat and O_NOFOLLOW opens (a link
 * is never followed, even to make a directory). A descriptor, or -1 with errno. */
static int open_levels(const struct store_args *a)
{
    char path[PATH_MAX];
    int n = snprintf(path, sizeof path, "%s/%s", a->levels[0], a->levels[1]);
    if (n < 0 || (size_t)n >= sizeof path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    int dir = open_no_links(a->pin.fd, path, DIR_FLAGS);
    if (dir >= 0 || errno != ENOENT)
        return dir;
    dir = a->pin.fd;
    for (int i = 0; i < 2 && dir >= 0; i++) {
        int child = -1;
        if (mkdirat(dir, a->levels[i], (mode_t)a->dir_mode) == 0 || errno == EEXIST)
            child = openat(dir, a->levels[i], DIR_FLAGS);
        int saved = errno;
        if (dir != a->pin.fd)
            close(dir);
        errno = saved;
        dir = child;
    }
    return dir;
}

/* Write tmp in the chunk's directory, then rename it to name; tmp is removed on failure.
 * 0 or an errno. */
static int store_file(struct store_args *a, const char **failed)
{
    int err = 0;
    if (still_pinned(&a->pin) < 0)
        return errno;
    int dir = open_levels(a);
    if (dir < 0)
        return errno;
    *failed = a->tmp;
    int fd = openat(dir, a->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | a->flags,
                    (mode_t)a->file_mode);
    if (fd < 0) {
        err = errno;
        close(dir);
        return err;
    }
    struct iovec iov[2] = {{a->header.buf, (size_t)a->header.len},
                           {a->payload.buf, (size_t)a->payload.len}};
    if (write_all(fd, iov, 2) < 0 || (a->truncate_to >= 0 && ftruncate(fd, a->truncate_to) < 0)
        || (a->sync && fsync(fd) < 0))
        err = errno;
    close(fd);
    if (!err && renameat(dir, a->tmp, dir, a->name) < 0) {
        err = errno;
        *failed = a->name;
    }
    if (err)
        unlinkat(dir, a->tmp, 0);
    else if (a->sync && fsync(dir) < 0)
        err = errno;
    close(dir);
    return err;
}

static PyObject *fastio_store(PyObject *self, PyObject *args)
{
    struct store_args a;
    if (!PyArg_ParseTuple(args, "(iyKK)yyyyy*y*nipII", &a.pin.fd, &a.pin.path, &a.pin.dev,
                          &a.pin.ino, &a.levels[0], &a.levels[1], &a.tmp, &a.name, &a.header,
                          &a.payload, &a.truncate_to, &a.flags, &a.sync, &a.dir_mode,
                          &a.file_mode))
        return NULL;
    const char *failed = a.pin.path;
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = store_file(&a, &failed);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&a.header);
    PyBuffer_Release(&a.payload);
    if (err) {
        errno = err;
        return PyErr_SetFromErrnoWithFilename(PyExc_OSError, failed);
    }
    Py_RETURN_NONE;
}

struct load_args {
    struct pin pin;
    const char *path; /* below the namespace: <level 1>/<level 2>/<name> */
    Py_buffer header, plain, aligned;
    int flags, adaptive, o_direct;
    /* results */
    struct stat st;
    ssize_t got;
    int regular, direct;
};

/* Open, check, (choose the cache or O_DIRECT,) read, close. 0 or an errno. */
static int load_file(struct load_args *a)
{
    int err = 0;
    if (still_pinned(&a->pin) < 0)
        return errno;
    int fd = open_no_links(a->pin.fd, a->path, a->flags | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY);
    if (fd < 0)
        return errno;
    a->direct = (a->flags & a->o_direct) != 0;
    if (fstat(fd, &a->st) < 0) {
        err = errno;
    } else if (!(a->regular = S_ISREG(a->st.st_mode))) {
        /* nothing read: the caller names it */
    } else {
        if (a->adaptive && !all_cached(fd, a->st.st_size)) {
            a->direct = 1;
            if (fcntl(fd, F_SETFL, O_NONBLOCK | a->o_direct) < 0)
                err = errno;
        }
        /* O_DIRECT reads whole aligned pages: the slot's padding takes the rounding. */
        Py_buffer *target = a->direct ? &a->aligned : &a->plain;
        struct iovec iov[2] = {{a->header.buf, (size_t)a->header.len},
                               {target->buf, (size_t)target->len}};
        ssize_t want = a->header.len + target->len;
        if (!err && (a->got = read_upto(fd, iov, 2, want < a->st.st_size ? want : a->st.st_size)) < 0)
            err = errno;
    }
    close(fd);
    return err;
}

static PyObject *fastio_load(PyObject *self, PyObject *args)
{
    struct load_args a = {0};
    if (!PyArg_ParseTuple(args, "(iyKK)yw*w*w*iii", &a.pin.fd, &a.pin.path, &a.pin.dev,
                          &a.pin.ino, &a.path, &a.header, &a.plain, &a.aligned, &a.flags,
                          &a.adaptive, &a.o_direct))
        return NULL;
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = load_file(&a);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&a.header);
    PyBuffer_Release(&a.plain);
    PyBuffer_Release(&a.aligned);
    if (err) {
        errno = err;
        return PyErr_SetFromErrnoWithFilename(PyExc_OSError, a.path);
    }
    if (!a.regular)
        Py_RETURN_NONE;
    return Py_BuildValue("(nnKKO)", (Py_ssize_t)a.st.st_size, (Py_ssize_t)a.got,
                         (unsigned long long)a.st.st_dev, (unsigned long long)a.st.st_ino,
                         a.direct ? Py_True : Py_False);
}

static PyMethodDef fastio_methods[] = {
    {"store", fastio_store, METH_VARARGS, "See kvtier.tiers.fs.native.store."},
    {"load", fastio_load, METH_VARARGS, "See kvtier.tiers.fs.native.load."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fastio_module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_fastio",
    .m_doc = "One chunk file per GIL release.",
    .m_size = -1,
    .m_methods = fastio_methods,
};

/* The calling convention of store and load; native.py uses a module of its own ABI only. */
#define FASTIO_ABI 3

PyMODINIT_FUNC PyInit__fastio(void)
{
    PyObject *module = PyModule_Create(&fastio_module);
    if (module != NULL && PyModule_AddIntConstant(module, "ABI", FASTIO_ABI) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
