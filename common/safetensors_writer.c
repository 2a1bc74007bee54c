/*
 * safetensors_writer.c — writing safetensors files and sharded-checkpoint indexes (see
 * safetensors_writer.h).
 *
 * The header keys are in insertion order with "__metadata__":{"format":"pt"} first, padded with
 * spaces so the data region starts at a multiple of 8; the file goes to PATH.tmp, is fsync'ed
 * and renamed over PATH. Only the tools and tests that make checkpoints link this (the library
 * epmoe_st_writer); the daemons only read.
 */
#include "common/safetensors_writer.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/safetensors_internal.h"

typedef struct st_witem {
    void *data;
    uint64_t nbytes;
} st_witem;

struct st_writer {
    json_t *header; /* insertion-ordered: "__metadata__" first, then tensors as added */
    st_witem *items;
    int count, cap;
    uint64_t bytes;
};

st_writer *st_writer_create(void)
{
    st_writer *w = calloc(1, sizeof *w);
    if (w == NULL)
        return NULL;
    w->header = json_pack("{s:{s:s}}", "__metadata__", "format", "pt");
    if (w->header == NULL) {
        free(w);
        return NULL;
    }
    return w;
}

void st_writer_destroy(st_writer **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    st_writer *w = *self_p;
    for (int i = 0; i < w->count; i++)
        free(w->items[i].data);
    free(w->items);
    json_decref(w->header);
    free(w);
    *self_p = NULL;
}

uint64_t st_writer_bytes(const st_writer *w)
{
    return w->bytes;
}

/* The same checks a reader applies, so the writer never produces a file st_open refuses. */
static int st_writer_check(const st_writer *w, const char *name, st_dtype dt, int ndim,
                           const int64_t *shape, uint64_t *nbytes, ep_err *err)
{
    if (name == NULL || name[0] == '\0')
        return ep_err_set(err, "st_writer_add: empty tensor name");
    if (strlen(name) >= EP_MAX_NAME)
        return ep_err_set(err, "tensor \"%.64s...\": name longer than %d bytes", name,
                          EP_MAX_NAME - 1);
    if (strcmp(name, "__metadata__") == 0)
        return ep_err_set(err, "tensor \"__metadata__\": name is reserved by the format");
    if (json_object_get(w->header, name) != NULL)
        return ep_err_set(err, "tensor \"%s\": duplicate name", name);
    if (w->count >= ST_MAX_TENSORS)
        return ep_err_set(err, "tensor \"%s\": more than %d tensors", name, ST_MAX_TENSORS);
    if ((unsigned)dt >= ST_DTYPE_COUNT)
        return ep_err_set(err, "tensor \"%s\": invalid dtype %d", name, (int)dt);
    if (ndim < 0 || ndim > ST_MAX_DIMS || (ndim > 0 && shape == NULL))
        return ep_err_set(err, "tensor \"%s\": %d dimensions, expected 0..%d", name, ndim,
                          ST_MAX_DIMS);
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return ep_err_set(err, "tensor \"%s\": shape[%d] is %lld, negative", name, i,
                              (long long)shape[i]);
        if (shape[i] != 0 && numel > INT64_MAX / shape[i])
            return ep_err_set(err, "tensor \"%s\": element count overflows 64 bits", name);
        numel *= shape[i];
    }
    /* Offsets are JSON integers (int64): the running total must stay below INT64_MAX. */
    uint64_t room = (uint64_t)INT64_MAX - w->bytes;
    if ((uint64_t)numel > room / st_dtype_size(dt))
        return ep_err_set(err, "tensor \"%s\": %lld elements overflow the file's byte offsets",
                          name, (long long)numel);
    *nbytes = (uint64_t)numel * st_dtype_size(dt);
    return 0;
}

static json_t *st_writer_entry(st_dtype dt, int ndim, const int64_t *shape, uint64_t begin,
                               uint64_t end)
{
    json_t *e = json_object(), *s = json_array(), *o = json_array();
    bool ok = e && s && o && json_object_set_new(e, "dtype", json_string(st_dtype_name(dt))) == 0;
    for (int i = 0; ok && i < ndim; i++)
        ok = json_array_append_new(s, json_integer((json_int_t)shape[i])) == 0;
    ok = ok && json_array_append_new(o, json_integer((json_int_t)begin)) == 0 &&
         json_array_append_new(o, json_integer((json_int_t)end)) == 0;
    if (ok && json_object_set_new(e, "shape", s) == 0) {
        s = NULL;
        if (json_object_set_new(e, "data_offsets", o) == 0)
            return e;
        o = NULL;
    }
    json_decref(s);
    json_decref(o);
    json_decref(e);
    return NULL;
}

int st_writer_add(st_writer *w, const char *name, st_dtype dt, int ndim, const int64_t *shape,
                  const void *data, ep_err *err)
{
    uint64_t nbytes = 0;
    if (st_writer_check(w, name, dt, ndim, shape, &nbytes, err) != 0)
        return -1;
    if (nbytes > 0 && data == NULL)
        return ep_err_set(err, "tensor \"%s\": data is NULL for %llu bytes", name,
                          (unsigned long long)nbytes);
    if (w->count == w->cap) {
        int cap = w->cap ? 2 * w->cap : 64;
        st_witem *ni = realloc(w->items, (size_t)cap * sizeof *ni);
        if (ni == NULL)
            return ep_err_set(err, "tensor \"%s\": out of memory", name);
        w->items = ni;
        w->cap = cap;
    }
    void *copy = malloc(nbytes ? (size_t)nbytes : 1);
    json_t *entry = st_writer_entry(dt, ndim, shape, w->bytes, w->bytes + nbytes);
    if (copy == NULL || entry == NULL) {
        free(copy);
        json_decref(entry);
        return ep_err_set(err, "tensor \"%s\": out of memory for %llu bytes", name,
                          (unsigned long long)nbytes);
    }
    if (json_object_set_new(w->header, name, entry) != 0) {
        free(copy);
        return ep_err_set(err, "tensor \"%s\": name is not valid UTF-8", name);
    }
    if (nbytes > 0)
        memcpy(copy, data, (size_t)nbytes);
    w->items[w->count++] = (st_witem){copy, nbytes};
    w->bytes += nbytes;
    return 0;
}

