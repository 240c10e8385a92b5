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
 * is read. Nothing here decides whether bytes are right: a load asked to (`fold`) returns the
 * payload's XXH3-128 (`../shared/xxh3.h`) for Python to compare with the header's, and a store
 * asked to (`fold_at`) fills in the header's checksums, both inside the same GIL release.
 * Reading or writing in pieces, each hashed while in cache, was measured and lost: on this
 * virtual disk every extra read or write costs more CPU than the cache saves (2 MiB chunks:
 * 381 us of CPU per cold load in 256 KiB pieces, 216 us whole).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../shared/xxh3.h"

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

/* pwritev every byte from the start of the file (resuming short writes); 0, or -1 with errno. */
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

/* preadv up to `want` bytes from the start of the file (resuming short reads, stopping at end
 * of file); bytes or -1. */
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
    Py_ssize_t fold_at; /* > 0: fill in the header's payload checksum here (then its own) */
};

/* Fill in the header's payload checksum (XXH3-128 at fold_at) and, after it, its own (XXH3-64
 * of every byte before: codec.py's layout). */
static void fill_checksums(struct store_args *a)
{
    uint8_t *header = a->header.buf;
    size_t at = (size_t)a->fold_at;
    size_t len = a->truncate_to >= 0 ? (size_t)a->truncate_to - (size_t)a->header.len
                                     : (size_t)a->payload.len;
    xxh3_128(a->payload.buf, len, header + at);
    uint64_t check = xxh3_64_17to128(header, at + 16);
    for (int i = 0; i < 8; i++)
        header[at + 16 + i] = (uint8_t)(check >> (8 * i));
}

/* Header and payload in one pwritev, then the truncation and fsync asked for. */
static int write_chunk(int fd, struct store_args *a)
{
    struct iovec iov[2] = {{a->header.buf, (size_t)a->header.len},
                           {a->payload.buf, (size_t)a->payload.len}};
    if (write_all(fd, iov, 2) < 0 || (a->truncate_to >= 0 && ftruncate(fd, a->truncate_to) < 0)
        || (a->sync && fsync(fd) < 0))
        return errno;
    return 0;
}

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
    if (a->fold_at > 0)
        fill_checksums(a);
    err = write_chunk(fd, a);
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
    if (!PyArg_ParseTuple(args, "(iyKK)yyyyy*y*nipIIn", &a.pin.fd, &a.pin.path, &a.pin.dev,
                          &a.pin.ino, &a.levels[0], &a.levels[1], &a.tmp, &a.name, &a.header,
                          &a.payload, &a.truncate_to, &a.flags, &a.sync, &a.dir_mode,
                          &a.file_mode, &a.fold_at))
        return NULL;
    if (a.fold_at < 0 || (a.fold_at > 0 && (a.fold_at + 24 > a.header.len || a.fold_at > 112
                                             || a.header.readonly))) {
        PyBuffer_Release(&a.header);
        PyBuffer_Release(&a.payload);
        return PyErr_Format(PyExc_ValueError, "store: cannot fill in a checksum at %zd",
                            a.fold_at);
    }
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
    int flags, adaptive, o_direct, fold;
    /* results */
    struct stat st;
    ssize_t got;
    int regular, direct;
    uint8_t digest[16]; /* with fold: XXH3-128 of the payload bytes read (payload_read) */
};

/* Payload bytes among `got` bytes read, up to the payload's length. */
static size_t payload_read(ssize_t got, const Py_buffer *header, const Py_buffer *plain)
{
    ssize_t body = got - header->len;
    return body <= 0 ? 0 : (size_t)(body < plain->len ? body : plain->len);
}

/* Open, check, (choose the cache or O_DIRECT,) read, close; the caller checked the pin.
 * 0 or an errno. */
static int load_pinned(struct load_args *a)
{
    int err = 0;
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
        want = want < a->st.st_size ? want : a->st.st_size;
        a->got = read_upto(fd, iov, 2, want);
        if (!err && a->got < 0)
            err = errno;
        else if (a->fold) /* what Python would hash: the payload bytes read, at most plain's */
            xxh3_128(a->plain.buf, payload_read(a->got, &a->header, &a->plain), a->digest);
    }
    close(fd);
    return err;
}

static int load_file(struct load_args *a)
{
    return still_pinned(&a->pin) < 0 ? errno : load_pinned(a);
}

/* What a load returns to Python: None (not a regular file: nothing read) or the tuple
 * native.Loaded. */
