/* The traceback tracker's line search in C (rules/linescan.py is its Python face), and
   rules/logline.quotes_closed.

   first_line(block, start, end, kind, cap) -> int: where the first line of block[start:end]
   (whole lines; block[end - 1] is a newline) that `kind` takes starts, or -1. Exactly what
   rules/tracebacks.py's `_next_line` answers with that kind's byte regexes (`_candidates`):
     kind 0, frames:  EXCEPTION | REQUEST | BLANK
     kind 1, message: RECORD | BLANK
     kind 2, blank:   BLANK
   where, at a line's start (`$` is the line's newline, or end - 1):
     EXCEPTION  (?:- )?(?:[A-Za-z_][\w\x80-\xff]*\.)*[A-Z][A-Z0-9_]*[a-z][\w\x80-\xff]*(?::|\r*$)
     REQUEST    \[\d{4}-[^\]\n]*\] (?:Receive|Finish: |\{"event)
     RECORD     \[\d{4}-
     BLANK      S*$ | S{cap,}   with S = [\t\x0b\x0c\r\x1c-\x20\x80-\xbf\xc2\xe1-\xe3]
   Each is decided from the line's head without backtracking (why each reading equals the
   regex is said beside it); tests/unit/test_linescan.py holds the two equal over stored
   logs, random line soups and every kind and cap.

   The regexes cost a Python call per candidate and, on Hyperscan, ~1 GB/s (they have no
   literal to skip ahead on: every line's start is a place to try); this reads each line's
   head and finds its newline with memchr. The GIL is released over a long span. */

#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

enum { FRAMES = 0, MESSAGE = 1, BLANK_ONLY = 2 };
#define RELEASE_GIL_AT (64 * 1024) /* bytes: below this a GIL hand-off costs more than it frees */

static unsigned char SPACE[256]; /* S above */
static unsigned char WORD[256];  /* [\w\x80-\xff] of a bytes pattern: ASCII \w, or >= 0x80 */

static void init_tables(void) {
    for (int c = 0; c < 256; c++) {
        SPACE[c] = (c == '\t' || c == 0x0b || c == 0x0c || c == '\r' || (c >= 0x1c && c <= 0x20)
                    || (c >= 0x80 && c <= 0xbf) || c == 0xc2 || (c >= 0xe1 && c <= 0xe3));
        WORD[c] = ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
                   || c == '_' || c >= 0x80);
    }
}

static int is_upper(unsigned char c) { return c >= 'A' && c <= 'Z'; }
static int is_lower(unsigned char c) { return c >= 'a' && c <= 'z'; }
static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* BLANK: the run of S from the line's start reaches the newline, or is at least cap long (S
   holds no newline, so the run is the one both branches read). */
static int blank(const unsigned char *p, const unsigned char *nl, Py_ssize_t cap) {
    const unsigned char *q = p;
    while (q < nl && SPACE[*q])
        q++;
    return q == nl || q - p >= cap;
}

/* RECORD: "[", four digits, "-". */
static int record(const unsigned char *p, const unsigned char *nl) {
    return nl - p >= 6 && p[0] == '[' && is_digit(p[1]) && is_digit(p[2]) && is_digit(p[3])
           && is_digit(p[4]) && p[5] == '-';
}

static int starts(const unsigned char *p, const unsigned char *nl, const char *lit) {
    size_t n = strlen(lit);
    return (size_t)(nl - p) >= n && memcmp(p, lit, n) == 0;
}

/* REQUEST: a record whose first "]" ([^\]\n]* cannot pass one, nor the newline) is followed
   by one of the three words. */
static int request(const unsigned char *p, const unsigned char *nl) {
    if (!record(p, nl))
        return 0;
    const unsigned char *close = memchr(p + 6, ']', (size_t)(nl - (p + 6)));
    if (close == NULL)
        return 0;
    return starts(close + 1, nl, " Receive") || starts(close + 1, nl, " Finish: ")
           || starts(close + 1, nl, " {\"event");
}

/* EXCEPTION. The name is a run of word bytes and dots. Every part the group (...\.)* takes
   ends at a dot (its class holds no dot), and what follows the last part is ":", "\r" or the
   newline, never a dot or a word byte: so the parts are the runs between the dots, each part
   but the last must start [A-Za-z_], and the last is the run that ends the name. Within it
   [A-Z][A-Z0-9_]*[a-z]: its first byte upper case, and the first byte past the [A-Z0-9_] run
   a lower-case letter. "(?:- )?" taken or not: without it the line starts with "-", which
   no part may start with. */
