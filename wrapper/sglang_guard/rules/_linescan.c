/* The traceback tracker's line search in C (rules/linescan.py is its Python face), its walk
   over the lines nobody reads (`advance`), the reader's walk that steps its checked lines too
   (`read_walk`), rules/logline.quotes_closed, and two pieces of the log path that must not
   hold the GIL: the per-line search of a set of plain literals (`literal_lines`) and the
   writer's writes (`write_pieces`), each said where it is defined below.

   first_line(block, start, end, kind, cap[, widest]) -> int: where the first line of
   block[start:end] (whole lines; block[end - 1] is a newline) that `kind` takes starts, or -1
   (`widest`: the widest vector loop it may take, as `search` says). Exactly what
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
   head and finds the newlines 64 bytes at a time (`search`). The GIL is released over a long
   span. */

#define _GNU_SOURCE /* memrchr */
#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The vector loops (the line search's byte classes, literal_lines' anchors) are built for
   the widest x86-64 units with __attribute__((target)) and chosen where the CPU has them
   (__builtin_cpu_supports); SSE2 is every x86-64's. */
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
#endif

enum { FRAMES = 0, MESSAGE = 1, BLANK_ONLY = 2 };
#define RELEASE_GIL_AT (64 * 1024) /* bytes: below this a GIL hand-off costs more than it frees */

static unsigned char SPACE[256]; /* S above */
static unsigned char WORD[256];  /* [\w\x80-\xff] of a bytes pattern: ASCII \w, or >= 0x80 */

static void init_rarity(void);
static void init_widest(void);

