#include "arena.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ArenaBlock {
    ArenaBlock *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

enum { ARENA_BLOCK_MIN = 64 * 1024 };

static long fail_countdown;

void arena_fail_after(long n) { fail_countdown = n; }

void arena_init(Arena *a) { memset(a, 0, sizeof *a); }

void arena_free(Arena *a) {
    ArenaBlock *b = a->head;
    while (b) {
        ArenaBlock *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL;
    a->used_bytes = 0;
}

static ArenaBlock *new_block(size_t need) {
    size_t size = need > ARENA_BLOCK_MIN ? need : ARENA_BLOCK_MIN;
    ArenaBlock *b = malloc(sizeof *b + size);
    if (!b) return NULL;
    b->size = size;
    b->used = 0;
    b->next = NULL;
    return b;
}

void *arena_alloc(Arena *a, size_t n, size_t size) {
    if (fail_countdown > 0 && --fail_countdown == 0) {
        a->failed = true;
        return NULL;
    }
    if (size && n > SIZE_MAX / size) {
        a->failed = true;
        return NULL;
    }
    size_t bytes = (n * size + 15) & ~(size_t)15;
    if (bytes == 0) bytes = 16;
    ArenaBlock *b = a->head;
    if (!b || b->size - b->used < bytes) {
        /* Large requests get a block of their own so the current block's
         * remaining space is not wasted. */
        ArenaBlock *nb = new_block(bytes);
        if (!nb) {
            a->failed = true;
            return NULL;
        }
        if (b && bytes > ARENA_BLOCK_MIN / 4) {
            nb->next = b->next;
            b->next = nb;
        } else {
            nb->next = b;
            a->head = nb;
        }
        b = nb;
    }
    void *p = b->data + b->used;
    b->used += bytes;
    a->used_bytes += bytes;
    memset(p, 0, bytes);
    return p;
}

char *arena_strndup(Arena *a, const char *s, size_t len) {
    char *d = arena_alloc(a, len + 1, 1);
    if (d) {
        if (len) memcpy(d, s, len); /* s may be NULL when len is 0 (empty protobuf bytes) */
        d[len] = 0;
    }
    return d;
}

char *arena_strdup(Arena *a, const char *s) {
    return s ? arena_strndup(a, s, strlen(s)) : NULL;
}

char *arena_printf(Arena *a, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return NULL;
    char *d = arena_alloc(a, (size_t)n + 1, 1);
    if (!d) return NULL;
    va_start(ap, fmt);
    vsnprintf(d, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return d;
}
