/* Power-loss tracer: an LD_PRELOAD shim that records every change made to the files under one
 * directory, so that tests/faults/powerloss/replay.py can rebuild what a disk would hold after
 * a power cut at any point (see the crash model in replay.py and test_power_loss.py).
 *
 * Environment:
 *   POWERLOSS_DIR  the directory whose files are traced (anything at or under its real path)
 *   POWERLOSS_LOG  the log file (outside that directory), appended to by every traced process
 *
 * Every call still does its real work; the shim only adds records. Intercepted: open, open64,
 * openat, openat64, creat, creat64, write, pwrite, pwrite64, writev, pwritev, pwritev64,
 * ftruncate, ftruncate64, truncate, truncate64, fsync, fdatasync, unlink, unlinkat, rename,
 * renameat, close, dup, dup2, dup3. Not intercepted (so they are invisible here; the replay's
 * self-check, full replay == the real files, catches a file changed through them): writes
 * through mmap, stdio's internal writes (fwrite), fallocate, copy_file_range, sendfile, and
 * fds made by fcntl(F_DUPFD).
 *
 * Record (little endian), one writev() to the O_APPEND log, so records of several processes
 * and threads never interleave; a record cut short by a SIGKILL is found by its trailer:
 *   u32 magic "PLR1" | u32 total length | u16 type | u16 flags | u32 pid | u64 op id |
 *   i64 time ns | u64 dev | u64 ino | i64 offset | i64 arg | u32 path len | u32 data len |
 *   path | data | u32 trailer "END!"
 * A write or truncate is logged as BEGIN (with its data) before the real call and END (its
 * return value, the real offset) after it; fsync and fdatasync likewise, so the replay knows
 * which writes had completed before an fsync began (those are the ones it makes durable).
 * Namespace changes (open with O_CREAT or O_TRUNC, unlink, rename) are logged after they succeed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAGIC 0x31524c50u   /* "PLR1" */
#define TRAILER 0x21444e45u /* "END!" */
#define FDMAX 65536

enum {
    R_OPEN = 1, R_WRITE_BEGIN = 2, R_WRITE_END = 3, R_TRUNC_BEGIN = 4, R_TRUNC_END = 5,
    R_FSYNC_BEGIN = 6, R_FSYNC_END = 7, R_UNLINK = 8, R_RENAME = 9,
};
enum { F_SYNCFD = 1, F_APPENDFD = 2, F_DATAONLY = 4, F_DIR = 8 };

struct __attribute__((packed)) hdr {
    uint32_t magic, total;
    uint16_t type, flags;
    uint32_t pid;
    uint64_t op;
    int64_t ts;
    uint64_t dev, ino;
    int64_t offset, arg;
    uint32_t pathlen, datalen;
};

struct fdinfo { uint64_t dev, ino; int traced, flags; };

static struct fdinfo fds[FDMAX];
static char root[PATH_MAX];
static size_t rootlen;
static int logfd = -1;
static uint32_t opcounter;

static int (*real_open)(const char *, int, ...);
static int (*real_open64)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static int (*real_openat64)(int, const char *, int, ...);
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_pwrite64)(int, const void *, size_t, off64_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static ssize_t (*real_pwritev)(int, const struct iovec *, int, off_t);
static ssize_t (*real_pwritev64)(int, const struct iovec *, int, off64_t);
static int (*real_ftruncate)(int, off_t);
static int (*real_ftruncate64)(int, off64_t);
static int (*real_truncate)(const char *, off_t);
static int (*real_truncate64)(const char *, off64_t);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_unlink)(const char *);
static int (*real_unlinkat)(int, const char *, int);
static int (*real_rename)(const char *, const char *);
static int (*real_renameat)(int, const char *, int, const char *);
static int (*real_close)(int);
static int (*real_dup)(int);
static int (*real_dup2)(int, int);
static int (*real_dup3)(int, int, int);