static void init_tables(void) {
    init_rarity();
    init_widest();
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
   by one of the three words. A record's "]" comes some 15 bytes in: a loop finds it sooner
   than a call to memchr. */
static int request(const unsigned char *p, const unsigned char *nl) {
    if (!record(p, nl))
        return 0;
    const unsigned char *close = p + 6;
    while (close < nl && *close != ']')
        close++;
    if (close == nl)
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

/* FRAMES goes by the line's first byte, after which one branch at most can take it: an empty
   line is blank (S* reaches the newline); a "[" starts no exception (that takes "-" or
   [A-Za-z_]) and no blank (S holds no "[", and cap >= 1), so only a request; a byte of S starts
   no request and no exception (none of S is "-" or ASCII), so only a blank; any other byte
   starts no request and no blank (its S run is empty: shorter than cap, short of the
   newline), so only an exception. */
static int takes(int kind, const unsigned char *p, const unsigned char *nl, Py_ssize_t cap) {
    switch (kind) {
    case FRAMES:
        if (p == nl)
            return 1;
        if (*p == '[')
            return request(p, nl);
        if (SPACE[*p])
            return blank(p, nl, cap);
        return exception(p, nl);
    case MESSAGE:
        return record(p, nl) || blank(p, nl, cap);
    default:
        return blank(p, nl, cap);
    }
}

/* The lines are those starting at `start` and after each newline before end - 1 (the
   regexes' endpos): a line whose newline is missing ends at end - 1. Only block[start:end - 1]
   is read (start < end: every caller's span holds a byte).

   Most lines of a log are taken by no kind, and most say so by their first bytes: a memchr
   call per line to find its newline, then `takes`, cost ~40 ns a line over the bench's log
   mix, most of it mispredicted branches. The vector loops below (AVX-512BW or AVX2, where
   the CPU has them) read 64 bytes at a time into masks of byte classes (`Classes`, bit k
   for at[k]) and turn away, without visiting them, the lines that no kind could take by
   their first bytes (`candidates` says which and why); each line left, and every line of the
   last bytes short of 64, is decided by `takes` as before: the same lines, the same answer
   (tests/unit/test_linescan.py holds every width equal). A block no line starts in (inside
   a long line, decided at its start) costs one compare. Over a 256 KiB block of traceback
   frames (in cache, Intel Xeon VM): memchr line by line ~35-47 us, AVX2 ~26-42, AVX-512BW
   ~19-29; an SSE2 loop (four compares for each class) took ~46-74 and is not built: without
   AVX2 the search is memchr's. */

/* From the line at p, one line at a time, to the span's end: where the first that `kind`
   takes starts, or -1. The line's newline is at `from` or past it (p[0:from - p] holds
   none). */
static Py_ssize_t search_from(const unsigned char *block, const unsigned char *p,
                              const unsigned char *from, const unsigned char *stop, int kind,
                              Py_ssize_t cap) {
    for (;;) {
        const unsigned char *nl = memchr(from, '\n', (size_t)(stop - from));
        if (nl == NULL)
            nl = stop;
        if (takes(kind, p, nl, cap))
            return p - block;
        if (nl >= stop)
            return -1;
        p = from = nl + 1;
    }
}

/* The classes of 64 bytes: the newlines, " ", the printable bytes 0x21-0x7f (none is a
   newline or in S), and the printable bytes a line `kind` may take can start with (`first`):
   for FRAMES a request's "[" or an exception's "-", "_" or letter, read as "-" or one of
   0x41-0x7f but "{" (three compares: the few bytes this takes too, "\\", "]", "^", "`", "|",
   "}", "~" and DEL, only cost visits); for MESSAGE a record's "["; for BLANK none. */
typedef struct {
    uint64_t newline, space, printable, first;
} Classes;

/* Which lines of the 64 bytes must be visited: a bit in each (a line may have several).
   `starts`: the lines that start there. A line is turned away where none of `takes`' branches
   can take it:
   - one starting with " " whose run of spaces ends at a printable byte within the 64, when
     cap >= 64: that is where its S run ends too (printable is not S), short of the newline
     and of cap, and " " starts no exception, request or record. The run's end is found for
     all such lines at once: adding each line's first bit to `space` carries through its run
     to the byte after it. A run past the 64 bytes, or one that ends elsewhere (a newline,
     another byte of S), is visited.
   - one starting with a printable byte not in `first`: no S (not blank, and not empty), and
     none of the kind's other branches starts with it.
   (A "[" line is visited for FRAMES: marking those that hold "] R", "] F" or "] {", as a
   request must, cost more in compares than it saved in visits over the bench's mixes.)
   Every other line is visited: the empty ones (a newline first), other bytes of S, and the
   bytes not printable. */
static inline __attribute__((always_inline)) uint64_t candidates(const Classes *c, uint64_t starts,
                                                                  int kind, Py_ssize_t cap) {
    uint64_t spaced = starts & c->space, ends;
    uint64_t want = cap < 64 ? spaced : 0;
    if (__builtin_add_overflow(c->space, spaced, &ends))
        want |= 1ULL << (63 - __builtin_clzll(spaced)); /* the last line's run goes on */
    want |= ends & ~c->space & ~c->printable;
    (void)kind; /* in c->first */
    return want | (starts & ~c->space & (~c->printable | c->first));
}

/* Where a vector loop stands: the next 64 bytes at `at`, the start of the line they begin in
   (`line`), and whether a line starts at `at` (`carry`, 1 or 0). */
typedef struct {
    const unsigned char *block, *stop, *at, *line;
    uint64_t carry;
} Scan;

/* Visit the lines `candidates` leaves of the 64 bytes at s->at (classes c): the start of
   the first that `kind` takes, or -1 (none in the span); -2: none here, s moved past them
   (past the last line visited, where that line goes on past them). */
static inline __attribute__((always_inline)) Py_ssize_t visit(Scan *s, const Classes *c,
                                                              int kind, Py_ssize_t cap) {
    const unsigned char *at = s->at;
    uint64_t starts = c->newline << 1 | s->carry;
    uint64_t cand = candidates(c, starts, kind, cap);
    while (cand) {
        int k = __builtin_ctzll(cand);
        uint64_t before = starts & (~0ULL >> (63 - k)), later = c->newline & (~0ULL << k);
        const unsigned char *p = before ? at + 63 - __builtin_clzll(before) : s->line;
        const unsigned char *nl = later ? at + __builtin_ctzll(later)
                                        : memchr(at + 64, '\n', (size_t)(s->stop - (at + 64)));
        if (nl == NULL)
            nl = s->stop;
        if (takes(kind, p, nl, cap))
            return p - s->block;
        if (nl >= s->stop)
            return -1;
        if (nl - at >= 63) { /* the next line starts at or past the next 64 bytes */
            s->at = s->line = nl + 1;
            s->carry = 1;
            return -2;
        }
        cand &= ~0ULL << (nl - at + 1); /* the lines after this one */
    }
    s->carry = c->newline >> 63;
    s->at = at + 64;
    if (s->carry) /* a line starts at the next 64 bytes (or at end - 1, where they stop) */
        s->line = s->at;
    else if (starts)
        s->line = at + 63 - __builtin_clzll(starts);
    return -2;
}

#if defined(HAVE_AVX2_PATH)
__attribute__((target("avx512f,avx512bw"))) static Py_ssize_t search_avx512(
    const unsigned char *block, Py_ssize_t start, Py_ssize_t end, int kind, Py_ssize_t cap) {
    Scan s = {block, block + end - 1, block + start, block + start, 1};
    const __m512i newline = _mm512_set1_epi8('\n'), bracket = _mm512_set1_epi8('['),
                  space = _mm512_set1_epi8(' '), upper = _mm512_set1_epi8(0x40),
                  brace = _mm512_set1_epi8('{'), dash = _mm512_set1_epi8('-');
    while (s.stop - s.at >= 64) {
        __m512i v = _mm512_loadu_si512((const void *)s.at);
        Classes c;
        c.newline = _mm512_cmpeq_epi8_mask(v, newline);
        if (!(c.newline | s.carry)) { /* inside a line decided where it started */
            s.at += 64;
            continue;
        }
        c.space = _mm512_cmpeq_epi8_mask(v, space);
        c.printable = _mm512_cmpgt_epi8_mask(v, space);
        if (kind == FRAMES)
            c.first = (_mm512_cmpgt_epi8_mask(v, upper) & ~_mm512_cmpeq_epi8_mask(v, brace))
                      | _mm512_cmpeq_epi8_mask(v, dash);
        else
            c.first = kind == MESSAGE ? _mm512_cmpeq_epi8_mask(v, bracket) : 0;
        Py_ssize_t found = visit(&s, &c, kind, cap);
        if (found != -2)
            return found;
    }
    return search_from(block, s.line, s.at, s.stop, kind, cap);
}

/* 32 bytes' compare as a mask */
#define MASK32(x) ((uint64_t)(uint32_t)_mm256_movemask_epi8(x))

__attribute__((target("avx2"))) static Py_ssize_t search_avx2(
    const unsigned char *block, Py_ssize_t start, Py_ssize_t end, int kind, Py_ssize_t cap) {
    Scan s = {block, block + end - 1, block + start, block + start, 1};
    const __m256i newline = _mm256_set1_epi8('\n'), bracket = _mm256_set1_epi8('['),
                  space = _mm256_set1_epi8(' '), upper = _mm256_set1_epi8(0x40),
                  brace = _mm256_set1_epi8('{'), dash = _mm256_set1_epi8('-');
    while (s.stop - s.at >= 64) {
        __m256i v[2] = {_mm256_loadu_si256((const __m256i *)s.at),
                        _mm256_loadu_si256((const __m256i *)(s.at + 32))};
        Classes c = {0, 0, 0, 0};
        for (int h = 0; h < 2; h++)
            c.newline |= MASK32(_mm256_cmpeq_epi8(v[h], newline)) << (32 * h);
        if (!(c.newline | s.carry)) {
            s.at += 64;
            continue;
        }
        for (int h = 0; h < 2; h++) {
            __m256i first = kind == FRAMES
                ? _mm256_or_si256(_mm256_andnot_si256(_mm256_cmpeq_epi8(v[h], brace),
                                                      _mm256_cmpgt_epi8(v[h], upper)),
                                  _mm256_cmpeq_epi8(v[h], dash))
                : _mm256_cmpeq_epi8(v[h], bracket);
            c.space |= MASK32(_mm256_cmpeq_epi8(v[h], space)) << (32 * h);
            c.printable |= MASK32(_mm256_cmpgt_epi8(v[h], space)) << (32 * h);
            if (kind != BLANK_ONLY)
                c.first |= MASK32(first) << (32 * h);
        }
        Py_ssize_t found = visit(&s, &c, kind, cap);
        if (found != -2)
            return found;
    }
    return search_from(block, s.line, s.at, s.stop, kind, cap);
}
#endif

/* The widest loop this CPU has (3 AVX-512BW, 2 AVX2, 0 none), found at import. */
static int cpu_widest;
#ifndef WIDEST
#define WIDEST 3 /* `search`'s widest for the walks: whatever the CPU has (-D for a bench) */
#endif

static void init_widest(void) {
#if defined(HAVE_AVX2_PATH)
    cpu_widest = __builtin_cpu_supports("avx512bw") ? 3 : __builtin_cpu_supports("avx2") ? 2 : 0;
#else
    cpu_widest = 0;
#endif
}

/* Where the first line of block[start:end] that `kind` takes starts, or -1 (see above), on
   the widest loop up to `widest` that the CPU has (3 AVX-512BW, 2 AVX2, less: memchr line by
   line; first_line's tests force each). */
static Py_ssize_t search(const unsigned char *block, Py_ssize_t start, Py_ssize_t end, int kind,
                         Py_ssize_t cap, int widest) {
    switch (widest < cpu_widest ? widest : cpu_widest) {
#if defined(HAVE_AVX2_PATH)
    case 3:
        return search_avx512(block, start, end, kind, cap);
    case 2:
        return search_avx2(block, start, end, kind, cap);
#endif
    default:
        return search_from(block, block + start, block + start, block + end - 1, kind, cap);
    }
}

static PyObject *first_line(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t start, end, cap;
    int kind, widest = WIDEST;
    if (!PyArg_ParseTuple(args, "y*nnin|i:first_line", &view, &start, &end, &kind, &cap,
                          &widest))
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
        found = search((const unsigned char *)view.buf, start, end, kind, cap, widest);
        Py_END_ALLOW_THREADS
    } else {
        found = search((const unsigned char *)view.buf, start, end, kind, cap, widest);
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(found);
}

/* Whether every quote of text[0:n] closes on it (logline.CLOSED), read over its UTF-8: the
   quotes, the backslash and the newline are ASCII, and no byte of a multi-byte character is
   one of them, so skipping the byte after a backslash lands where skipping the character
   does, or inside that character, on bytes that are never read as special. */
static int closed(const unsigned char *p, const unsigned char *e) {
    while (p < e) {
        unsigned char c = *p;
        if (c == '\\') { /* an escape outside quotes, or the line's last character */
            if (p + 1 == e)
                return 1;
            if (p[1] == '\n') /* nothing escapes a newline */
                return 0;
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
                return 0; /* the quote runs on past the line's end */
            if (*p++ == c)
                break; /* the closing quote */
            if (p == e || *p == '\n')
                return 0;
            p++;
        }
    }
    return 1;
}

/* ---- advance: rules/tracebacks.advance over the lines nobody reads --------------------------

   advance(state, block, start, end, cap[, reads]) -> (state, [(start, stop, text), ...]) | None

   What rules/tracebacks.py's `_advance` (its definition) leaves: the state after the whole
   lines block[start:end], and the exception lines that end a traceback's frames among them.
   States: 0 unknown, 1 other, 2 request, 3 traceback, 4 message. It finds the lines that may
   move the state with `search` (above) and steps each as `step` does, on the line as
   logline.clean leaves it. It reads those lines only where cleaning them is taking their
   head: every byte of the head ASCII and none an ESC or a NUL; the text is then the head
   less its trailing CRs, and Python's str regexes (\d, \w, str.strip) read ASCII as below.
   Any other line it would have to step makes it answer None, and the caller walks the span
   in Python. tests/unit/test_linescan.py holds the two equal over stored logs, random line
   soups, every state and several caps. The GIL is released over a long span.

   `reads`: the lines among them (each by the offset just past its newline, ascending) that
   are read, not walked: each is stepped as it is, wherever the walk stands (tracebacks.
   `_advance_reading` is the definition). The reader passes the lines only a traceback's
   header hit (rules/linereader.py): a chunk of many tracebacks then costs one call. */

enum { S_UNKNOWN = 0, S_OTHER = 1, S_REQUEST = 2, S_TRACEBACK = 3, S_MESSAGE = 4 };
enum { ABORT = -1, NO_MEMORY = -2 };
static const char HEADER[] = "Traceback (most recent call last):";

/* A growing array of pairs, flattened: the walk's exception lines (the line's start, its
   newline) and literal_lines' matches (needle, line end). */
typedef struct {
    Py_ssize_t *pairs;
    Py_ssize_t n, size;
} Pairs;

/* Append (first, second) to out, growing it; 0: no memory. */
static int pairs_add(Pairs *out, Py_ssize_t first, Py_ssize_t second) {
    if (out->n + 2 > out->size) {
        Py_ssize_t size = out->size ? out->size * 2 : 64;
        Py_ssize_t *grown = realloc(out->pairs, (size_t)size * sizeof *grown);
        if (grown == NULL)
            return 0;
        out->pairs = grown;
        out->size = size;
    }
    out->pairs[out->n++] = first;
    out->pairs[out->n++] = second;
    return 1;
}

/* str.isspace over ASCII */
static int ws(unsigned char c) {
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
}

static int ascii_word(unsigned char c) {
    return is_upper(c) || is_lower(c) || is_digit(c) || c == '_';
}

/* tracebacks._RECORD_AT at p (a line's start, n bytes to the span's end): the 20 bytes
   "[dddd-dd-dd dd:dd:dd". The pattern holds no newline and the line ends before the span
   does, so the bytes past the span's end that the regex may see cannot be part of a match. */
static int record_head(const unsigned char *p, Py_ssize_t n) {
    static const char shape[] = "[dddd-dd-dd dd:dd:dd";
    if (n < 20)
        return 0;
    for (int k = 0; k < 20; k++) {
        if (shape[k] == 'd' ? !is_digit(p[k]) : p[k] != (unsigned char)shape[k])
            return 0;
    }
    return 1;
}

/* Where logline._RECORD's match of t[0:n] ends, or -1:
   \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,9})?(?: [^\]]{0,200})?\] 
   Each optional group is decided by the byte after what precedes it: "." starts only the
   first, " " only the second, and "]" only the end. The fraction's digits must be followed
   by " " or "]", so they are all of the digit run (1-9 of them); the second group's class
   cannot pass a "]", so it ends at the first "]", which must come within 200 bytes and be
   followed by " ". Without a group taken, the byte it would start must be the end's "]". */
static Py_ssize_t record_end(const unsigned char *t, Py_ssize_t n) {
    if (!record_head(t, n))
        return -1;
    Py_ssize_t i = 20;
    if (i < n && t[i] == '.') {
        Py_ssize_t j = i + 1;
        while (j < n && is_digit(t[j]))
            j++;
        if (j - (i + 1) < 1 || j - (i + 1) > 9)
            return -1;
        i = j;
    }
    if (i < n && t[i] == ' ') {
        const unsigned char *close = memchr(t + i + 1, ']', (size_t)(n - (i + 1)));
        if (close == NULL || (close - t) - (i + 1) > 200)
            return -1;
        i = close - t;
    }
    if (i + 1 < n && t[i] == ']' && t[i + 1] == ' ')
        return i + 2;
    return -1;
}

/* logline.REQUEST_PATTERN at t[i:n]: (?:Receive(?: OpenAI)?: |Finish: |\{"event": ?"request\.) */
static int request_words(const unsigned char *t, Py_ssize_t i, Py_ssize_t n) {
    const unsigned char *p = t + i, *e = t + n;
    return starts(p, e, "Receive: ") || starts(p, e, "Receive OpenAI: ")
           || starts(p, e, "Finish: ") || starts(p, e, "{\"event\": \"request.")
           || starts(p, e, "{\"event\":\"request.");
}

/* logline._EXCEPTION's match at t[0:n] (the text, so `$` is its end):
   (?:- )?(?:[A-Za-z_]\w{0,63}\.){0,8}[A-Z][A-Z0-9_]{0,63}[a-z]\w{0,127}(?::|$)
   As `exception` above reads the unbounded form, the parts are the runs between the dots;
   here also at most 8 before the last, each 1-64 bytes; in the last, [A-Z0-9_]{0,63} ends at
   its first lower-case letter (no other byte of a word run stops it), so that letter is at
   most 64 bytes into the part, and at most 127 bytes follow it. */
static int exception_exact(const unsigned char *t, Py_ssize_t n) {
    Py_ssize_t p = 0;
    int parts = 0;
    if (n >= 2 && t[0] == '-' && t[1] == ' ')
        p = 2;
    for (;;) {
        Py_ssize_t part = p;
        while (p < n && ascii_word(t[p]))
            p++;
        if (p < n && t[p] == '.') {
            if (p == part || p - part > 64 || is_digit(t[part]) || ++parts > 8)
                return 0;
            p++;
            continue;
        }
        if (p == part || !is_upper(t[part]))
            return 0;
        Py_ssize_t q = part + 1;
        while (q < p && !is_lower(t[q]))
            q++;
        if (q == p || q - part > 64 || p - q - 1 > 127)
            return 0;
        return p == n || t[p] == ':';
    }
}

/* The length of t[0:n].rstrip() (ASCII): 0 where the text is blank (`not t.strip()`). */
static Py_ssize_t rstripped(const unsigned char *t, Py_ssize_t n) {
    while (n > 0 && ws(t[n - 1]))
        n--;
    return n;
}

/* rules/tracebacks.step for the text t[0:n] (ASCII): the next state, and in *own whether the
   line is SGLang's own output to read (step's second answer). */
static int step_own(int state, const unsigned char *t, Py_ssize_t n, int *own) {
    Py_ssize_t m = rstripped(t, n);
    Py_ssize_t h = (Py_ssize_t)(sizeof HEADER - 1);
    int header = m >= h && memcmp(t + m - h, HEADER, (size_t)h) == 0;
    int blank = m == 0;
    Py_ssize_t rec = record_end(t, n);
    *own = 0;
    if (rec >= 0) {
        if (request_words(t, rec, n) && !closed(t, t + n))
            return S_REQUEST;
        if (header)
            return S_TRACEBACK;
        return state == S_TRACEBACK ? S_TRACEBACK : S_OTHER;
    }
    if (state == S_REQUEST)
        return S_REQUEST;
    if (header)
        return S_TRACEBACK;
    if (state == S_TRACEBACK) {
        if (blank)
            return S_OTHER;
        *own = exception_exact(t, n);
        return *own ? S_MESSAGE : S_TRACEBACK;
    }
    if (state == S_MESSAGE) {
        *own = !blank && n >= 2 && t[0] == '-' && t[1] == ' ';
        return blank ? S_OTHER : S_MESSAGE;
    }
    *own = !blank;
    return blank ? S_OTHER : state;
}

/* rules/tracebacks.step's next state for the text t[0:n] (ASCII). */
static int step(int state, const unsigned char *t, Py_ssize_t n) {
    int own;
    return step_own(state, t, n, &own);
}

/* Whether t[0:n] holds no byte >= 0x80, no ESC and no NUL, 8 bytes at a time (a byte at a
   time cost ~10% of the reader's walk over the bench's near-miss mix). Where no byte of x has
   its high bit set, (x - 0x01..) & ~x has a high bit set if and only if a byte of x is 0 (the
   lowest zero byte borrows; bytes above it may be marked too, which changes no answer); an
   ESC is a zero byte of x ^ 0x1b.. */
static int plain(const unsigned char *t, Py_ssize_t n) {
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    Py_ssize_t k = 0;
    for (; k + 8 <= n; k += 8) {
        uint64_t x, esc;
        memcpy(&x, t + k, 8);
        esc = x ^ (0x1b * ones);
        if ((x | ((x - ones) & ~x) | ((esc - ones) & ~esc)) & highs)
            return 0;
    }
    for (; k < n; k++) {
        if (t[k] >= 0x80 || t[k] == 0x1b || t[k] == 0)
            return 0;
    }
    return 1;
}

/* The line at `line` (tracebacks._line_at): its newline, and its text as t[0:*n] if cleaning
   it is taking its head (see above); 0: it is not. */
static int text_at(const unsigned char *block, Py_ssize_t line, Py_ssize_t end, Py_ssize_t cap,
                   Py_ssize_t *stop, Py_ssize_t *n) {
    const unsigned char *nl = memchr(block + line, '\n', (size_t)(end - line));
    *stop = nl == NULL ? end - 1 : nl - block; /* end - 1 is a newline (the caller's word) */
    Py_ssize_t head = *stop - line < cap ? *stop - line : cap;
    const unsigned char *t = block + line;
    if (!plain(t, head))
        return 0;
    while (head > 0 && t[head - 1] == '\r')
        head--;
    *n = head;
    return 1;
}

static int walk(int state, const unsigned char *block, Py_ssize_t start, Py_ssize_t end,
                Py_ssize_t cap, Pairs *found);

/* block.rfind(b"\n[", start, at): the last newline in block[start:at - 1] that a "[" follows
   (its "[" before `at`), or -1. */
static Py_ssize_t rfind_record_break(const unsigned char *block, Py_ssize_t start,
                                     Py_ssize_t at) {
    Py_ssize_t end = at - 1;
    while (end > start) {
        const unsigned char *q = memrchr(block + start, '\n', (size_t)(end - start));
        if (q == NULL)
            return -1;
        if (q[1] == '[')
            return q - block;
        end = q - block;
    }
    return -1;
}

/* tracebacks._after_last_record: outside a traceback and a message the last record of the
   span decides; without one, a blank line ends an unknown start. */
static int after_last_record(int state, const unsigned char *block, Py_ssize_t start,
                             Py_ssize_t end, Py_ssize_t cap, Pairs *found) {
    Py_ssize_t at = end - 1, stop, n;
    while (at > start) {
        Py_ssize_t nl = rfind_record_break(block, start, at);
        Py_ssize_t line = nl >= 0 ? nl + 1 : start;
        if (record_head(block + line, end - line)) {
            if (!text_at(block, line, end, cap, &stop, &n))
                return ABORT;
            if (record_end(block + line, n) >= 0)
                return walk(step(state, block + line, n), block, stop + 1, end, cap, found);
        }
        if (nl < 0)
            break;
        at = nl;
    }
    while (state == S_UNKNOWN && start < end) {
        Py_ssize_t line = search(block, start, end, BLANK_ONLY, cap, WIDEST);
        if (line < 0)
            break;
        if (!text_at(block, line, end, cap, &stop, &n))
            return ABORT;
        if (rstripped(block + line, n) == 0)
            return S_OTHER;
        start = stop + 1;
    }
    return state;
}

/* Step the line at `line` (its newline before `end`, put in *stop; its text's length in *n,
   step's own-output answer in *own); an exception line that ends a traceback's frames goes
   into `found`. The state after it, ABORT (the line is not plain ASCII) or NO_MEMORY. */
static int step_line(int state, const unsigned char *block, Py_ssize_t line, Py_ssize_t end,
                     Py_ssize_t cap, Py_ssize_t *stop, Py_ssize_t *n, int *own, Pairs *found) {
    if (!text_at(block, line, end, cap, stop, n))
        return ABORT;
    int after = step_own(state, block + line, *n, own);
    if (state == S_TRACEBACK && after == S_MESSAGE && !pairs_add(found, line, *stop))
        return NO_MEMORY;
    return after;
}

/* tracebacks._advance */
static int walk(int state, const unsigned char *block, Py_ssize_t start, Py_ssize_t end,
                Py_ssize_t cap, Pairs *found) {
    Py_ssize_t stop, n;
    int own;
    while (start < end) {
        if (state != S_TRACEBACK && state != S_MESSAGE)
            return after_last_record(state, block, start, end, cap, found);
        int kind = state == S_TRACEBACK ? FRAMES : MESSAGE;
        Py_ssize_t line = search(block, start, end, kind, cap, WIDEST);
        if (line < 0)
            return state;
        state = step_line(state, block, line, end, cap, &stop, &n, &own, found);
        if (state < 0)
            return state;
        start = stop + 1;
    }
    return state;
}

/* The walk over block[start:end] that reads the lines ending just before each of reads[0:n]
   (tracebacks._advance_reading). */
static int walk_reading(int state, const unsigned char *block, Py_ssize_t start, Py_ssize_t end,
                        Py_ssize_t cap, const Py_ssize_t *reads, Py_ssize_t n, Pairs *found) {
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t stop = reads[k], newline, len;
        int own;
        const unsigned char *nl = memrchr(block + start, '\n', (size_t)(stop - 1 - start));
        Py_ssize_t line = nl == NULL ? start : nl - block + 1;
        state = walk(state, block, start, line, cap, found);
        if (state >= 0)
            state = step_line(state, block, line, stop, cap, &newline, &len, &own, found);
        if (state < 0)
            return state;
        start = stop;
    }
    return walk(state, block, start, end, cap, found);
}

/* reads (a sequence of ints) as a C array in *out (NULL when there are none); 0: an error is
   set (not ints, not ascending within (start, end], or one not just past a newline). */
static int read_stops(PyObject *reads, const unsigned char *block, Py_ssize_t start,
                      Py_ssize_t end, Py_ssize_t **out, Py_ssize_t *n) {
    *out = NULL;
    *n = 0;
    if (reads == NULL || reads == Py_None)
        return 1;
    Py_ssize_t size = PySequence_Size(reads);
    if (size < 0)
        return 0;
    Py_ssize_t *at = size ? malloc((size_t)size * sizeof *at) : NULL;
    if (size && at == NULL) {
        PyErr_NoMemory();
        return 0;
    }
    Py_ssize_t last = start;
    for (Py_ssize_t k = 0; k < size; k++) {
        PyObject *item = PySequence_GetItem(reads, k);
        Py_ssize_t stop = item == NULL ? -1 : PyLong_AsSsize_t(item);
        Py_XDECREF(item);
        if (stop == -1 && PyErr_Occurred()) {
            free(at);
            return 0;
        }
        if (stop <= last || stop > end || block[stop - 1] != '\n') {
            free(at);
            PyErr_SetString(PyExc_ValueError, "advance: reads must ascend within (start, end], "
                                              "each just past a newline");
            return 0;
        }
        at[k] = last = stop;
    }
    *out = at;
    *n = size;
    return 1;
}

/* The exception lines of `found` as [(start, stop, text), ...] (each was read once: ASCII). */
static PyObject *found_list(const unsigned char *block, Py_ssize_t end, Py_ssize_t cap,
                            const Pairs *found) {
    PyObject *list = PyList_New(found->n / 2);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < found->n; k += 2) {
        Py_ssize_t line = found->pairs[k], stop = found->pairs[k + 1], n;
        text_at(block, line, end, cap, &stop, &n);
        PyObject *item = Py_BuildValue("(nnN)", line, stop,
                                       PyUnicode_DecodeASCII((const char *)block + line, n, NULL));
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SetItem(list, (Py_ssize_t)(k / 2), item);
    }
    return list;
}

