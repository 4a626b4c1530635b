/* arena.h - bump allocation for IR and per-pass scratch memory.
 *
 * Everything a graph owns lives in one arena and is released with it, so passes
 * never free individual nodes.  Allocation failure is reported through the
 * arena's sticky `failed` flag and a NULL return; callers turn that into a
 * diagnostic at the API boundary. */
#ifndef CLEAVE_ARENA_H
#define CLEAVE_ARENA_H

#include <stddef.h>
#include <stdbool.h>

typedef struct ArenaBlock ArenaBlock;

typedef struct Arena {
    ArenaBlock *head;
    size_t used_bytes;   /* bytes handed out, for statistics */
    bool failed;         /* set once any allocation failed */
} Arena;

void arena_init(Arena *a);
void arena_free(Arena *a);
/* Zeroed memory, 16-byte aligned; NULL (and a->failed) when out of memory or
 * when n*size overflows. */
void *arena_alloc(Arena *a, size_t n, size_t size);
char *arena_strdup(Arena *a, const char *s);
char *arena_strndup(Arena *a, const char *s, size_t len);
char *arena_printf(Arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Test hook: make the Nth allocation from now (1-based) fail; 0 disables. */
void arena_fail_after(long n);

#define ARENA_NEW(a, T) ((T *)arena_alloc((a), 1, sizeof(T)))
#define ARENA_ARRAY(a, T, n) ((T *)arena_alloc((a), (n), sizeof(T)))

#endif