/* Atomic replace: write PATH.tmp, fsync, rename. On failure PATH.tmp is removed and PATH is
 * untouched. */
typedef struct st_out {
    FILE *fp;
    char tmp[EP_MAX_PATH];
    const char *path;
} st_out;

static int st_out_open(st_out *o, const char *path, ep_err *err)
{
    o->path = path;
    if ((size_t)snprintf(o->tmp, sizeof o->tmp, "%s.tmp", path) >= sizeof o->tmp)
        return ep_err_set(err, "%s: path too long", path);
    o->fp = fopen(o->tmp, "wb");
    if (o->fp == NULL) /* the name the user gave first: the .tmp is ours */
        return ep_err_errno(err, "%s: cannot be written (through %s)", path, o->tmp);
    return 0;
}

static int st_out_write(st_out *o, const void *p, size_t n, ep_err *err)
{
    if (n > 0 && fwrite(p, 1, n, o->fp) != n)
        return ep_err_errno(err, "%s: write", o->tmp);
    return 0;
}

static int st_out_close(st_out *o, int rc, ep_err *err)
{
    if (rc == 0 && (fflush(o->fp) != 0 || fsync(fileno(o->fp)) != 0))
        rc = ep_err_errno(err, "%s: flush", o->tmp);
    if (fclose(o->fp) != 0 && rc == 0)
        rc = ep_err_errno(err, "%s: close", o->tmp);
    if (rc == 0 && rename(o->tmp, o->path) != 0)
        rc = ep_err_errno(err, "%s: rename to %s", o->tmp, o->path);
    if (rc != 0)
        unlink(o->tmp);
    return rc;
}

int st_writer_write(const st_writer *w, const char *path, ep_err *err)
{
    char *hdr = json_dumps(w->header, JSON_COMPACT);
    if (hdr == NULL)
        return ep_err_set(err, "%s: out of memory for the header", path);
    size_t n = strlen(hdr);
    size_t pad = (8 - (8 + n) % 8) % 8;
    uint64_t total = n + pad;
    uint8_t prefix[8 + 8];
    for (int i = 0; i < 8; i++)
        prefix[i] = (uint8_t)(total >> (8 * i));
    memset(prefix + 8, ' ', sizeof prefix - 8);

    st_out o;
    int rc = st_out_open(&o, path, err);
    if (rc == 0) {
        rc = st_out_write(&o, prefix, 8, err);
        if (rc == 0)
            rc = st_out_write(&o, hdr, n, err);
        if (rc == 0)
            rc = st_out_write(&o, prefix + 8, pad, err);
        for (int i = 0; rc == 0 && i < w->count; i++)
            rc = st_out_write(&o, w->items[i].data, (size_t)w->items[i].nbytes, err);
        rc = st_out_close(&o, rc, err);
    }
    free(hdr);
    return rc;
}

static json_t *st_index_json(int n, const char *const *names, const char *const *files,
                             uint64_t total_size, ep_err *err)
{
    json_t *wm = json_object();
    json_t *root = json_pack("{s:{s:I},s:o}", "metadata", "total_size", (json_int_t)total_size,
                             "weight_map", wm);
    if (root == NULL) {
        ep_err_set(err, "out of memory");
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (names[i] == NULL || files[i] == NULL || !st_plain_file_name(files[i])) {
            ep_err_set(err, "tensor \"%s\": shard \"%s\" is not a plain file name",
                       names[i] ? names[i] : "(null)", files[i] ? files[i] : "(null)");
            goto fail;
        }
        if (json_object_get(wm, names[i]) != NULL) {
            ep_err_set(err, "tensor \"%s\": listed twice", names[i]);
            goto fail;
        }
        if (json_object_set_new(wm, names[i], json_string(files[i])) != 0) {
            ep_err_set(err, "tensor \"%s\": name or shard \"%s\" is not valid UTF-8", names[i],
                       files[i]);
            goto fail;
        }
    }
    return root;

fail:
    json_decref(root);
    return NULL;
}

int st_index_write(const char *path, int n, const char *const *names, const char *const *files,
                   uint64_t total_size, ep_err *err)
{
    if (n < 0 || n > ST_MAX_TENSORS)
        return ep_err_set(err, "%s: %d tensors, expected 0..%d", path, n, ST_MAX_TENSORS);
    if (total_size > (uint64_t)INT64_MAX)
        return ep_err_set(err, "%s: total_size %llu does not fit a JSON integer", path,
                          (unsigned long long)total_size);
    json_t *root = st_index_json(n, names, files, total_size, err);
    if (root == NULL)
        return ep_err_prefix(err, "%s", path);
    /* Sorted keys, two-space indent: the layout transformers writes. */
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(root);
    if (text == NULL)
        return ep_err_set(err, "%s: out of memory", path);
    st_out o;
    int rc = st_out_open(&o, path, err);
    if (rc == 0) {
        rc = st_out_write(&o, text, strlen(text), err);
        if (rc == 0)
            rc = st_out_write(&o, "\n", 1, err);
        rc = st_out_close(&o, rc, err);
    }
    free(text);
    return rc;
}