/* Whether the arguments `advance` and `read_walk` (`name`) share hold; if not, the
   ValueError is set and `view` released. */
static int span_ok(const char *name, int state, Py_buffer *view, Py_ssize_t start,
                   Py_ssize_t end, Py_ssize_t cap) {
    if (state >= S_UNKNOWN && state <= S_MESSAGE && start >= 0 && end <= view->len && cap >= 1
        && (start >= end || ((const unsigned char *)view->buf)[end - 1] == '\n'))
        return 1;
    PyBuffer_Release(view);
    PyErr_Format(PyExc_ValueError, "%s: need a state 0-4, 0 <= start, end <= len(block), "
                                   "block[end - 1] a newline, cap >= 1", name);
    return 0;
}

static PyObject *advance(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t start, end, cap;
    int state;
    PyObject *reads_arg = NULL;
    if (!PyArg_ParseTuple(args, "iy*nnn|O:advance", &state, &view, &start, &end, &cap,
                          &reads_arg))
        return NULL;
    if (!span_ok("advance", state, &view, start, end, cap))
        return NULL;
    const unsigned char *block = (const unsigned char *)view.buf;
    Py_ssize_t *reads, n_reads;
    if (!read_stops(reads_arg, block, start, end, &reads, &n_reads)) {
        PyBuffer_Release(&view);
        return NULL;
    }
    Pairs found = {NULL, 0, 0};
    int after;
    if (end - start >= RELEASE_GIL_AT) {
        Py_BEGIN_ALLOW_THREADS
        after = walk_reading(state, block, start, end, cap, reads, n_reads, &found);
        Py_END_ALLOW_THREADS
    } else {
        after = walk_reading(state, block, start, end, cap, reads, n_reads, &found);
    }
    free(reads);
    PyObject *result = NULL, *list = NULL;
    if (after == NO_MEMORY)
        PyErr_NoMemory();
    else if (after == ABORT)
        result = Py_NewRef(Py_None);
    else if ((list = found_list(block, end, cap, &found)) != NULL)
        result = Py_BuildValue("(iN)", after, list);
    free(found.pairs);
    PyBuffer_Release(&view);
    return result;
}

