/* The stop's walk before its SIGTERM in C (supervise/shell/proctree.py is its Python face and
   the definition: `_walk`, then `_open_walked`).

   held_tree(pid) -> [(pid, pidfd), ...] | None: `pid` and every descendant by the children
   lists (/proc/<p>/task/<tid>/children), parents before their children, the guard itself
   never, each held by a pidfd; a process that started after the walk began (its start in
   clock ticks since boot, /proc/<p>/stat's 22nd field, more than a tick after the walk's
   own clock: a pid number reused meanwhile) or that already exited (its pidfd readable) is
   left out, its pidfd closed. None, with no pidfd left open: the kernel keeps no children
   lists (the main thread lives but has no list), a task directory could not be read for
   another reason than the process being gone, or pidfds are not there (any pidfd_open error
   but ESRCH) -- the caller then walks in Python, which says why.

   In Python the same reads took ~0.12 ms cold for the bench's one-process child and ~1 ms
   for a process of 60 threads (one children list per thread), before the SIGTERM: each
   read a Python call, its path an f-string, its list a split. The GIL is held throughout:
   on the early stop's path a reader that let it go met the other threads waiting for it.
   /proc reads do not block; a tree of thousands of threads holds it a few milliseconds. */

#define _GNU_SOURCE
#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434 /* the same number on every architecture since Linux 5.3 */
#endif

typedef struct {
    long *at;
    size_t n, cap;
} Pids;

static int push(Pids *pids, long pid) {
    if (pids->n == pids->cap) {
        size_t cap = pids->cap ? pids->cap * 2 : 64;
        long *grown = realloc(pids->at, cap * sizeof(long));
        if (grown == NULL)
            return -1;
        pids->at = grown;
        pids->cap = cap;
    }
    pids->at[pids->n++] = pid;
    return 0;
}

static int holds(const Pids *pids, long pid) {
    for (size_t i = 0; i < pids->n; i++)
        if (pids->at[i] == pid)
            return 1;
    return 0;
}

/* A whole small /proc file into buf (NUL-terminated; a longer one is cut at size - 1, which
   a children list of thousands of pids would be: read on in pieces instead, see below).
   -1 with errno where it cannot be opened or read. */
static ssize_t read_file(const char *path, char *buf, size_t size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t got = 0;
    while (got < size - 1) {
        ssize_t n = read(fd, buf + got, size - 1 - got);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            int saved = errno;
            close(fd);
            errno = saved;
            return -1;
        }
        if (n == 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    buf[got] = '\0';
    return (ssize_t)got;
}

/* The children of one thread, pushed onto `todo`: 0, or -1 (errno) where the list cannot be
   opened or read (then none of it is pushed, as in Python), or -2 on no memory. The list is
   read in pieces: a pid may straddle two. */
static int thread_children(const char *path, Pids *todo) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t before = todo->n;
    char buf[4096];
    long value = 0;
    int in_number = 0;
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) { /* a thread that ended meanwhile: no children of its own */
            int saved = errno;
            close(fd);
            todo->n = before;
            errno = saved;
            return -1;
        }
        if (n == 0)
            break;
        for (ssize_t i = 0; i < n; i++) {
            char c = buf[i];
            if (c >= '0' && c <= '9') {
                value = value * 10 + (c - '0');
                in_number = 1;
            } else if (in_number) {
                if (push(todo, value) < 0) {
                    close(fd);
                    return -2;
                }
                value = 0;
                in_number = 0;
            }
        }
    }
    close(fd);
    if (in_number && push(todo, value) < 0)
        return -2;
    return 0;
}

enum { KIDS_OK = 0, KIDS_NO_LISTS = 1, KIDS_NO_MEMORY = 2 };

/* `_children(pid)`: every thread's children list onto `todo`. A process that is gone has
   none (KIDS_OK); KIDS_NO_LISTS where Python's answer is None. */
static int children(long pid, Pids *todo) {
    char path[96];
    snprintf(path, sizeof path, "/proc/%ld/task", pid);
    DIR *dir = opendir(path);
    if (dir == NULL)
        return errno == ENOENT ? KIDS_OK : KIDS_NO_LISTS;
    struct dirent *entry;
    int result = KIDS_OK;
    while ((entry = readdir(dir)) != NULL) {
        char *end;
        long tid = strtol(entry->d_name, &end, 10);
        if (entry->d_name[0] < '0' || entry->d_name[0] > '9' || *end != '\0')
            continue; /* "." and ".." */
        snprintf(path, sizeof path, "/proc/%ld/task/%ld/children", pid, tid);
        int done = thread_children(path, todo);
        if (done == -2) {
            result = KIDS_NO_MEMORY;
            break;
        }
        if (done == -1 && errno == ENOENT && tid == pid) {
            /* the main thread has no list: is it there at all (the process gone)? */
            snprintf(path, sizeof path, "/proc/%ld/task/%ld", pid, tid);
            if (access(path, F_OK) == 0) {
                result = KIDS_NO_LISTS;
                break;
            }
        }
        /* any other error: a thread that ended meanwhile */
    }
    closedir(dir);
    return result;
}