static PyObject *loaded_value(const struct load_args *a)
{
    if (!a->regular)
        Py_RETURN_NONE;
    PyObject *digest = a->fold ? PyBytes_FromStringAndSize((const char *)a->digest, 16) : Py_None;
    if (!digest)
        return NULL;
    PyObject *loaded = Py_BuildValue("(nnKKOO)", (Py_ssize_t)a->st.st_size, (Py_ssize_t)a->got,
                                     (unsigned long long)a->st.st_dev,
                                     (unsigned long long)a->st.st_ino,
                                     a->direct ? Py_True : Py_False, digest);
    if (a->fold)
        Py_DECREF(digest);
    return loaded;
}

static PyObject *fastio_load(PyObject *self, PyObject *args)
{
    struct load_args a = {0};
    if (!PyArg_ParseTuple(args, "(iyKK)yw*w*w*iiip", &a.pin.fd, &a.pin.path, &a.pin.dev,
                          &a.pin.ino, &a.path, &a.header, &a.plain, &a.aligned, &a.flags,
                          &a.adaptive, &a.o_direct, &a.fold))
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
    return loaded_value(&a);
}

/*
 * load_many: the chunk files of one job, read one after another with the GIL released once
 * (and the pin checked once). Why: with 16 I/O threads on few cores, a thread coming back
 * from a read waits for the GIL before it can start its next one, so one call per chunk
 * leaves the disk with fewer reads in flight than threads (cold loads ran at 0.8x of vLLM's
 * C++ tier at 2 MiB, which reads a job's blocks in one call), and every retake is a futex
 * handoff (most of the CPU of a 256 KiB hot load).
 */
static void release_loads(struct load_args *loads, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        PyBuffer_Release(&loads[i].plain);
        PyBuffer_Release(&loads[i].aligned);
    }
    PyMem_Free(loads);
}

/* Fill loads[i] from Python's arguments (paths[i], headers' i-th block, plains[i], alignds[i]);
 * -1 with an exception set. */
static int parse_loads(struct load_args *loads, Py_ssize_t n, PyObject *paths, Py_buffer *headers,
                       PyObject *plains, PyObject *aligneds, Py_ssize_t *parsed)
{
    Py_ssize_t block = headers->len / n;
    for (Py_ssize_t i = 0; i < n; i++) {
        struct load_args *a = &loads[i];
        a->path = PyBytes_AsString(PyTuple_GET_ITEM(paths, i));
        if (a->path == NULL)
            return -1;
        a->header.buf = (char *)headers->buf + i * block;
        a->header.len = block;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(plains, i), &a->plain, PyBUF_WRITABLE) < 0)
            return -1;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(aligneds, i), &a->aligned, PyBUF_WRITABLE) < 0) {
            PyBuffer_Release(&a->plain);
            return -1;
        }
        *parsed = i + 1;
    }
    return 0;
}

/* One result per load: loaded_value, or the errno (an int) of a load that failed. */
static PyObject *load_results(struct load_args *loads, Py_ssize_t n, int *errs)
{
    PyObject *results = PyList_New(n);
    for (Py_ssize_t i = 0; results != NULL && i < n; i++) {
        PyObject *item = errs[i] ? PyLong_FromLong(errs[i]) : loaded_value(&loads[i]);
        if (item == NULL)
            Py_CLEAR(results);
        else
            PyList_SET_ITEM(results, i, item);
    }
    return results;
}