/* The items of `seq` (at most `max` of them, each bytes-like and not empty; with
   `no_newline`, none holding a newline) as buffers appended to held[*taken...], *count of
   them; 0: an error is set, naming `what` (literal_lines' needles, read_walk's quick
   literals). The caller releases held[0:*taken] either way. */
static int take_literals(PyObject *seq, Py_ssize_t max, int no_newline, const char *what,
                         Py_buffer *held, Py_ssize_t *taken, Py_ssize_t *count) {
    *count = PySequence_Size(seq);
    if (*count < 0)
        return 0;
    if (*count > max) {
        PyErr_Format(PyExc_ValueError, "%s: at most %zd of them", what, max);
        return 0;
    }
    for (Py_ssize_t k = 0; k < *count; k++) {
        PyObject *item = PySequence_GetItem(seq, k);
        if (item == NULL)
            return 0;
        Py_buffer *view = &held[*taken];
        int bad = PyObject_GetBuffer(item, view, PyBUF_SIMPLE);
        Py_DECREF(item);
        if (bad)
            return 0;
        ++*taken;
        if (view->len < 1 || (no_newline && memchr(view->buf, '\n', (size_t)view->len))) {
            PyErr_Format(PyExc_ValueError, "%s: one is empty%s", what,
                         no_newline ? " or holds a newline" : "");
            return 0;
        }
    }
    return 1;
}

/* ---- the quick no: a checked line that no rule of a literal set can take ---------------------

   rules/quick.may_keep is the definition: a line the reader checks (plain ASCII, its text
   t[0:n], `own` step's answer for it) may be one the supervisor's `keeps` takes only if one of
   the `present` literals is in it, or, where logline.error_text finds its error text, one of
   the `fatal` literals (each fatal rule's pattern starts with its own) starts that text (a
   plain record's message) or starts at a place of it outside quotes (rules.QUOTE_LEAD, which
   reads the text from its start without a choice: a quote runs to the first unescaped quote
   like it, a backslash takes the byte after it). The regexes of error_text, each read here
   without backtracking, as said beside it; tests/unit/test_quick.py holds the two equal. */

#define MAX_QUICK 16

typedef struct {
    const unsigned char *bytes;
    Py_ssize_t len;
} Lit;

typedef struct {
    Lit fatal[MAX_QUICK], present[MAX_QUICK];
    Py_ssize_t n_fatal, n_present;
} Quick;

static int lit_at(const unsigned char *t, Py_ssize_t n, Py_ssize_t r, const Lit *l) {
    return l->len <= n - r && memcmp(t + r, l->bytes, (size_t)l->len) == 0;
}

/* logline._COLLECTOR at t[0:n]: [\w.-]{1,64}\s{1,16}\| ; where it ends, or 0. The two
   classes share no byte and neither holds "|": a run longer than its bound leaves a byte of
   its own class where the next part must start, so each run is taken whole. */
static Py_ssize_t collector_end(const unsigned char *t, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n && (ascii_word(t[i]) || t[i] == '.' || t[i] == '-'))
        i++;
    if (i < 1 || i > 64)
        return 0;
    Py_ssize_t j = i;
    while (j < n && ws(t[j]))
        j++;
    if (j - i < 1 || j - i > 16 || n - j < 2 || t[j] != '|' || t[j + 1] != ' ')
        return 0;
    return j + 2;
}

/* logline._ERROR_LEVEL at t[0:n]: (?:ERROR|CRITICAL):\s{1,16}; where it ends (at most 16
   blanks taken), or -1. */
static Py_ssize_t level_end(const unsigned char *t, Py_ssize_t n) {
    Py_ssize_t i;
    if (n >= 6 && memcmp(t, "ERROR:", 6) == 0)
        i = 6;
    else if (n >= 9 && memcmp(t, "CRITICAL:", 9) == 0)
        i = 9;
    else
        return -1;
    Py_ssize_t j = i;
    while (j < n && j - i < 16 && ws(t[j]))
        j++;
    return j > i ? j : -1;
}

static Py_ssize_t name_run(const unsigned char *t, Py_ssize_t i, Py_ssize_t n) {
    while (i < n && !ws(t[i]) && t[i] != ':')
        i++;
    return i;
}

/* logline._ARGPARSE at t[0:n]: [^\s:]{1,128}(?: [^\s:]{1,128})?: (?=error: ); where it ends,
   or -1. Each run is taken whole (a shorter one leaves a byte of its class, neither " " nor
   ":", where the next part must start); after the first comes " " (the second run) or ":". */
static Py_ssize_t argparse_end(const unsigned char *t, Py_ssize_t n) {
    Py_ssize_t e = name_run(t, 0, n);
    if (e < 1 || e > 128)
        return -1;
    if (e < n && t[e] == ' ') {
        Py_ssize_t j = name_run(t, e + 1, n);
        if (j - (e + 1) < 1 || j - (e + 1) > 128)
            return -1;
        e = j;
    }
    return n - e >= 9 && memcmp(t + e, ": error: ", 9) == 0 ? e + 2 : -1;
}

