/*
 * safetensors.h — read one safetensors file (prefix st_).
 *
 * Format (spec §2.1): u64 little-endian header length N; N bytes of UTF-8 JSON mapping tensor
 * names to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to byte 8+N,
 * end exclusive) plus an optional "__metadata__" string map, which is skipped; then the data.
 *
 * Reading maps the file read-only (mmap): tensors are views into the mapping, so opening a
 * 160 GB checkpoint costs only its headers, and a worker touches just the pages of its experts.
 * A mapped file that shrinks later (truncated under a running cluster) would make any read of
 * its lost pages fault (SIGBUS): headers are therefore read with pread, and a loader reads
 * tensor bytes with st_tensor_read, which fails with a message instead. Files are opened with
 * O_NONBLOCK, so a FIFO where a shard should be is refused instead of blocking the open.
 * Validation is strict and every error names the file and, where there is one, the tensor:
 *   header length > ST_MAX_HEADER_BYTES or past the end of the file; JSON not well formed (with
 *   line:column) or not an object; an entry that is not {"dtype","shape","data_offsets"}; an
 *   unknown dtype string; a negative or non-integer dimension; shape x dtype size != end-begin;
 *   begin > end; an end past the data region; two tensors overlapping; a duplicate name.
 * Lookup by name is O(1) (hash table).
 *
 * A checkpoint directory: safetensors_model.h; writing: safetensors_writer.h.
 */
#ifndef EPMOE_SAFETENSORS_H
#define EPMOE_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/limits.h"

typedef enum st_dtype {
    ST_BOOL,
    ST_U8,
    ST_I8,
    ST_I16,
    ST_U16,
    ST_F16,
    ST_BF16,
    ST_I32,
    ST_U32,
    ST_F32,
    ST_F64,
    ST_I64,
    ST_U64,
    ST_F8_E4M3,
    ST_F8_E5M2,
    ST_F8_E8M0,
    ST_DTYPE_COUNT
} st_dtype;

/* "BF16", "F8_E4M3", ... exactly as written in headers. */
const char *st_dtype_name(st_dtype dt);
/* Bytes per element. */
size_t st_dtype_size(st_dtype dt);
/* Parse a header dtype string. Returns 0, or -1 when unknown (sub-byte types such as F4 and
 * F6_E2M3 are recognised by name and refused as unsupported, with that said in err). */
int st_dtype_parse(const char *s, st_dtype *out, ep_err *err);

typedef struct st_file st_file;

typedef struct st_tensor {
    const char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;       /* product of shape; 1 for a scalar ([]) */
    uint64_t nbytes;     /* numel * dtype size == end - begin */
    const void *data;    /* view into the mapping (little-endian, C order), valid until close */
    const st_file *file; /* the file that holds it */
} st_tensor;

/* ---- one file ---- */
st_file *st_open(const char *path, ep_err *err);
/* Parse a file image held in memory (len bytes from byte 0). The image is borrowed: it must
 * outlive the st_file. name is used in messages. Used by st_open and the fuzz target. */
st_file *st_parse(const void *image, size_t len, const char *name, ep_err *err);
void st_close(st_file **self_p);

const char *st_file_path(const st_file *f);
int st_count(const st_file *f);
const st_tensor *st_at(const st_file *f, int i);              /* in order of data offset */
const st_tensor *st_find(const st_file *f, const char *name); /* NULL when absent */

/* Read n bytes of t's data, from byte off of the tensor, into dst: pread from the file (for an
 * st_parse image a copy), never a fault of the mapping. A file that no longer holds those bytes
 * fails naming the file, the tensor and where the file now ends. */
int st_tensor_read(const st_tensor *t, uint64_t off, void *dst, size_t n, ep_err *err);

#endif
