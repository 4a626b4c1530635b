/* text.c - see text.h. */
#include "text.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void text_put(Text *t, const char *fmt, ...) {
    if (t->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->s ? t->s + t->len : NULL, t->s ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = true;
            return;
        }
        if (t->s && (size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        /* too small (or nothing yet): grow to fit, then print again */
        size_t cap = t->cap ? t->cap : 1024;
        while (cap - t->len <= (size_t)n) cap *= 2;
        char *s = realloc(t->s, cap);
        if (!s) {
            t->failed = true;
            return;
        }
        t->s = s;
        t->cap = cap;
    }
}
