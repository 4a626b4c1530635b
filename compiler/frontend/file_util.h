/* file_util.h - whole-file reads and path checks shared by the front end. */
#ifndef CLEAVE_FILE_UTIL_H
#define CLEAVE_FILE_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../util/diag.h"

/* malloc'd contents of path (caller frees); NULL with a Diag on failure. */
uint8_t *file_read_all(const char *path, size_t *len, Diag *d);
/* Folder part of a path ("." when it has none), malloc'd. */
char *path_dirname(const char *path);

#endif
