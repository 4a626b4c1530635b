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
 * A target that already exists and is a character device or a FIFO
 * (/dev/null, /dev/stdout, a shell's >(...)) is written in place: there is
 * nothing to keep, and renaming over a device would replace it.  A folder
 * or any other kind of file is refused.
 *
 * The functions return 0 or an errno value (EISDIR for a folder, EINVAL
 * for a target that is neither a regular file, a device nor a FIFO);
 * callers name the file and the flag in their own error messages, with
 * out_file_why. */
#ifndef CLEAVE_OUT_FILE_H
#define CLEAVE_OUT_FILE_H

#include <stdbool.h>
#include <stdio.h>

typedef struct OutFile {
    char *target; /* the path given */
    char *tmp;    /* the temporary being written, NULL when none */
    FILE *f;      /* open on tmp (or the target itself) until commit/abort */
    bool direct;  /* writing the target in place: a device or a FIFO */
    int err;      /* the first failed out_file_write's errno */
} OutFile;

/* Creates the temporary (mode 0666 less the umask, as fopen would give
 * the target) and opens it for writing in binary mode. */
int out_file_open(OutFile *o, const char *target);

/* As out_file_open, for a writer that takes a path (a linker, LLVM):
 * creates the temporary, closes it and leaves its name in o->tmp for the
 * writer to replace.  Refuses targets that are not regular files
 * (ENOTSUP for a device or FIFO). */
int out_file_reserve(OutFile *o, const char *target);

/* Flushes, syncs and closes the temporary, renames it over the target and
 * syncs the directory.  On failure the temporary is removed and the
 * target left as it was. */
int out_file_commit(OutFile *o);

/* Writes len bytes to o->f, keeping the errno of a first failure (a full
 * disk: ENOSPC) for out_file_finish to return. */
void out_file_write(OutFile *o, const void *data, size_t len);

/* For a file written through o->f: commits it, unless a write failed
 * (out_file_write's or the stream's error flag), in which case it aborts
 * and returns that error (EIO when the stream kept no errno). */
int out_file_finish(OutFile *o);

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

/* Whether path is a device or FIFO, which outputs write in place. */
bool out_file_in_place(const char *path);

/* The reason for an error of these functions, for a message. */
const char *out_file_why(int err);

#endif