/* logline.error_text(t[0:n], own): 1 and where the text starts, and whether a rule must
   match at its start (*at_start); 0: none (`own` is known here: never None). */
static int error_text_at(const unsigned char *t, Py_ssize_t n, int own, Py_ssize_t *at,
                         int *at_start) {
    Py_ssize_t c = collector_end(t, n);
    const unsigned char *l = t + c;
    Py_ssize_t ln = n - c, rec = record_end(l, ln), rest = rec >= 0 ? rec : 0;
    Py_ssize_t level = level_end(l + rest, ln - rest);
    *at_start = 0;
    if (level >= 0) {
        *at = c + rest + level;
        return 1;
    }
    if (rec >= 0) {
        *at = c + rest;
        *at_start = 1;
        return 1;
    }
    if (own) {
        *at = c;
        return 1;
    }
    Py_ssize_t arg = argparse_end(l, ln);
    if (arg < 0)
        return 0;
    *at = c + arg;
    return 1;
}

static int fatal_at(const unsigned char *t, Py_ssize_t n, Py_ssize_t r, const Quick *q) {
    for (Py_ssize_t k = 0; k < q->n_fatal; k++)
        if (lit_at(t, n, r, &q->fatal[k]))
            return 1;
    return 0;
}

/* Whether a fatal literal starts at a place of t[0:n] outside quotes (rules.QUOTE_LEAD). */
static int fatal_outside(const unsigned char *t, Py_ssize_t n, const Quick *q) {
    Py_ssize_t i = 0;
    while (i < n) {
        if (fatal_at(t, n, i, q))
            return 1;
        unsigned char c = t[i];
        if (c == '\\') {
            i += 2; /* past the end: no place left (a lone last backslash ends the lead) */
            continue;
        }
        if (c != '\'' && c != '"') {
            i++;
            continue;
        }
        Py_ssize_t j = i + 1;
        while (j < n && t[j] != c)
            j += t[j] == '\\' ? 2 : 1;
        if (j >= n)
            return 0; /* the quote does not close: the lead cannot pass it */
        i = j + 1;
    }
    return 0;
}

static int may_keep(const unsigned char *t, Py_ssize_t n, int own, const Quick *q) {
    for (Py_ssize_t k = 0; k < q->n_present; k++)
        if (q->present[k].len <= n && memmem(t, (size_t)n, q->present[k].bytes,
                                             (size_t)q->present[k].len) != NULL)
            return 1;
    Py_ssize_t at;
    int at_start;
    if (!error_text_at(t, n, own, &at, &at_start))
        return 0;
    return at_start ? fatal_at(t + at, n - at, 0, q) : fatal_outside(t + at, n - at, q);
}

/* `quick` (None, or (fatal, present): two sequences of at most MAX_QUICK non-empty bytes) into
   *q, its buffers into held[] (*held_n of them, to release); 0: an error is set. */
static int quick_args(PyObject *quick, Quick *q, Py_buffer *held, Py_ssize_t *held_n) {
    *held_n = 0;
    q->n_fatal = q->n_present = 0;
    if (quick == NULL || quick == Py_None)
        return 1;
    if (!PyTuple_Check(quick) || PyTuple_Size(quick) != 2) {
        PyErr_SetString(PyExc_TypeError, "read_walk: quick must be None or (fatal, present)");
        return 0;
    }
    for (int part = 0; part < 2; part++) {
        Py_ssize_t first = *held_n, count;
        if (!take_literals(PyTuple_GetItem(quick, part), MAX_QUICK, 0,
                           "read_walk's quick literals", held, held_n, &count))
            return 0;
        Lit *lits = part == 0 ? q->fatal : q->present;
        for (Py_ssize_t k = 0; k < count; k++)
            lits[k] = (Lit){held[first + k].buf, held[first + k].len};
        *(part == 0 ? &q->n_fatal : &q->n_present) = count;
    }
    return 1;
}

/* ---- read_walk: the reader's walk that also steps the lines it checks ----------------------

   read_walk(state, block, start, end, cap, reads, checks[, quick])
       -> (state, [(start, stop, text), ...], [(line, n, before, after, own, text), ...]) | None

   `advance` with `reads`, where the lines ending just before each offset of `checks` (ascending,
   none also in `reads`) are stepped too, and each is answered as (its start, the length of its
   text: its head less the trailing CRs, the states before and after it, whether `step` calls
   it SGLang's own output, and None): rules/linereader.py then needs no Python to step a
   checked line, only to ask its `keep`. A checked line whose head is ASCII with an ESC or a
   NUL (a colored record) is cleaned here (`clean_ascii`) and stepped on its cleaned text,
   which comes as the last item (a str), unless it is the exception line that ends a
   traceback. A checked line whose head is not ASCII, or is such an exception line, is not
   stepped: the walk ends at its start, and the answer holds the steps before it (fewer than
   `checks`) with the state there; the reader reads that line in Python and calls again past
   it. None as `advance`: a line the walk or a read must step is not plain ASCII (the caller
   walks in Python). tracebacks._read_walk is the definition.

   `quick` (fatal, present): a checked plain line the quick no above turns away is answered
   with n = -1 (its `keep` would not take it; the reader asks nothing of it). A cleaned line
   never is: the scan's rules for it are not known (linereader.Hits.dirty). */

typedef struct {
    Py_ssize_t line, n;
    int before, after, own;
    unsigned char *text; /* a cleaned line's text (malloc'd), or NULL: block[line:line + n] */
} Step;

/* Whether t[0:n] is ASCII (no byte >= 0x80), 8 bytes at a time. */
static int ascii_only(const unsigned char *t, Py_ssize_t n) {
    Py_ssize_t k = 0;
    for (; k + 8 <= n; k += 8) {
        uint64_t x;
        memcpy(&x, t + k, 8);
        if (x & 0x8080808080808080ULL)
            return 0;
    }
    for (; k < n; k++)
        if (t[k] >= 0x80)
            return 0;
    return 1;
}

/* rules/logline.clean of an ASCII head t[0:n] into out (room for n bytes), its length: each
   ECMA-48 sequence of logline._ANSI dropped as its alternatives take it, in their order (CSI:
   ESC [ params 0x30-0x3F, intermediates 0x20-0x2F, a final 0x40-0x7E; OSC: ESC ] up to a BEL
   or an ESC, then a BEL or ESC \ if there; else ESC, intermediates, a final 0x30-0x7E), a
   lone ESC dropped, the NULs left dropped, then the trailing CRs. Each class is disjoint from
   the next one's, so the regex's greedy match is this one pass's. */
static Py_ssize_t clean_ascii(const unsigned char *t, Py_ssize_t n, unsigned char *out) {
    Py_ssize_t i = 0, m = 0;
    while (i < n) {
        unsigned char c = t[i];
        if (c != 0x1b) {
            if (c != 0)
                out[m++] = c;
            i++;
            continue;
        }
        Py_ssize_t k = i + 1;
        if (k < n && t[k] == '[') { /* CSI */
            Py_ssize_t j = k + 1;
            while (j < n && t[j] >= 0x30 && t[j] <= 0x3f)
                j++;
            while (j < n && t[j] >= 0x20 && t[j] <= 0x2f)
                j++;
            if (j < n && t[j] >= 0x40 && t[j] <= 0x7e) {
                i = j + 1;
                continue;
            }
        } else if (k < n && t[k] == ']') { /* OSC: always taken */
            Py_ssize_t j = k + 1;
            while (j < n && t[j] != 0x07 && t[j] != 0x1b)
                j++;
            if (j < n && t[j] == 0x07)
                j++;
            else if (j + 1 < n && t[j] == 0x1b && t[j + 1] == '\\')
                j += 2;
            i = j;
            continue;
        }
        while (k < n && t[k] >= 0x20 && t[k] <= 0x2f) /* nF and two-byte forms */
            k++;
        i = k < n && t[k] >= 0x30 && t[k] <= 0x7e ? k + 1 : i + 1; /* else a lone ESC */
    }
    while (m > 0 && out[m - 1] == '\r')
        m--;
    return m;
}

/* The checked line at `line` (its newline just before `stop`) that is not plain (step_line's
   ABORT): where its head is ASCII, cleaned (clean_ascii) and stepped from `state` into *out;
   the state after it. ABORT: the head is not ASCII, or the line is the exception line that
   ends a traceback (the reader reads both itself); NO_MEMORY. */
static int cleaned_step(int state, const unsigned char *block, Py_ssize_t line, Py_ssize_t stop,
                        Py_ssize_t cap, Step *out) {
    const unsigned char *t = block + line;
    Py_ssize_t len = stop - 1 - line, head = len < cap ? len : cap;
    if (!ascii_only(t, head))
        return ABORT;
    unsigned char *text = malloc(head > 0 ? (size_t)head : 1);
    if (text == NULL)
        return NO_MEMORY;
    Py_ssize_t n = clean_ascii(t, head, text);
    int own, after = step_own(state, text, n, &own);
    if (state == S_TRACEBACK && after == S_MESSAGE) {
        free(text);
        return ABORT;
    }
    *out = (Step){line, n, state, after, own, text};
    return after;
}

