/*
 * safetensors_internal.h — what the safetensors reader shares with the checkpoint directory and
 * the writer (prefix st_): the record of an opened file, the name table, the rule for a shard's
 * file name. Only common/safetensors*.c include it.
 */
#ifndef EPMOE_SAFETENSORS_INTERNAL_H
#define EPMOE_SAFETENSORS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/safetensors.h"

/* ---- name table: open addressing, FNV-1a, linear probing (safetensors.c) ---- */

/* Slots point at tensors (NULL = empty); capacity is a power of two >= 2 x count, so the load
 * factor stays <= 1/2 and every probe sequence ends at an empty slot. */
typedef struct st_table {
    const st_tensor **slots;
    size_t mask;
} st_table;

int st_table_init(st_table *t, size_t count);
void st_table_free(st_table *t);
/* Insert x; returns NULL when inserted, or the tensor already holding that name. */
const st_tensor *st_table_put(st_table *t, const st_tensor *x);
const st_tensor *st_table_get(const st_table *t, const char *name);

/* ---- one opened file (safetensors.c) ---- */

struct st_file {
    char *path; /* as given (st_open) or the name passed to st_parse */
    void *map;  /* the mapping when st_open made it, else NULL */
    size_t map_len;
    int fd;               /* st_open: kept for st_tensor_read; -1 for st_parse */
    const uint8_t *image; /* byte 0 of the file image (the mapping, or st_parse's buffer) */
    int64_t mtime_ns;     /* st_open: the file's modification time at open */
    uint64_t header_hash; /* FNV-1a 64 of bytes [0, 8 + N) */
    int count;
    st_tensor *tensors; /* sorted by data offset */
    char *names;        /* arena holding every tensor name */
    st_table table;
};

/* A shard named by an index must stay inside the checkpoint directory. */
static inline bool st_plain_file_name(const char *s)
{
    return s[0] != '\0' && strchr(s, '/') == NULL && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

#endif