/* /proc/<pid>/stat's 22nd field (the start, in clock ticks since boot); -1: unreadable. */
static long long start_ticks(long pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    if (read_file(path, buf, sizeof buf) < 0)
        return -1;
    char *at = strrchr(buf, ')'); /* the command's name may hold spaces and parentheses */
    if (at == NULL || at[1] == '\0')
        return -1;
    at += 2; /* the state: the 3rd field */
    for (int field = 3; field < 22; field++) {
        at = strchr(at, ' ');
        if (at == NULL)
            return -1;
        at++;
    }
    char *end;
    long long ticks = strtoll(at, &end, 10);
    return end == at ? -1 : ticks;
}

static void close_all(const Pids *fds) {
    for (size_t i = 0; i < fds->n; i++)
        close((int)fds->at[i]);
}

static PyObject *held_tree(PyObject *self, PyObject *arg) {
    (void)self;
    long root = PyLong_AsLong(arg);
    if (root == -1 && PyErr_Occurred())
        return NULL;
    struct timespec now;
    clock_gettime(CLOCK_BOOTTIME, &now);
    double since = ((double)now.tv_sec + (double)now.tv_nsec / 1e9) * (double)sysconf(_SC_CLK_TCK);
    long me = (long)getpid();
    Pids todo = {0}, found = {0}, held = {0}, fds = {0};
    PyObject *result = NULL;
    int no_memory = 0, walked = 1;
    if (push(&todo, root) < 0)
        no_memory = 1;
    while (!no_memory && todo.n) {
        long p = todo.at[--todo.n];
        if (p == me || holds(&found, p))
            continue;
        int kids = children(p, &todo);
        if (kids == KIDS_NO_MEMORY || (kids == KIDS_OK && push(&found, p) < 0)) {
            no_memory = 1;
        } else if (kids == KIDS_NO_LISTS) {
            walked = 0;
            break;
        }
    }
    /* `_open_walked`: a pidfd for each, in the walk's order */
    for (size_t i = 0; walked && !no_memory && i < found.n; i++) {
        long p = found.at[i];
        int fd = (int)syscall(SYS_pidfd_open, (pid_t)p, 0);
        if (fd < 0) {
            if (errno == ESRCH)
                continue;
            walked = 0; /* no pidfds here */
            break;
        }
        long long begun = start_ticks(p);
        struct pollfd poller = {.fd = fd, .events = POLLIN};
        if (begun < 0 || (double)begun > since + 1 || poll(&poller, 1, 0) > 0) {
            close(fd);
            continue;
        }
        if (push(&held, p) < 0 || push(&fds, fd) < 0) {
            close(fd);
            no_memory = 1;
        }
    }
    if (no_memory) {
        close_all(&fds);
        PyErr_NoMemory();
    } else if (!walked) {
        close_all(&fds);
        result = Py_NewRef(Py_None);
    } else if ((result = PyList_New((Py_ssize_t)held.n)) != NULL) {
        for (size_t i = 0; i < held.n; i++) {
            PyObject *pair = Py_BuildValue("(li)", held.at[i], (int)fds.at[i]);
            if (pair == NULL) {
                Py_CLEAR(result);
                close_all(&fds); /* none is the caller's yet */
                break;
            }
            PyList_SetItem(result, (Py_ssize_t)i, pair);
        }
    } else {
        close_all(&fds);
    }
    free(todo.at);
    free(found.at);
    free(held.at);
    free(fds.at);
    return result;
}

static PyMethodDef methods[] = {
    {"held_tree", held_tree, METH_O,
     "held_tree(pid) -> [(pid, pidfd)] | None: pid and its descendants by the children lists, "
     "each held by a pidfd (one that started after the walk, or already exited, left out); "
     "None where there are no children lists or no pidfds."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_proctree", "The stop's walk of a process tree in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__proctree(void) { return PyModule_Create(&module); }