static PyObject *read_walk(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t start, end, cap;
    int state;
    PyObject *reads_arg, *checks_arg, *quick_arg = NULL;
    if (!PyArg_ParseTuple(args, "iy*nnnOO|O:read_walk", &state, &view, &start, &end, &cap,
                          &reads_arg, &checks_arg, &quick_arg))
        return NULL;
    if (!span_ok("read_walk", state, &view, start, end, cap))
        return NULL;
    const unsigned char *block = (const unsigned char *)view.buf;
    Py_ssize_t *reads = NULL, *checks = NULL, n_reads, n_checks, n_held = 0;
    Step *steps = NULL;
    Quick quick;
    Py_buffer held[2 * MAX_QUICK];
    int quick_ok = quick_args(quick_arg, &quick, held, &n_held);
    if (!quick_ok || !read_stops(reads_arg, block, start, end, &reads, &n_reads)
        || !read_stops(checks_arg, block, start, end, &checks, &n_checks)) {
        free(reads);
        for (Py_ssize_t k = 0; k < n_held; k++)
            PyBuffer_Release(&held[k]);
        PyBuffer_Release(&view);
        return NULL;
    }
    int asks = quick_arg != NULL && quick_arg != Py_None;
    if (n_checks && (steps = malloc((size_t)n_checks * sizeof *steps)) == NULL) {
        free(reads);
        free(checks);
        for (Py_ssize_t k = 0; k < n_held; k++)
            PyBuffer_Release(&held[k]);
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    Pairs found = {NULL, 0, 0};
    Py_ssize_t done = 0, r = 0, pos = start;
    int after = state, twice = 0;
    PyThreadState *saved = end - start >= RELEASE_GIL_AT ? PyEval_SaveThread() : NULL;
    while (after >= 0 && (r < n_reads || done < n_checks)) {
        int check = r == n_reads || (done < n_checks && checks[done] <= reads[r]);
        Py_ssize_t stop = check ? checks[done] : reads[r], newline, n;
        if (check && r < n_reads && checks[done] == reads[r]) {
            twice = 1;
            break;
        }
        const unsigned char *nl = memrchr(block + pos, '\n', (size_t)(stop - 1 - pos));
        Py_ssize_t line = nl == NULL ? pos : nl - block + 1;
        after = walk(after, block, pos, line, cap, &found);
        if (after < 0)
            break;
        pos = line;
        int before = after, own;
        after = step_line(after, block, line, stop, cap, &newline, &n, &own, &found);
        if (check && after == ABORT) {
            after = cleaned_step(before, block, line, stop, cap, &steps[done]);
            if (after == NO_MEMORY)
                break;
            if (after == ABORT) {
                after = before; /* read in Python: the walk ends at its start */
                break;
            }
            done++;
            pos = stop;
            continue;
        }
        if (check && after >= 0)
            steps[done++] = (Step){line, asks && !may_keep(block + line, n, own, &quick) ? -1 : n,
                                   before, after, own, NULL};
        else if (!check)
            r++;
        pos = stop;
    }
    if (after >= 0 && !twice && r == n_reads && done == n_checks)
        after = walk(after, block, pos, end, cap, &found);
    if (saved != NULL)
        PyEval_RestoreThread(saved);
    free(reads);
    free(checks);
    PyObject *result = NULL, *list = NULL, *stepped = NULL;
    if (twice)
        PyErr_SetString(PyExc_ValueError, "read_walk: an offset both in reads and in checks");
    else if (after == NO_MEMORY)
        PyErr_NoMemory();
    else if (after == ABORT)
        result = Py_NewRef(Py_None);
    else if ((list = found_list(block, end, cap, &found)) != NULL
             && (stepped = PyList_New(done)) != NULL) {
        for (Py_ssize_t k = 0; k < done; k++) {
            PyObject *text = steps[k].text == NULL ? Py_NewRef(Py_None)
                : PyUnicode_DecodeASCII((const char *)steps[k].text, steps[k].n, NULL);
            PyObject *item = text == NULL ? NULL
                : Py_BuildValue("(nniiON)", steps[k].line, steps[k].n, steps[k].before,
                                steps[k].after, steps[k].own ? Py_True : Py_False, text);
            if (item == NULL) {
                Py_CLEAR(stepped);
                break;
            }
            PyList_SetItem(stepped, k, item);
        }
        if (stepped != NULL)
            result = Py_BuildValue("(iNN)", after, list, stepped);
        else
            Py_DECREF(list);
    } else {
        Py_XDECREF(list);
    }
    for (Py_ssize_t k = 0; k < done; k++)
        free(steps[k].text);
    free(steps);
    free(found.pairs);
    for (Py_ssize_t k = 0; k < n_held; k++)
        PyBuffer_Release(&held[k]);
    PyBuffer_Release(&view);
    return result;
}

/* quotes_closed(line: str) -> bool: rules/logline.quotes_closed. A str with a lone surrogate
   has no UTF-8: the caller reads it in Python (UnicodeEncodeError). */
static PyObject *quotes_closed(PyObject *self, PyObject *arg) {
    (void)self;
    Py_ssize_t size;
    const char *text = PyUnicode_AsUTF8AndSize(arg, &size);
    if (text == NULL)
        return NULL;
    const unsigned char *p = (const unsigned char *)text;
    return PyBool_FromLong(closed(p, p + size));
}

/* literal_lines(block, needles[, widest[, marks]]) -> [(needle index, line end)]: for each
   complete line of block (ending in a newline) and each needle (bytes, no newline) found in
   it, the offset just past that line's newline, each pair once, each needle's in block order;
   with marks, also (-1, line end) for each complete line with an ESC or a NUL byte (the lines
   the reader must clean to read: rules/linereader._dirty), in the same span without the GIL,
   where the reader's two bytes.find passes held it (~7 us a 256 KiB chunk just read).
   rules/blockscan.py's per-line set asks it where every pattern is a plain literal (the
   running phase of the default pack: three rules' literals and the traceback header) for
   what its Hyperscan database answers with `(?:literal)[^\n]*\n`: gathered here with the
   GIL released, where python-hyperscan calls back into Python (taking the GIL) per match.

   Each needle is looked for by two of its bytes, the rarest in log text (`rarity`), 64
   starts at a time (AVX-512BW) or 32 (AVX2), where the CPU has them, or 16 (SSE2, every
   x86-64), the agreements of all needles OR'd into one test; every candidate is then
   compared whole. On a chunk just read (in cache), the default running set over the bench's
   mixes: ~0.045 CPU s per million lines on AVX2, ~0.030 on AVX-512BW (Intel Xeon VM). */

#define MAX_NEEDLES 16

typedef struct {
    const unsigned char *bytes;
    Py_ssize_t len;
    Py_ssize_t at1, at2; /* the two anchor positions in the needle, at1 <= at2 */
    Py_ssize_t last_end; /* the line end last recorded for it */
} Needle;

/* How common a byte is in log text, higher more common: lower-case letters by English
   frequency, the space, digits and the punctuation of records and paths. A guess only picks
   the anchors: every candidate is compared whole, so it moves the speed, never an answer. */
static int rarity_of(unsigned char c) {
    static const char order[] = "etaoinsrhldcumfpgwybvkxjqz"; /* most to least common */
    const char *hit;
    if (c == ' ')
        return 100;
    if (c >= 'a' && c <= 'z' && (hit = strchr(order, c)) != NULL)
        return 90 - (int)(hit - order) * 3;
    if (c >= '0' && c <= '9')
        return 60;
    if (c == ':' || c == '-' || c == '.' || c == '/' || c == '_' || c == ',' || c == '='
        || c == '[' || c == ']' || c == '"' || c == '\'')
        return 40;
    if (c >= 'A' && c <= 'Z')
        return 20;
    return 10;
}

/* rarity_of per byte, filled once (init_tables): the anchors are chosen per call, with the
   GIL held. */
static unsigned char RARITY[256];
static int rarity(unsigned char c) { return RARITY[c]; }

static void init_rarity(void) {
    for (int c = 0; c < 256; c++)
        RARITY[c] = (unsigned char)rarity_of((unsigned char)c);
}

static void choose_anchors(Needle *n) {
    Py_ssize_t best = 0;
    for (Py_ssize_t i = 1; i < n->len; i++)
        if (rarity(n->bytes[i]) < rarity(n->bytes[best]))
            best = i;
    Py_ssize_t second = best == 0 ? (n->len > 1 ? 1 : 0) : 0;
    for (Py_ssize_t i = 0; i < n->len; i++) {
        if (i == best)
            continue;
        /* a different byte if there is one, then the rarer; on a tie the first */
        int d_i = n->bytes[i] != n->bytes[best], d_s = n->bytes[second] != n->bytes[best];
        if (second == best || d_i > d_s
            || (d_i == d_s && rarity(n->bytes[i]) < rarity(n->bytes[second])))
            second = i;
    }
    n->at1 = best < second ? best : second;
    n->at2 = best < second ? second : best;
}

/* A match of needle k at s: record its line's end, once per line (none where no newline
   follows: the match is in the unfinished last line). -1: no memory. */
static int found_at(const unsigned char *block, Py_ssize_t len, Needle *needles, Py_ssize_t k,
                    Py_ssize_t s, Pairs *out) {
    Needle *n = &needles[k];
    if (s < n->last_end)
        return 1; /* on a line already recorded for it */
    const unsigned char *nl = memchr(block + s + n->len, '\n', (size_t)(len - s - n->len));
    if (nl == NULL)
        return 0;
    Py_ssize_t end = nl - block + 1;
    n->last_end = end;
    return pairs_add(out, k, end) ? 1 : -1;
}

static int is_match(const unsigned char *block, Py_ssize_t len, const Needle *n, Py_ssize_t s) {
    return s + n->len <= len && memcmp(block + s, n->bytes, (size_t)n->len) == 0;
}

/* The matches of needle k among the 16 (or 32) starts at s whose anchors both agree. */
static int confirm(const unsigned char *block, Py_ssize_t len, Needle *needles, Py_ssize_t k,
                   Py_ssize_t s, unsigned mask, Pairs *out) {
    while (mask) {
        Py_ssize_t at = s + __builtin_ctz(mask);
        mask &= mask - 1;
        if (is_match(block, len, &needles[k], at) && found_at(block, len, needles, k, at, out) < 0)
            return -1;
    }
    return 0;
}

/* From s on, one start at a time (the tail, and where no vector loop is built). */
static int find_tail(const unsigned char *block, Py_ssize_t len, Needle *needles,
                     Py_ssize_t count, Py_ssize_t s, Pairs *out) {
    for (; s < len; s++)
        for (Py_ssize_t k = 0; k < count; k++) {
            const Needle *n = &needles[k];
            if (s + n->len <= len && block[s + n->at1] == n->bytes[n->at1]
                && block[s + n->at2] == n->bytes[n->at2] && is_match(block, len, n, s)
                && found_at(block, len, needles, k, s, out) < 0)
                return -1;
        }
    return 0;
}

/* Each needle's anchors (where, and which byte) as the vector loops read them; the farthest
   anchor of any needle (a loop's start s reads up to s + reach + its width). */
typedef struct {
    Py_ssize_t at1[MAX_NEEDLES], at2[MAX_NEEDLES];
    char byte1[MAX_NEEDLES], byte2[MAX_NEEDLES];
    Py_ssize_t reach;
} Anchors;

static void anchors_of(const Needle *needles, Py_ssize_t count, Anchors *an) {
    an->reach = 0;
    for (Py_ssize_t k = 0; k < count; k++) {
        an->at1[k] = needles[k].at1;
        an->at2[k] = needles[k].at2;
        an->byte1[k] = (char)needles[k].bytes[needles[k].at1];
        an->byte2[k] = (char)needles[k].bytes[needles[k].at2];
        if (needles[k].at2 > an->reach)
            an->reach = needles[k].at2;
    }
}

#if defined(HAVE_AVX2_PATH)
/* 32 starts at a time: each needle's two anchors compared, the agreements of all needles
   OR'd into one mask, and only a start some needle agrees at is looked at again. */
__attribute__((target("avx2"))) static int find_avx2(const unsigned char *block, Py_ssize_t len,
                                                      Needle *needles, Py_ssize_t count,
                                                      Pairs *out) {
    Anchors an;
    anchors_of(needles, count, &an);
    const Py_ssize_t *at1 = an.at1, *at2 = an.at2;
    __m256i first[MAX_NEEDLES], second[MAX_NEEDLES];
    for (Py_ssize_t k = 0; k < count; k++) {
        first[k] = _mm256_set1_epi8(an.byte1[k]);
        second[k] = _mm256_set1_epi8(an.byte2[k]);
    }
    Py_ssize_t s = 0;
    for (; s + an.reach + 32 <= len; s += 32) {
        __m256i any = _mm256_setzero_si256();
        for (Py_ssize_t k = 0; k < count; k++) {
            __m256i a = _mm256_loadu_si256((const __m256i *)(block + s + at1[k]));
            __m256i b = _mm256_loadu_si256((const __m256i *)(block + s + at2[k]));
            any = _mm256_or_si256(any, _mm256_and_si256(_mm256_cmpeq_epi8(a, first[k]),
                                                        _mm256_cmpeq_epi8(b, second[k])));
        }
        if (_mm256_testz_si256(any, any))
            continue;
        for (Py_ssize_t k = 0; k < count; k++) {
            __m256i a = _mm256_loadu_si256((const __m256i *)(block + s + at1[k]));
            __m256i b = _mm256_loadu_si256((const __m256i *)(block + s + at2[k]));
            unsigned mask = (unsigned)_mm256_movemask_epi8(_mm256_and_si256(
                _mm256_cmpeq_epi8(a, first[k]), _mm256_cmpeq_epi8(b, second[k])));
            if (mask && confirm(block, len, needles, k, s, mask, out) < 0)
                return -1;
        }
    }
    return find_tail(block, len, needles, count, s, out);
}

/* The same, 64 starts at a time (AVX-512BW): each needle's two anchors compared into masks,
   the agreements of all needles OR'd, and only a start some needle agrees at looked at again
   (the 64 bits split in two for `confirm`). */
__attribute__((target("avx512f,avx512bw"))) static int find_avx512(
    const unsigned char *block, Py_ssize_t len, Needle *needles, Py_ssize_t count, Pairs *out) {
    Anchors an;
    anchors_of(needles, count, &an);
    const Py_ssize_t *at1 = an.at1, *at2 = an.at2;
    __m512i first[MAX_NEEDLES], second[MAX_NEEDLES];
    for (Py_ssize_t k = 0; k < count; k++) {
        first[k] = _mm512_set1_epi8(an.byte1[k]);
        second[k] = _mm512_set1_epi8(an.byte2[k]);
    }
    Py_ssize_t s = 0;
    for (; s + an.reach + 64 <= len; s += 64) {
        __mmask64 agree[MAX_NEEDLES], any = 0;
        for (Py_ssize_t k = 0; k < count; k++) {
            __m512i a = _mm512_loadu_si512((const void *)(block + s + at1[k]));
            __m512i b = _mm512_loadu_si512((const void *)(block + s + at2[k]));
            agree[k] = _mm512_cmpeq_epi8_mask(a, first[k]) & _mm512_cmpeq_epi8_mask(b, second[k]);
            any |= agree[k];
        }
        if (!any)
            continue;
        for (Py_ssize_t k = 0; k < count; k++) {
            unsigned low = (unsigned)agree[k], high = (unsigned)(agree[k] >> 32);
            if ((low && confirm(block, len, needles, k, s, low, out) < 0)
                || (high && confirm(block, len, needles, k, s + 32, high, out) < 0))
                return -1;
        }
    }
    return find_tail(block, len, needles, count, s, out);
}
#endif

/* Every match of every needle in block[0:len]: 0 done, -1 no memory. A needle's matches come
   in order of their start (found_at relies on it); different needles' need not. `widest`:
   the widest loop it may take (3 AVX-512BW, 2 AVX2, where the CPU has them, 1 SSE2, 0 none:
   tests hold them equal). */
static int find_literals(const unsigned char *block, Py_ssize_t len, Needle *needles,
                         Py_ssize_t count, int widest, Pairs *out) {
#if defined(HAVE_AVX2_PATH)
    if (widest >= 3 && __builtin_cpu_supports("avx512bw"))
        return find_avx512(block, len, needles, count, out);
    if (widest >= 2 && __builtin_cpu_supports("avx2"))
        return find_avx2(block, len, needles, count, out);
#endif
    Py_ssize_t s = 0;
#if defined(__SSE2__)
    if (widest < 1)
        return find_tail(block, len, needles, count, s, out);
    Anchors an;
    anchors_of(needles, count, &an);
    const Py_ssize_t *at1 = an.at1, *at2 = an.at2;
    __m128i first[MAX_NEEDLES], second[MAX_NEEDLES];
    for (Py_ssize_t k = 0; k < count; k++) {
        first[k] = _mm_set1_epi8(an.byte1[k]);
        second[k] = _mm_set1_epi8(an.byte2[k]);
    }
    for (; s + an.reach + 16 <= len; s += 16) {
        __m128i any = _mm_setzero_si128();
        for (Py_ssize_t k = 0; k < count; k++) {
            __m128i a = _mm_loadu_si128((const __m128i *)(block + s + at1[k]));
            __m128i b = _mm_loadu_si128((const __m128i *)(block + s + at2[k]));
            any = _mm_or_si128(any, _mm_and_si128(_mm_cmpeq_epi8(a, first[k]),
                                                  _mm_cmpeq_epi8(b, second[k])));
        }
        if (!_mm_movemask_epi8(any))
            continue;
        for (Py_ssize_t k = 0; k < count; k++) {
            __m128i a = _mm_loadu_si128((const __m128i *)(block + s + at1[k]));
            __m128i b = _mm_loadu_si128((const __m128i *)(block + s + at2[k]));
            unsigned mask = (unsigned)_mm_movemask_epi8(
                _mm_and_si128(_mm_cmpeq_epi8(a, first[k]), _mm_cmpeq_epi8(b, second[k])));
            if (mask && confirm(block, len, needles, k, s, mask, out) < 0)
                return -1;
        }
    }
#endif
    return find_tail(block, len, needles, count, s, out);
}

/* The lines of block[0:len] with an ESC or a NUL byte, each as (-1, its end) in `out` (a
   line with both twice; none for the unfinished last line): rules/linereader._dirty's
   answer, found with memchr in the same span without the GIL. -1: no memory. */
static int find_marks(const unsigned char *block, Py_ssize_t len, Pairs *out) {
    static const int marks[] = {0x1b, 0x00};
    for (size_t m = 0; m < sizeof marks / sizeof marks[0]; m++) {
        const unsigned char *at = memchr(block, marks[m], (size_t)len);
        while (at != NULL) {
            const unsigned char *nl = memchr(at, '\n', (size_t)(block + len - at));
            if (nl == NULL)
                break;
            if (!pairs_add(out, -1, nl - block + 1))
                return -1;
            at = memchr(nl + 1, marks[m], (size_t)(block + len - (nl + 1)));
        }
    }
    return 0;
}

/* The needles of a literal_lines-style call (a sequence of non-empty bytes-likes without a
   newline) as Needles with their anchors, their buffers in `held`; 0: an error is set. */
static int take_needles(PyObject *seq, const char *what, Needle *needles, Py_buffer *held,
                        Py_ssize_t *taken, Py_ssize_t *count) {
    if (!take_literals(seq, MAX_NEEDLES, 1, what, held, taken, count))
        return 0;
    for (Py_ssize_t k = 0; k < *count; k++) {
        needles[k] = (Needle){held[k].buf, held[k].len, 0, 0, 0};
        choose_anchors(&needles[k]);
    }
    return 1;
}

/* The search of literal_lines over block[0:len], without the GIL: 0 done, -1 no memory. */
static int scan_block(const unsigned char *block, Py_ssize_t len, Needle *needles,
                      Py_ssize_t count, int widest, int marks, Pairs *out) {
    int status = find_literals(block, len, needles, count, widest, out);
    if (status == 0 && marks)
        status = find_marks(block, len, out);
    return status;
}

/* The pairs as a list of (needle, end) tuples; NULL: an error is set. */
static PyObject *pairs_list(const Pairs *out) {
    PyObject *result = PyList_New(out->n / 2);
    if (result == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < out->n; i += 2) {
        PyObject *pair = Py_BuildValue("(nn)", out->pairs[i], out->pairs[i + 1]);
        if (pair == NULL) {
            Py_DECREF(result);
            return NULL;
        }
        PyList_SetItem(result, i / 2, pair);
    }
    return result;
}

static PyObject *literal_lines(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    PyObject *seq;
    int widest = 3, marks = 0;
    if (!PyArg_ParseTuple(args, "y*O|ip:literal_lines", &view, &seq, &widest, &marks))
        return NULL;
    Needle needles[MAX_NEEDLES];
    Py_buffer held[MAX_NEEDLES];
    Py_ssize_t count, taken = 0;
    PyObject *result = NULL;
    Pairs out = {NULL, 0, 0};
    if (!take_needles(seq, "literal_lines' needles", needles, held, &taken, &count))
        goto done;
    PyThreadState *saved = view.len >= RELEASE_GIL_AT ? PyEval_SaveThread() : NULL;
    int status = scan_block(view.buf, view.len, needles, count, widest, marks, &out);
    if (saved != NULL)
        PyEval_RestoreThread(saved);
    if (status < 0) {
        PyErr_NoMemory();
        goto done;
    }
    result = pairs_list(&out);
done:
    for (Py_ssize_t k = 0; k < taken; k++)
        PyBuffer_Release(&held[k]);
    free(out.pairs);
    PyBuffer_Release(&view);
    return result;
}

#include <errno.h>
#include <unistd.h>

/* read_scan(fd, size, needles[, widest[, marks]]) -> (chunk, pairs | None): os.read(fd, size)
   and, where the chunk holds a newline, literal_lines(chunk, needles, widest, marks), with
   the GIL let go once over both. The pumps' reader (supervise/shell/child.py) otherwise takes
   the GIL back after the read only to let it go again for the scan: on a 16-core host the
   reader is the pipe's bound and waits for the GIL behind the threads that read lines and
   write. pairs is None where nothing was scanned (no newline, or EOF: chunk is b""). EINTR
   is retried after the signal handlers ran (as os.read does, PEP 475); any other error
   raises OSError. The chunk is read into a bytes object of `size` bytes, shrunk in place
   where the read came back shorter (_PyBytes_Resize: realloc splits the block, no copy).
   Copied into a new object of its size, a shorter read cost ~296 us of CPU against ~125
   (median per read, 2 cores, near-miss mix; the reads' CPU per million lines 75.8 -> 69.4
   ms, log mix 81.5 -> 74.3: bench/README.md, "The reader's shorter reads"). Sizing the
   object by FIONREAD first saved as much on 2 cores, but its ioctl takes the pipe's lock a
   second time per read: on a 16-core host, beside a writer that copies into the pipe at
   once, the log mix read 5-6% slower. */

/* Not in the limited API, but documented (the C API's "Bytes Objects") and exported by every
   CPython 3; where it is not, the module does not load and the reader reads with os.read. */
PyAPI_FUNC(int) _PyBytes_Resize(PyObject **, Py_ssize_t);

static PyObject *read_scan(PyObject *self, PyObject *args) {
    (void)self;
    int fd, widest = 3, marks = 0;
    Py_ssize_t size;
    PyObject *seq;
    if (!PyArg_ParseTuple(args, "inO|ip:read_scan", &fd, &size, &seq, &widest, &marks))
        return NULL;
    if (size < 1) {
        PyErr_SetString(PyExc_ValueError, "read_scan: size must be >= 1");
        return NULL;
    }
    Needle needles[MAX_NEEDLES];
    Py_buffer held[MAX_NEEDLES];
    Py_ssize_t count, taken = 0;
    PyObject *buf = NULL, *chunk = NULL, *pairs = NULL, *result = NULL;
    Pairs out = {NULL, 0, 0};
    if (!take_needles(seq, "read_scan's needles", needles, held, &taken, &count))
        goto done;
    if ((buf = PyBytes_FromStringAndSize(NULL, size)) == NULL)
        goto done;
    unsigned char *data = (unsigned char *)PyBytes_AsString(buf);
    ssize_t n;
    int error, status = 0, scanned = 0;
    for (;;) {
        Py_BEGIN_ALLOW_THREADS
        n = read(fd, data, (size_t)size);
        error = n < 0 ? errno : 0;
        if (n > 0 && memrchr(data, '\n', (size_t)n) != NULL) {
            scanned = 1;
            status = scan_block(data, n, needles, count, widest, marks, &out);
        }
        Py_END_ALLOW_THREADS
        if (n >= 0 || error != EINTR)
            break;
        if (PyErr_CheckSignals() < 0)
            goto done;
    }
    if (n < 0) {
        errno = error;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    if (status < 0) {
        PyErr_NoMemory();
        goto done;
    }
    chunk = buf; /* its only reference: resized in place, or freed (NULL) where that fails */
    buf = NULL;
    if (n < size && _PyBytes_Resize(&chunk, n) < 0)
        goto done;
    if (!scanned)
        pairs = Py_NewRef(Py_None);
    else if ((pairs = pairs_list(&out)) == NULL)
        goto done;
    result = PyTuple_Pack(2, chunk, pairs);
done:
    for (Py_ssize_t k = 0; k < taken; k++)
        PyBuffer_Release(&held[k]);
    free(out.pairs);
    Py_XDECREF(buf);
    Py_XDECREF(chunk);
    Py_XDECREF(pairs);
    return result;
}

/* write_pieces(fd, data, piece) -> int: write data to fd, at most `piece` bytes per write(2),
   with the GIL released over all of them: the pumps' writer (supervise/shell/child.py) would
   otherwise take the GIL back after each piece, and waits for it behind the threads that
   read lines. Retries EINTR and a short write; stops at EAGAIN (a non-blocking fd that is
   full), answering how many bytes went out; any other error raises OSError with what had
   gone out lost to the caller (as a failed write loses it). */

static PyObject *write_pieces(PyObject *self, PyObject *args) {
    (void)self;
    int fd;
    Py_buffer view;
    Py_ssize_t piece;
    if (!PyArg_ParseTuple(args, "iy*n:write_pieces", &fd, &view, &piece))
        return NULL;
    if (piece < 1) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "write_pieces: piece must be >= 1");
        return NULL;
    }
    const char *at = view.buf;
    Py_ssize_t left = view.len, done = 0;
    int error = 0;
    Py_BEGIN_ALLOW_THREADS
    while (left > 0) {
        ssize_t n = write(fd, at + done, (size_t)(left < piece ? left : piece));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                error = errno;
            break;
        }
        done += n;
        left -= n;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (error) {
        errno = error;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromSsize_t(done);
}

static PyMethodDef methods[] = {
    {"write_pieces", write_pieces, METH_VARARGS,
     "write_pieces(fd, data, piece) -> int: data written to fd, piece bytes per write, the GIL "
     "released over all of them; stops at EAGAIN, raises OSError on any other error."},
    {"literal_lines", literal_lines, METH_VARARGS,
     "literal_lines(block, needles[, widest[, marks]]) -> [(needle, end)]: each complete line "
     "of block that holds a needle, by the offset just past its newline, once per needle, each "
     "in block order (widest: 3 AVX-512BW, 2 AVX2, where the CPU has them, 1 SSE2, 0 byte by "
     "byte); with marks, also (-1, end) for each line with an ESC or a NUL byte."},
    {"read_scan", read_scan, METH_VARARGS,
     "read_scan(fd, size, needles[, widest[, marks]]) -> (chunk, pairs | None): os.read(fd, size) "
     "and, where the chunk holds a newline, literal_lines(chunk, needles, widest, marks), the GIL "
     "released once over both."},
    {"quotes_closed", quotes_closed, METH_O,
     "quotes_closed(line) -> bool: every quote the line opens closes on it (logline.CLOSED)."},
    {"advance", advance, METH_VARARGS,
     "advance(state, block, start, end, cap[, reads]) -> (state, [(start, stop, text)]) | None: "
     "rules/tracebacks.advance over block[start:end], reading the lines that end just before "
     "each of reads, or None where a line needs Python."},
    {"read_walk", read_walk, METH_VARARGS,
     "read_walk(state, block, start, end, cap, reads, checks[, quick]) -> (state, [(start, stop, "
     "text)], [(line, n, before, after, own)]) | None: advance that also steps the checked lines, "
     "up to the first whose head is not plain ASCII (n = -1: quick's no)."},
    {"first_line", first_line, METH_VARARGS,
     "first_line(block, start, end, kind, cap[, widest]) -> int: the first line of "
     "block[start:end] that kind (0 frames, 1 message, 2 blank) takes, or -1 (widest: 3 "
     "AVX-512BW, 2 AVX2, where the CPU has them, less: memchr line by line)."},
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
