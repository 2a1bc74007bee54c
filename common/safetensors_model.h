/*
 * safetensors_model.h — a checkpoint directory, sharded or not, and its fingerprint (prefix
 * st_model_).
 *
 * A sharded checkpoint is a directory with model.safetensors.index.json
 * ({"metadata": {...}, "weight_map": {name: file}}); a directory without an index holds one
 * model.safetensors (or exactly one *.safetensors). Every name in the index must exist in the
 * shard it points to; a shard file that is missing or broken fails the open with its name.
 * The tensors are views into the files' mappings (safetensors.h), valid until st_model_close.
 */
#ifndef EPMOE_SAFETENSORS_MODEL_H
#define EPMOE_SAFETENSORS_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "common/limits.h"
#include "common/safetensors.h"

/* ---- a checkpoint directory (sharded or not) ---- */
typedef struct st_model st_model;
st_model *st_model_open(const char *dir, ep_err *err);
void st_model_close(st_model **self_p);
int st_model_count(const st_model *m);
const st_tensor *st_model_at(const st_model *m, int i); /* sorted by name */
const st_tensor *st_model_find(const st_model *m, const char *name);
const char *st_model_dir(const st_model *m);

/* A checkpoint's fingerprint: per safetensors file, what it was when opened. The coordinator
 * broadcasts its own (WELCOME.checkpoint); a worker whose files differ refuses to load, so a
 * checkpoint regenerated or truncated under a running cluster is never mixed with the old. */
typedef struct st_file_print {
    char name[EP_MAX_NAME]; /* relative to the model directory */
    uint64_t size;          /* bytes */
    int64_t mtime_ns;       /* modification time, ns since the epoch */
    uint64_t header_hash;   /* FNV-1a 64 of the length prefix and the JSON header */
} st_file_print;
int st_model_nfiles(const st_model *m);
/* Whether dir holds a checkpoint at all (an index or a *.safetensors file), as opposed to, say,
 * a directory with a config.json only. */
bool st_model_has_files(const char *dir);
void st_model_print(const st_model *m, int i, st_file_print *out);
/* The opened files against want[0..n): the same set of names, each with equal size, mtime and
 * header hash. The first difference fails, naming the file and both values. */
int st_model_check_prints(const st_model *m, const st_file_print *want, int n, ep_err *err);

#endif