#define RESOLVE(name) real_##name = dlsym(RTLD_NEXT, #name)

__attribute__((constructor)) static void powerloss_init(void) {
    RESOLVE(open); RESOLVE(open64); RESOLVE(openat); RESOLVE(openat64);
    RESOLVE(write); RESOLVE(pwrite); RESOLVE(pwrite64); RESOLVE(writev);
    RESOLVE(pwritev); RESOLVE(pwritev64); RESOLVE(ftruncate); RESOLVE(ftruncate64);
    RESOLVE(truncate); RESOLVE(truncate64); RESOLVE(fsync); RESOLVE(fdatasync);
    RESOLVE(unlink); RESOLVE(unlinkat); RESOLVE(rename); RESOLVE(renameat);
    RESOLVE(close); RESOLVE(dup); RESOLVE(dup2); RESOLVE(dup3);
    const char *dir = getenv("POWERLOSS_DIR"), *log = getenv("POWERLOSS_LOG");
    if (!dir || !log || !realpath(dir, root)) return;
    rootlen = strlen(root);
    logfd = (int)syscall(SYS_openat, AT_FDCWD, log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
}

static int under_root(const char *abspath) {
    return logfd >= 0 && strncmp(abspath, root, rootlen) == 0 &&
           (abspath[rootlen] == '/' || abspath[rootlen] == '\0');
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static uint64_t new_op(void) {
    return ((uint64_t)getpid() << 32) | __atomic_add_fetch(&opcounter, 1, __ATOMIC_RELAXED);
}

/* One record: header, path, the data pieces (iov), trailer; a single writev on the log. */
static void emit(uint16_t type, uint16_t flags, uint64_t op, uint64_t dev, uint64_t ino, int64_t offset,
                 int64_t arg, const char *path, const struct iovec *data, int ndata) {
    if (logfd < 0) return;
    int saved = errno;
    struct hdr h;
    uint32_t trailer = TRAILER;
    size_t datalen = 0, pathlen = path ? strlen(path) : 0;
    for (int i = 0; i < ndata; i++) datalen += data[i].iov_len;
    memset(&h, 0, sizeof h);
    h.magic = MAGIC; h.type = type; h.flags = flags; h.pid = (uint32_t)getpid(); h.op = op;
    h.ts = now_ns(); h.dev = dev; h.ino = ino; h.offset = offset; h.arg = arg;
    h.pathlen = (uint32_t)pathlen; h.datalen = (uint32_t)datalen;
    h.total = (uint32_t)(sizeof h + pathlen + datalen + sizeof trailer);
    struct iovec stackv[64], *v = stackv;
    int n = ndata + 3;
    if (n > 64 && !(v = malloc(sizeof(struct iovec) * (size_t)n))) { errno = saved; return; }
    v[0].iov_base = &h; v[0].iov_len = sizeof h;
    v[1].iov_base = (void *)(path ? path : ""); v[1].iov_len = pathlen;
    for (int i = 0; i < ndata; i++) v[2 + i] = data[i];
    v[n - 1].iov_base = &trailer; v[n - 1].iov_len = sizeof trailer;
    if (n > IOV_MAX) { /* too many pieces for one writev: copy them into one buffer */
        char *buf = malloc(datalen ? datalen : 1), *p = buf;
        if (!buf) { if (v != stackv) free(v); errno = saved; return; }
        for (int i = 0; i < ndata; i++) { memcpy(p, data[i].iov_base, data[i].iov_len); p += data[i].iov_len; }
        v[2].iov_base = buf; v[2].iov_len = datalen; v[3] = v[n - 1]; n = 4;
        syscall(SYS_writev, logfd, v, n);
        free(buf);
    } else {
        syscall(SYS_writev, logfd, v, n);
    }
    if (v != stackv) free(v);
    errno = saved;
}

/* Remember an fd if it names a file under the root; log the open if it may create or truncate. */
static void track(int fd, int flags) {
    if (fd < 0 || fd >= FDMAX) return;
    fds[fd].traced = 0;
    if (logfd < 0) return;
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return;
    path[n] = '\0';
    if (!under_root(path)) return;
    struct stat st;
    if (fstat(fd, &st) != 0) return;
    fds[fd].dev = st.st_dev; fds[fd].ino = st.st_ino;
    fds[fd].flags = ((flags & (O_SYNC | O_DSYNC)) ? F_SYNCFD : 0) | ((flags & O_APPEND) ? F_APPENDFD : 0);
    fds[fd].traced = 1;
    emit(R_OPEN, S_ISDIR(st.st_mode) ? F_DIR : 0, 0, st.st_dev, st.st_ino, flags, (int64_t)st.st_size, path, NULL, 0);
}

/* The traced fd's identity, checked again (an fd closed behind the shim's back is dropped). */
static int traced(int fd, struct stat *st) {
    if (fd < 0 || fd >= FDMAX || !fds[fd].traced) return 0;
    if (fstat(fd, st) != 0 || (uint64_t)st->st_dev != fds[fd].dev || (uint64_t)st->st_ino != fds[fd].ino) {
        fds[fd].traced = 0;
        return 0;
    }
    return 1;
}

static int mode_of(int flags, va_list ap) {
    return ((flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE) ? va_arg(ap, int) : 0;
}

int open(const char *path, int flags, ...) {
    va_list ap; va_start(ap, flags); int mode = mode_of(flags, ap); va_end(ap);
    int fd = real_open(path, flags, mode);
    track(fd, flags);
    return fd;
}
int open64(const char *path, int flags, ...) {
    va_list ap; va_start(ap, flags); int mode = mode_of(flags, ap); va_end(ap);
    int fd = real_open64(path, flags, mode);
    track(fd, flags);
    return fd;
}
int openat(int dirfd, const char *path, int flags, ...) {
    va_list ap; va_start(ap, flags); int mode = mode_of(flags, ap); va_end(ap);
    int fd = real_openat(dirfd, path, flags, mode);
    track(fd, flags);
    return fd;
}
int openat64(int dirfd, const char *path, int flags, ...) {
    va_list ap; va_start(ap, flags); int mode = mode_of(flags, ap); va_end(ap);
    int fd = real_openat64(dirfd, path, flags, mode);
    track(fd, flags);
    return fd;
}
int creat(const char *path, mode_t mode) { return open(path, O_CREAT | O_WRONLY | O_TRUNC, mode); }
int creat64(const char *path, mode_t mode) { return open64(path, O_CREAT | O_WRONLY | O_TRUNC, mode); }

/* A write at ``offset`` (-1: the fd's position, found after the call). */
static ssize_t do_write(int fd, const struct iovec *iov, int iovcnt, off64_t offset,
                        ssize_t (*call)(int, const struct iovec *, int, off64_t)) {
    struct stat st;
    if (!traced(fd, &st)) return call(fd, iov, iovcnt, offset);
    uint64_t op = new_op();
    uint16_t flags = (uint16_t)fds[fd].flags;
    int64_t guess = offset;
    if (offset < 0) guess = (flags & F_APPENDFD) ? (int64_t)st.st_size : (int64_t)lseek(fd, 0, SEEK_CUR);
    emit(R_WRITE_BEGIN, flags, op, st.st_dev, st.st_ino, guess, 0, NULL, iov, iovcnt);
    ssize_t r = call(fd, iov, iovcnt, offset);
    int saved = errno;
    int64_t real_off = offset;
    if (offset < 0) real_off = r > 0 ? (int64_t)lseek(fd, 0, SEEK_CUR) - r : guess;
    emit(R_WRITE_END, flags, op, st.st_dev, st.st_ino, real_off, r, NULL, NULL, 0);
    errno = saved;
    return r;
}

static ssize_t call_write(int fd, const struct iovec *iov, int n, off64_t o) {
    (void)o; (void)n; return real_write(fd, iov[0].iov_base, iov[0].iov_len);
}
static ssize_t call_pwrite(int fd, const struct iovec *iov, int n, off64_t o) {
    (void)n; return real_pwrite64(fd, iov[0].iov_base, iov[0].iov_len, o);
}
static ssize_t call_writev(int fd, const struct iovec *iov, int n, off64_t o) {
    (void)o; return real_writev(fd, iov, n);
}
static ssize_t call_pwritev(int fd, const struct iovec *iov, int n, off64_t o) {
    return real_pwritev64(fd, iov, n, o);
}

ssize_t write(int fd, const void *buf, size_t count) {
    struct iovec v = {(void *)buf, count};
    return do_write(fd, &v, 1, -1, call_write);
}
ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset) {
    struct iovec v = {(void *)buf, count};
    if (offset < 0) return real_pwrite(fd, buf, count, offset);
    return do_write(fd, &v, 1, offset, call_pwrite);
}
ssize_t pwrite64(int fd, const void *buf, size_t count, off64_t offset) {
    struct iovec v = {(void *)buf, count};
    if (offset < 0) return real_pwrite64(fd, buf, count, offset);
    return do_write(fd, &v, 1, offset, call_pwrite);
}
ssize_t writev(int fd, const struct iovec *iov, int iovcnt) { return do_write(fd, iov, iovcnt, -1, call_writev); }
ssize_t pwritev(int fd, const struct iovec *iov, int iovcnt, off_t offset) {
    if (offset < 0) return real_pwritev(fd, iov, iovcnt, offset);
    return do_write(fd, iov, iovcnt, offset, call_pwritev);
}
ssize_t pwritev64(int fd, const struct iovec *iov, int iovcnt, off64_t offset) {
    if (offset < 0) return real_pwritev64(fd, iov, iovcnt, offset);
    return do_write(fd, iov, iovcnt, offset, call_pwritev);
}

static int do_ftruncate(int fd, off64_t length) {
    struct stat st;
    if (!traced(fd, &st)) return real_ftruncate64(fd, length);
    uint64_t op = new_op();
    emit(R_TRUNC_BEGIN, 0, op, st.st_dev, st.st_ino, length, 0, NULL, NULL, 0);
    int r = real_ftruncate64(fd, length);
    emit(R_TRUNC_END, 0, op, st.st_dev, st.st_ino, length, r, NULL, NULL, 0);
    return r;
}
int ftruncate(int fd, off_t length) { return do_ftruncate(fd, length); }
int ftruncate64(int fd, off64_t length) { return do_ftruncate(fd, length); }

/* The absolute form of ``path`` relative to ``dirfd`` (only its directory part is resolved). */
static int absolute(int dirfd, const char *path, char *out) {
    char base[PATH_MAX];
    if (path[0] == '/') {
        base[0] = '\0';
    } else if (dirfd == AT_FDCWD) {
        if (!getcwd(base, sizeof base)) return 0;
    } else {
        char link[64];
        snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
        ssize_t n = readlink(link, base, sizeof base - 1);
        if (n <= 0) return 0;
        base[n] = '\0';
    }
    char joined[PATH_MAX * 2];
    snprintf(joined, sizeof joined, "%s%s%s", base, path[0] == '/' ? "" : "/", path);
    /* Resolve the directory, keep the last component (it may be a file about to vanish). */
    char *slash = strrchr(joined, '/');
    if (!slash) return 0;
    *slash = '\0';
    char dir[PATH_MAX];
    if (!realpath(joined[0] ? joined : "/", dir)) return 0;
    int n = snprintf(out, PATH_MAX, "%s/%s", strcmp(dir, "/") == 0 ? "" : dir, slash + 1);
    return n > 0 && n < PATH_MAX;
}

static int do_truncate(const char *path, off64_t length) {
    char abs[PATH_MAX];
    struct stat st;
    if (logfd < 0 || !absolute(AT_FDCWD, path, abs) || !under_root(abs) || stat(abs, &st) != 0)
        return real_truncate64(path, length);
    uint64_t op = new_op();
    emit(R_TRUNC_BEGIN, 0, op, st.st_dev, st.st_ino, length, 0, NULL, NULL, 0);
    int r = real_truncate64(path, length);
    emit(R_TRUNC_END, 0, op, st.st_dev, st.st_ino, length, r, NULL, NULL, 0);
    return r;
}
int truncate(const char *path, off_t length) { return do_truncate(path, length); }
int truncate64(const char *path, off64_t length) { return do_truncate(path, length); }

static int do_sync(int fd, int dataonly) {
    struct stat st;
    int (*call)(int) = dataonly ? real_fdatasync : real_fsync;
    if (!traced(fd, &st)) return call(fd);
    uint64_t op = new_op();
    uint16_t flags = dataonly ? F_DATAONLY : 0;
    emit(R_FSYNC_BEGIN, flags, op, st.st_dev, st.st_ino, 0, 0, NULL, NULL, 0);
    int r = call(fd);
    emit(R_FSYNC_END, flags, op, st.st_dev, st.st_ino, 0, r, NULL, NULL, 0);
    return r;
}
int fsync(int fd) { return do_sync(fd, 0); }
int fdatasync(int fd) { return do_sync(fd, 1); }

int unlinkat(int dirfd, const char *path, int flags) {
    char abs[PATH_MAX];
    struct stat st;
    int t = logfd >= 0 && absolute(dirfd, path, abs) && under_root(abs) && lstat(abs, &st) == 0;
    int r = real_unlinkat(dirfd, path, flags);
    if (t && r == 0) emit(R_UNLINK, 0, 0, st.st_dev, st.st_ino, 0, 0, abs, NULL, 0);
    return r;
}
int unlink(const char *path) {
    char abs[PATH_MAX];
    struct stat st;
    int t = logfd >= 0 && absolute(AT_FDCWD, path, abs) && under_root(abs) && lstat(abs, &st) == 0;
    int r = real_unlink(path);
    if (t && r == 0) emit(R_UNLINK, 0, 0, st.st_dev, st.st_ino, 0, 0, abs, NULL, 0);
    return r;
}

static int do_rename(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, int at) {
    char from[PATH_MAX], to[PATH_MAX];
    struct stat st;
    int t = logfd >= 0 && absolute(olddirfd, oldpath, from) && absolute(newdirfd, newpath, to) &&
            (under_root(from) || under_root(to)) && lstat(from, &st) == 0;
    int r = at ? real_renameat(olddirfd, oldpath, newdirfd, newpath) : real_rename(oldpath, newpath);
    if (t && r == 0) {
        struct iovec v = {to, strlen(to)};
        emit(R_RENAME, 0, 0, st.st_dev, st.st_ino, 0, 0, from, &v, 1);
    }
    return r;
}
int rename(const char *oldpath, const char *newpath) { return do_rename(AT_FDCWD, oldpath, AT_FDCWD, newpath, 0); }
int renameat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath) {
    return do_rename(olddirfd, oldpath, newdirfd, newpath, 1);
}

int close(int fd) {
    if (fd >= 0 && fd < FDMAX) fds[fd].traced = 0;
    return real_close(fd);
}

static void copy_fd(int from, int to) {
    if (to < 0 || to >= FDMAX) return;
    if (from >= 0 && from < FDMAX) fds[to] = fds[from];
    else fds[to].traced = 0;
}
int dup(int fd) { int r = real_dup(fd); copy_fd(fd, r); return r; }
int dup2(int fd, int fd2) { int r = real_dup2(fd, fd2); if (r >= 0) copy_fd(fd, r); return r; }
int dup3(int fd, int fd2, int flags) { int r = real_dup3(fd, fd2, flags); if (r >= 0) copy_fd(fd, r); return r; }
