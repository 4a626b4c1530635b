/* out_file.h - output files that appear whole or not at all, shared by the
 * compiler and the runtime.
 *
 * An output is written to a new temporary file beside its target (same
 * directory, so the same file system) and renamed over the target only
 * once every byte is written and synced.  Until then the previous file at
 * the target, if any, is untouched: a full disk, a crash or a kill during
 * the write leaves it as it was (and at worst a temporary named
 * .NAME.tmp-XXXXXX beside it).
 *
 * The functions return 0 or an errno value; callers name the file and the
 * flag in their own error messages. */
#ifndef CLEAVE_OUT_FILE_H
#define CLEAVE_OUT_FILE_H

#include <stdbool.h>
#include <stdio.h>

typedef struct OutFile {
    char *target; /* the path given */
    char *tmp;    /* the temporary being written, NULL when none */
    FILE *f;      /* open on tmp between out_file_open and commit/abort */
} OutFile;

/* Creates the temporary (mode 0666 less the umask, as fopen would give
 * the target) and opens it for writing in binary mode. */
int out_file_open(OutFile *o, const char *target);

/* Flushes, syncs and closes the temporary, renames it over the target and
 * syncs the directory.  On failure the temporary is removed and the
 * target left as it was. */
int out_file_commit(OutFile *o);

/* Closes and removes the temporary; the target is left as it was.  Safe
 * to call on a committed, aborted or never opened OutFile. */
void out_file_abort(OutFile *o);

/* Syncs the directory holding path, so that a rename or creation in it
 * survives a crash. */
int out_file_sync_dir(const char *path);

/* Whether two paths name the same file: the same device and inode when
 * both exist, else the same canonical directory and last component.  An
 * output given as an input, or two outputs given the same path, is
 * refused with this. */
bool out_file_same(const char *a, const char *b);

#endif
