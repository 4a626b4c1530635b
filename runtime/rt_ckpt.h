/* rt_ckpt.h - between the files of checkpoints (rt.h says what the rest
 * of the runtime calls): the folder and its files (rt_ckpt_folder.c), the
 * format and writing (rt_checkpoint.c), and reading one back
 * (rt_resume.c), each calling only those before it.  docs/checkpoint.md
 * describes the format. */
#ifndef CLEAVE_RT_CKPT_H
#define CLEAVE_RT_CKPT_H

#include <jansson.h>
#include <stdint.h>

#include "rt.h"

/* state.bin: RT_CKPT_MAGIC, u32 version, u32 0, u64 header bytes, the
 * header (JSON), zeros to a multiple of 64, the payload, u32 CRC-32 of
 * every byte before it, u32 0.  Little-endian. */
#define RT_CKPT_MAGIC "CLEAVECK" /* its 8 characters, without the NUL */
enum { RT_CKPT_VERSION = 1, RT_CKPT_HEAD = 24, RT_CKPT_TAIL = 8 };

/* ---- the folder: rt_ckpt_folder.c ----------------------------------------- */

/* "dir/name" in a new string (NULL: out of memory). */
char *rt_ckpt_join(const char *dir, const char *name);
/* mkdir -p; 0 or an errno. */
int rt_ckpt_make_dirs(const char *path);
/* Removes a checkpoint folder, which holds files only. */
void rt_ckpt_remove(const char *path);
/* A checkpoint folder's name for `step`, and the step of a name (-1: not
 * a checkpoint's). */
void rt_ckpt_name(char *buf, size_t size, int64_t step);
int64_t rt_ckpt_step_of(const char *name);
/* The steps of dir's checkpoint folders, newest first; *n of them. */
int64_t *rt_ckpt_list(const char *dir, int *n);
/* dir/name holding a then b, written through out_file; 0 or an errno. */
int rt_ckpt_write_file(const char *dir, const char *name, const void *a, size_t a_len, const void *b, size_t b_len);
/* A whole regular file into *buf; 0 or an errno (EINVAL: not a regular file). */
int rt_ckpt_read_file(const char *path, uint8_t **buf, size_t *len);
/* zlib's CRC-32 of p[0..len), continuing from crc (0 to start). */
uint32_t rt_ckpt_crc32(uint32_t crc, const uint8_t *p, size_t len);

/* ---- the format: rt_checkpoint.c ------------------------------------------ */

/* A tensor's shape as a JSON array. */
json_t *rt_ckpt_shape_json(const RtTensor *t);

#endif
