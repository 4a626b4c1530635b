/* text.h - a growing text buffer for output built piece by piece (plan
 * files, cluster files, signatures).  A failed allocation sets `failed`
 * once; later appends do nothing, and the owner checks it at the end. */
#ifndef CLEAVE_TEXT_H
#define CLEAVE_TEXT_H

#include <stdbool.h>
#include <stddef.h>

typedef struct Text {
    char *s; /* NUL-terminated once anything was appended; free() it */
    size_t len, cap;
    bool failed;
} Text;

void text_put(Text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