static PyObject *fastio_load_many(PyObject *self, PyObject *args)
{
    struct pin pin;
    PyObject *paths, *plains, *aligneds;
    Py_buffer headers;
    int flags, adaptive, o_direct, fold;
    if (!PyArg_ParseTuple(args, "(iyKK)O!w*O!O!iiip", &pin.fd, &pin.path, &pin.dev, &pin.ino,
                          &PyTuple_Type, &paths, &headers, &PyTuple_Type, &plains, &PyTuple_Type,
                          &aligneds, &flags, &adaptive, &o_direct, &fold))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(paths), parsed = 0;
    if (n == 0 || PyTuple_GET_SIZE(plains) != n || PyTuple_GET_SIZE(aligneds) != n
        || headers.len % n) {
        PyBuffer_Release(&headers);
        PyErr_SetString(PyExc_ValueError, "load_many: one path, header block, plain and "
                                          "aligned buffer per chunk");
        return NULL;
    }
    struct load_args *loads = PyMem_Calloc((size_t)n, sizeof *loads);
    int *errs = PyMem_Calloc((size_t)n, sizeof *errs);
    PyObject *results = NULL;
    if (loads == NULL || errs == NULL) {
        PyErr_NoMemory();
    } else if (parse_loads(loads, n, paths, &headers, plains, aligneds, &parsed) == 0) {
        int stale;
        Py_BEGIN_ALLOW_THREADS
        stale = still_pinned(&pin) < 0;
        for (Py_ssize_t i = 0; !stale && i < n; i++) {
            loads[i].pin = pin;
            loads[i].flags = flags;
            loads[i].adaptive = adaptive;
            loads[i].o_direct = o_direct;
            loads[i].fold = fold;
            errs[i] = load_pinned(&loads[i]);
        }
        Py_END_ALLOW_THREADS
        if (stale) {
            errno = ESTALE;
            PyErr_SetFromErrnoWithFilename(PyExc_OSError, pin.path);
        } else {
            results = load_results(loads, n, errs);
        }
    }
    if (loads != NULL)
        release_loads(loads, parsed);
    PyMem_Free(errs);
    PyBuffer_Release(&headers);
    return results;
}


/*
 * scan_chunks: every entry of a level directory of the layout (with depth 1, of each level
 * directory below it too), listed with stat (and each chunk's link) in one call that releases
 * the GIL once. Why compiled: `kvtier cache du` of a
 * million chunk files spent its time on one lstat and one open/pread/close per file, each a
 * GIL round trip through the os module. Same rules as the rest of this file: nothing is
 * followed (fstatat AT_SYMLINK_NOFOLLOW, openat O_NOFOLLOW | O_NONBLOCK), nothing but a
 * regular file is read. A record per 64-hex name of a regular file:
 *   key[32] size:int64 disk_bytes:int64 mtime:double link_err:int32 level:int32 link[56] pad[8]
 * and, NUL-separated, the names of every other entry (a leading d_type byte, then the name,
 * "cd/name" below a level directory) for Python to classify: a level directory that could not
 * be opened or listed is among them, for Python to try and name. An entry that vanished
 * meanwhile is left out.
 */
#define LINK_READ_BYTES 56
struct chunk_rec {
    unsigned char key[32];
    int64_t size, disk;
    double mtime;
    int32_t link_err, level; /* level: the level directory's value (0-255), -1 at depth 0 */
    unsigned char link[LINK_READ_BYTES];
    unsigned char tail[8];
};

struct grow {
    char *data;
    size_t len, cap;
};

static int grow_add(struct grow *g, const void *bytes, size_t n)
{
    if (g->len + n > g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 4096;
        while (cap < g->len + n)
            cap *= 2;
        char *data = realloc(g->data, cap);
        if (data == NULL)
            return -1;
        g->data = data;
        g->cap = cap;
    }
    memcpy(g->data + g->len, bytes, n);
    g->len += n;
    return 0;
}

static int hex_key(const char *name, unsigned char *key)
{
    for (int i = 0; i < 64; i++) {
        char c = name[i];
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (v < 0)
            return 0;
        key[i / 2] = (unsigned char)(i % 2 ? key[i / 2] | v : v << 4);
    }
    return name[64] == '\0';
}

/* Fill `r` from chunk file `name`: with `links`, open it (never following, never blocking),
 * fstat it and read its link; else, or when its type is not known from the listing, lstat it
 * first. 0: a regular file; 1: something else; -1: gone meanwhile. */