static int exception(const unsigned char *p, const unsigned char *nl) {
    if (nl - p >= 2 && p[0] == '-' && p[1] == ' ')
        p += 2;
    for (;;) {
        const unsigned char *part = p;
        while (p < nl && WORD[*p])
            p++;
        if (p < nl && *p == '.') {
            if (p == part || !(is_upper(*part) || is_lower(*part) || *part == '_'))
                return 0;
            p++;
            continue;
        }
        if (p == part || !is_upper(*part))
            return 0;
        const unsigned char *q = part + 1;
        while (q < p && (is_upper(*q) || is_digit(*q) || *q == '_'))
            q++;
        if (q == p || !is_lower(*q))
            return 0;
        if (p < nl && *p == ':')
            return 1;
        while (p < nl && *p == '\r')
            p++;
        return p == nl;
    }
}

static int takes(int kind, const unsigned char *p, const unsigned char *nl, Py_ssize_t cap) {
    switch (kind) {
    case FRAMES:
        return exception(p, nl) || request(p, nl) || blank(p, nl, cap);
    case MESSAGE:
        return record(p, nl) || blank(p, nl, cap);
    default:
        return blank(p, nl, cap);
    }
}

/* The lines are those starting at `start` and after each newline before end - 1 (the
   regexes' endpos): a line whose newline is missing ends at end - 1. */
static Py_ssize_t search(const unsigned char *block, Py_ssize_t start, Py_ssize_t end, int kind,
                         Py_ssize_t cap) {
    const unsigned char *stop = block + end - 1;
    const unsigned char *p = block + start;
    for (;;) {
        const unsigned char *nl = memchr(p, '\n', (size_t)(stop - p));
        if (nl == NULL)
            nl = stop;
        if (takes(kind, p, nl, cap))
            return p - block;
        if (nl >= stop)
            return -1;
        p = nl + 1;
    }
}

static PyObject *first_line(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t start, end, cap;
    int kind;
    if (!PyArg_ParseTuple(args, "y*nnin:first_line", &view, &start, &end, &kind, &cap))
        return NULL;
    if (start < 0 || end > view.len || start >= end || kind < FRAMES || kind > BLANK_ONLY
        || cap < 1) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "first_line: need 0 <= start < end <= len(block), "
                                          "kind 0-2, cap >= 1");
        return NULL;
    }
    Py_ssize_t found;
    if (end - start >= RELEASE_GIL_AT) {
        Py_BEGIN_ALLOW_THREADS
        found = search((const unsigned char *)view.buf, start, end, kind, cap);
        Py_END_ALLOW_THREADS
    } else {
        found = search((const unsigned char *)view.buf, start, end, kind, cap);
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(found);
}

/* quotes_closed(line: str) -> bool: rules/logline.quotes_closed (its definition is the regex
   logline.CLOSED), read over the line's UTF-8: the quotes, the backslash and the newline are
   ASCII, and no byte of a multi-byte character is one of them, so skipping the byte after a
   backslash lands where skipping the character does, or inside that character, on bytes
   that are never read as special. A str with a lone surrogate has no UTF-8: the caller
   reads it in Python (UnicodeEncodeError). */
static PyObject *quotes_closed(PyObject *self, PyObject *arg) {
    (void)self;
    Py_ssize_t size;
    const char *text = PyUnicode_AsUTF8AndSize(arg, &size);
    if (text == NULL)
        return NULL;
    const unsigned char *p = (const unsigned char *)text, *e = p + size;
    while (p < e) {
        unsigned char c = *p;
        if (c == '\\') { /* an escape outside quotes, or the line's last character */
            if (p + 1 == e)
                Py_RETURN_TRUE;
            if (p[1] == '\n') /* nothing escapes a newline */
                Py_RETURN_FALSE;
            p += 2;
            continue;
        }
        if (c != '\'' && c != '"') {
            p++;
            continue;
        }
        p++;
        for (;;) {
            while (p < e && *p != c && *p != '\\')
                p++;
            if (p == e)
                Py_RETURN_FALSE; /* the quote runs on past the line's end */
            if (*p++ == c)
                break; /* the closing quote */
            if (p == e || *p == '\n')
                Py_RETURN_FALSE;
            p++;
        }
    }
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"quotes_closed", quotes_closed, METH_O,
     "quotes_closed(line) -> bool: every quote the line opens closes on it (logline.CLOSED)."},
    {"first_line", first_line, METH_VARARGS,
     "first_line(block, start, end, kind, cap) -> int: the first line of block[start:end] that "
     "kind (0 frames, 1 message, 2 blank) takes, or -1."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_linescan", "The traceback tracker's line search in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__linescan(void) {
    init_tables();
    return PyModule_Create(&module);
}
