/*
 * safetensors_writer.h — write safetensors files and a sharded checkpoint's index (prefix
 * st_writer_, st_index_). Files it writes are ones st_open accepts. Linked only by what makes
 * checkpoints (the library epmoe_st_writer: epmoectl mkmodel, tensors and forward, tests).
 */
#ifndef EPMOE_SAFETENSORS_WRITER_H
#define EPMOE_SAFETENSORS_WRITER_H

#include <stdint.h>

#include "common/error.h"
#include "common/safetensors.h"

/* ---- writing ---- */
typedef struct st_writer st_writer;
st_writer *st_writer_create(void);
void st_writer_destroy(st_writer **self_p);
/* Add a tensor; data (numel * dtype size bytes) is copied. Names must be unique. */
int st_writer_add(st_writer *w, const char *name, st_dtype dt, int ndim, const int64_t *shape,
                  const void *data, ep_err *err);
/* Total data bytes added so far (what "total_size" in an index counts). */
uint64_t st_writer_bytes(const st_writer *w);
/* Write the file: header with "__metadata__": {"format": "pt"}, padded with spaces so the data
 * starts 8-byte aligned, tensors in the order added. Writes to path.tmp and renames, so a
 * reader never sees a half-written file. */
int st_writer_write(const st_writer *w, const char *path, ep_err *err);

/* Write model.safetensors.index.json: names[i] lives in files[i] (file names relative to the
 * directory of the index). */
int st_index_write(const char *path, int n, const char *const *names, const char *const *files,
                   uint64_t total_size, ep_err *err);

#endif