static int stat_chunk(int dir, const char *name, int unknown, int links, long offset,
                      struct chunk_rec *r)
{
    struct stat st;
    int fd = -1;
    if ((unknown || !links) && fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return -1;
    if ((unknown || !links) && !S_ISREG(st.st_mode))
        return 1;
    if (links) {
        fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
        if (fd < 0) {
            r->link_err = errno;
            if (errno == ELOOP)
                return 1;
            if (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
                return -1;
        } else if (fstat(fd, &st) != 0) {
            close(fd);
            return -1;
        }
    }
    int regular = S_ISREG(st.st_mode);
    if (regular) {
        r->size = st.st_size;
        r->disk = (int64_t)st.st_blocks * 512;
        r->mtime = (double)st.st_mtim.tv_sec + st.st_mtim.tv_nsec / 1e9;
        if (fd >= 0 && pread(fd, r->link, LINK_READ_BYTES, offset) < 0)
            r->link_err = errno;
    }
    if (fd >= 0)
        close(fd);
    return regular ? 0 : 1;
}

static int add_other(struct grow *others, unsigned char type, const char *dir, const char *name)
{
    if (grow_add(others, &type, 1))
        return -1;
    if (dir != NULL && (grow_add(others, dir, strlen(dir)) || grow_add(others, "/", 1)))
        return -1;
    return grow_add(others, name, strlen(name) + 1);
}

/* One entry of a chunk directory (`sub`: its name below the scanned one, or NULL). */
static int scan_entry(int dir, const char *sub, struct dirent *e, int links, long offset,
                      struct grow *recs, struct grow *others)
{
    struct chunk_rec r;
    memset(&r, 0, sizeof r);
    r.level = sub == NULL ? -1 : (int32_t)strtol(sub, NULL, 16);
    if (hex_key(e->d_name, r.key) && (e->d_type == DT_REG || e->d_type == DT_UNKNOWN)) {
        int kind = stat_chunk(dir, e->d_name, e->d_type == DT_UNKNOWN, links, offset, &r);
        if (kind == 0)
            return grow_add(recs, &r, sizeof r);
        if (kind < 0)
            return 0;
    }
    return add_other(others, e->d_type, sub, e->d_name);
}

static int is_level(const char *name)
{
    return strlen(name) == 2 && strspn(name, "0123456789abcdef") == 2;
}

/* Every entry of directory `dir`; with `depth` 1 its level directories are scanned as chunk
 * directories (a level that cannot be opened as a directory without following a link goes to
 * `others` as it is). Returns an errno, 0 when listed. */
static int scan_dir(int dir, const char *sub, int depth, int links, long offset,
                    struct grow *recs, struct grow *others)
{
    int fd = dup(dir), failed = 0;
    DIR *d = fd < 0 ? NULL : fdopendir(fd);
    if (d == NULL) {
        int err = errno;
        if (fd >= 0)
            close(fd);
        return err;
    }
    rewinddir(d);
    struct dirent *e;
    while (!failed && (errno = 0, e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        int child = -1;
        if (depth > 0 && is_level(e->d_name))
            child = openat(dirfd(d), e->d_name,
                           O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (child >= 0) {
            if (scan_dir(child, e->d_name, 0, links, offset, recs, others) != 0)
                failed = add_other(others, e->d_type, NULL, e->d_name);
            close(child);
        } else if (depth > 0) {
            failed = add_other(others, e->d_type, NULL, e->d_name);
        } else {
            failed = scan_entry(dirfd(d), sub, e, links, offset, recs, others);
        }
    }
    int err = failed ? ENOMEM : errno;
    closedir(d);
    return err;
}

static PyObject *fastio_scan_chunks(PyObject *self, PyObject *args)
{
    int dir, links, depth, err;
    long offset;
    if (!PyArg_ParseTuple(args, "ipli", &dir, &links, &offset, &depth))
        return NULL;
    struct grow recs = {0}, others = {0};
    Py_BEGIN_ALLOW_THREADS
    err = scan_dir(dir, NULL, depth, links, offset, &recs, &others);
    Py_END_ALLOW_THREADS
    PyObject *result = NULL;
    if (err) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
    } else {
        result = Py_BuildValue("(y#y#)", recs.data ? recs.data : "", (Py_ssize_t)recs.len,
                               others.data ? others.data : "", (Py_ssize_t)others.len);
    }
    free(recs.data);
    free(others.data);
    return result;
}

static PyMethodDef fastio_methods[] = {
    {"store", fastio_store, METH_VARARGS, "See kvtier.tiers.fs.native.store."},
    {"load", fastio_load, METH_VARARGS, "See kvtier.tiers.fs.native.load."},
    {"load_many", fastio_load_many, METH_VARARGS, "See kvtier.tiers.fs.native.load_many."},
    {"scan_chunks", fastio_scan_chunks, METH_VARARGS, "See kvtier.tiers.fs.native.scan_chunks."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fastio_module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_fastio",
    .m_doc = "One chunk file per GIL release.",
    .m_size = -1,
    .m_methods = fastio_methods,
};

/* The calling convention of store, load, load_many and scan_chunks; native.py uses its own ABI only. */
#define FASTIO_ABI 6

PyMODINIT_FUNC PyInit__fastio(void)
{
    PyObject *module = PyModule_Create(&fastio_module);
    if (module != NULL && PyModule_AddIntConstant(module, "ABI", FASTIO_ABI) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
