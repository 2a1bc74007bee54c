/*
 * safetensors.c — safetensors reader, writer and sharded-checkpoint directory (see safetensors.h,
 * spec §2.1).
 *
 * Reading: st_open maps the file read-only (MAP_PRIVATE) and hands the image to st_parse, which
 * trusts nothing in it. The header is parsed by Jansson with duplicate keys rejected; every entry
 * is checked (types, dtype, dims, sizes, offsets) before anything derived from it is used, then
 * the tensors are sorted by data offset and neighbours checked for overlap. Gaps between tensors
 * are accepted (the reference writer never leaves any, but nothing breaks when there is one).
 * Names live in one arena; lookup is an open-addressing FNV-1a table sized at twice the count.
 *
 * A tensor's data pointer is not necessarily aligned: a header whose length is not a multiple
 * of 8 (legal, if unusual) puts the data region at any byte. Readers copy or use memcpy.
 * The mapping is MAP_PRIVATE over a file that must not be truncated while open (SIGBUS).
 *
 * Sharded checkpoints: the model's tensors are exactly the names of the index's weight_map.
 * A tensor present in a shard but absent from the index is ignored (counted in a debug line):
 * the index is what loaders (transformers, vLLM) treat as the list of weights, and taking only
 * it keeps one unambiguous owner per name even if two shards carry a stray copy.
 *
 * Writing: the header keys are in insertion order with "__metadata__":{"format":"pt"} first,
 * padded with spaces so the data region starts at a multiple of 8; the file goes to PATH.tmp,
 * is fsync'ed and renamed over PATH.
 */
#include "common/safetensors.h"
#include "common/rfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"

/* Byte counts read from files are uint64_t and are used as size_t offsets into the mapping. */
_Static_assert(sizeof(size_t) >= sizeof(uint64_t), "epmoe needs a 64-bit size_t");

/* model.safetensors.index.json is read whole into memory. Real indexes are a few MB (one line
 * per tensor); the header bound is a generous ceiling that keeps a stray huge file out. */
#define ST_MAX_INDEX_BYTES ST_MAX_HEADER_BYTES

#define ST_INDEX_NAME  "model.safetensors.index.json"
#define ST_SINGLE_NAME "model.safetensors"
#define ST_SUFFIX      ".safetensors"

/* ---- dtypes ---------------------------------------------------------------------------------- */

static const struct {
    const char *name;
    size_t size;
} st_dtypes[ST_DTYPE_COUNT] = {
    [ST_BOOL] = {"BOOL", 1},       [ST_U8] = {"U8", 1},           [ST_I8] = {"I8", 1},
    [ST_I16] = {"I16", 2},         [ST_U16] = {"U16", 2},         [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2},       [ST_I32] = {"I32", 4},         [ST_U32] = {"U32", 4},
    [ST_F32] = {"F32", 4},         [ST_F64] = {"F64", 8},         [ST_I64] = {"I64", 8},
    [ST_U64] = {"U64", 8},         [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
    [ST_F8_E8M0] = {"F8_E8M0", 1},
};

/* Defined by newer safetensors (spec §2.1) but not representable here: sub-byte element sizes
 * break the numel x size arithmetic, and no V4 tensor uses them (packed FP4 is stored as I8). */
static const struct {
    const char *name;
    const char *why;
} st_unsupported[] = {
    {"F4", "4-bit elements"},
    {"F6_E2M3", "6-bit elements"},
    {"F6_E3M2", "6-bit elements"},
    {"C64", "complex elements"},
};

const char *st_dtype_name(st_dtype dt)
{
    if ((unsigned)dt >= ST_DTYPE_COUNT)
        return "?";
    return st_dtypes[dt].name;
}

size_t st_dtype_size(st_dtype dt)
{
    if ((unsigned)dt >= ST_DTYPE_COUNT)
        return 0;
    return st_dtypes[dt].size;
}

int st_dtype_parse(const char *s, st_dtype *out, ep_err *err)
{
    for (int i = 0; i < ST_DTYPE_COUNT; i++) {
        if (strcmp(s, st_dtypes[i].name) == 0) {
            *out = (st_dtype)i;
            return 0;
        }
    }
    for (size_t i = 0; i < sizeof st_unsupported / sizeof st_unsupported[0]; i++) {
        if (strcmp(s, st_unsupported[i].name) == 0)
            return ep_err_set(err, "unsupported dtype \"%s\" (%s; epmoe reads whole-byte dtypes)",
                              s, st_unsupported[i].why);
    }
    return ep_err_set(err,
                      "unknown dtype \"%.64s\" (expected one of BOOL U8 I8 I16 U16 F16 BF16 I32 "
                      "U32 F32 F64 I64 U64 F8_E4M3 F8_E5M2 F8_E8M0)",
                      s);
}

/* ---- name table: open addressing, FNV-1a, linear probing --------------------------------------
 */

/* Slots point at tensors (NULL = empty); capacity is a power of two >= 2 x count, so the load
 * factor stays <= 1/2 and every probe sequence ends at an empty slot. */
typedef struct st_table {
    const st_tensor **slots;
    size_t mask;
} st_table;

static uint64_t st_fnv1a(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static int st_table_init(st_table *t, size_t count)
{
    size_t cap = 2;
    while (cap < 2 * count)
        cap <<= 1;
    t->slots = calloc(cap, sizeof *t->slots);
    t->mask = cap - 1;
    return t->slots ? 0 : -1;
}

static void st_table_free(st_table *t)
{
    free(t->slots);
    t->slots = NULL;
}

/* Insert x; returns NULL when inserted, or the tensor already holding that name. */
static const st_tensor *st_table_put(st_table *t, const st_tensor *x)
{
    size_t i = (size_t)st_fnv1a((const uint8_t *)x->name, strlen(x->name)) & t->mask;
    for (; t->slots[i] != NULL; i = (i + 1) & t->mask) {
        if (strcmp(t->slots[i]->name, x->name) == 0)
            return t->slots[i];
    }
    t->slots[i] = x;
    return NULL;
}

static const st_tensor *st_table_get(const st_table *t, const char *name)
{
    if (t->slots == NULL || name == NULL)
        return NULL;
    size_t i = (size_t)st_fnv1a((const uint8_t *)name, strlen(name)) & t->mask;
    for (; t->slots[i] != NULL; i = (i + 1) & t->mask) {
        if (strcmp(t->slots[i]->name, name) == 0)
            return t->slots[i];
    }
    return NULL;
}

/* ---- one file: parsing ------------------------------------------------------------------------
 */

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

/* Validated fields of one header entry, before it becomes an st_tensor. */
typedef struct st_entry {
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    uint64_t nbytes;
    uint64_t begin, end;
} st_entry;

static void st_format_shape(const int64_t *shape, int ndim, char *buf, size_t cap)
{
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (k < cap)
        snprintf(buf + k, cap - k, "]");
}

static int st_parse_dtype(const char *path, const char *name, json_t *v, st_entry *e, ep_err *err)
{
    if (!json_is_string(v))
        return ep_err_set(err, "%s: tensor \"%s\": \"dtype\" must be a string", path, name);
    if (st_dtype_parse(json_string_value(v), &e->dtype, err) != 0)
        return ep_err_prefix(err, "%s: tensor \"%s\"", path, name);
    return 0;
}

/* Reads the dims and their product; numel is checked against INT64_MAX before each multiply. */
static int st_parse_shape(const char *path, const char *name, json_t *v, st_entry *e, ep_err *err)
{
    if (!json_is_array(v))
        return ep_err_set(err, "%s: tensor \"%s\": \"shape\" must be an array of integers", path,
                          name);
    size_t n = json_array_size(v);
    if (n > ST_MAX_DIMS)
        return ep_err_set(err,
                          "%s: tensor \"%s\": shape has %zu dimensions, more than the limit "
                          "of %d",
                          path, name, n, ST_MAX_DIMS);
    e->ndim = (int)n;
    e->numel = 1;
    for (size_t i = 0; i < n; i++) {
        json_t *d = json_array_get(v, i);
        if (!json_is_integer(d))
            return ep_err_set(err, "%s: tensor \"%s\": shape[%zu] is not an integer", path, name,
                              i);
        json_int_t x = json_integer_value(d);
        if (x < 0)
            return ep_err_set(err, "%s: tensor \"%s\": shape[%zu] is %lld, negative", path, name, i,
                              (long long)x);
        e->shape[i] = (int64_t)x;
        if (x != 0 && e->numel > INT64_MAX / x)
            return ep_err_set(err,
                              "%s: tensor \"%s\": shape has more elements than fit in 64 "
                              "bits (overflow at shape[%zu] = %lld)",
                              path, name, i, (long long)x);
        e->numel *= x;
    }
    size_t size = st_dtypes[e->dtype].size;
    if ((uint64_t)e->numel > UINT64_MAX / size)
        return ep_err_set(err,
                          "%s: tensor \"%s\": %lld elements of %s overflow a 64-bit byte "
                          "count",
                          path, name, (long long)e->numel, st_dtypes[e->dtype].name);
    e->nbytes = (uint64_t)e->numel * size;
    return 0;
}

static int st_parse_offsets(const char *path, const char *name, json_t *v, st_entry *e, ep_err *err)
{
    json_t *b = json_array_get(v, 0), *en = json_array_get(v, 1);
    if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_integer(b) || !json_is_integer(en))
        return ep_err_set(err,
                          "%s: tensor \"%s\": \"data_offsets\" must be an array of two "
                          "integers [begin, end]",
                          path, name);
    json_int_t bi = json_integer_value(b), ei = json_integer_value(en);
    if (bi < 0 || ei < 0)
        return ep_err_set(err, "%s: tensor \"%s\": data_offsets [%lld, %lld] are negative", path,
                          name, (long long)bi, (long long)ei);
    if (bi > ei)
        return ep_err_set(err, "%s: tensor \"%s\": data_offsets [%lld, %lld]: begin > end", path,
                          name, (long long)bi, (long long)ei);
    e->begin = (uint64_t)bi;
    e->end = (uint64_t)ei;
    return 0;
}

/* One header entry: exactly {"dtype", "shape", "data_offsets"}, sizes consistent, inside the
 * data region of data_len bytes. */
static int st_parse_entry(const char *path, const char *name, json_t *v, uint64_t data_len,
                          st_entry *e, ep_err *err)
{
    if (!json_is_object(v))
        return ep_err_set(err,
                          "%s: tensor \"%s\": entry is not an object {\"dtype\", \"shape\", "
                          "\"data_offsets\"}",
                          path, name);
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val)
    {
        if (strcmp(key, "dtype") != 0 && strcmp(key, "shape") != 0 &&
            strcmp(key, "data_offsets") != 0)
            return ep_err_set(err,
                              "%s: tensor \"%s\": unexpected key \"%.64s\" (expected "
                              "exactly dtype, shape, data_offsets)",
                              path, name, key);
    }
    static const char *const need[] = {"dtype", "shape", "data_offsets"};
    for (int i = 0; i < 3; i++) {
        if (json_object_get(v, need[i]) == NULL)
            return ep_err_set(err, "%s: tensor \"%s\": missing \"%s\"", path, name, need[i]);
    }
    if (st_parse_dtype(path, name, json_object_get(v, "dtype"), e, err) != 0 ||
        st_parse_shape(path, name, json_object_get(v, "shape"), e, err) != 0 ||
        st_parse_offsets(path, name, json_object_get(v, "data_offsets"), e, err) != 0)
        return -1;
    if (e->end > data_len)
        return ep_err_set(err,
                          "%s: tensor \"%s\": data_offsets [%llu, %llu] end past the data "
                          "region of %llu bytes",
                          path, name, (unsigned long long)e->begin, (unsigned long long)e->end,
                          (unsigned long long)data_len);
    if (e->end - e->begin != e->nbytes) {
        char shp[256];
        st_format_shape(e->shape, e->ndim, shp, sizeof shp);
        return ep_err_set(err,
                          "%s: tensor \"%s\": shape %s x %s is %llu bytes but data_offsets "
                          "[%llu, %llu] span %llu bytes",
                          path, name, shp, st_dtypes[e->dtype].name, (unsigned long long)e->nbytes,
                          (unsigned long long)e->begin, (unsigned long long)e->end,
                          (unsigned long long)(e->end - e->begin));
    }
    return 0;
}

static int st_check_metadata(const char *path, json_t *v, ep_err *err)
{
    if (!json_is_object(v))
        return ep_err_set(err, "%s: \"__metadata__\" is not an object of strings", path);
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val)
    {
        if (!json_is_string(val))
            return ep_err_set(err, "%s: \"__metadata__\" value for \"%.64s\" is not a string", path,
                              key);
    }
    return 0;
}

/* Data order; ties (zero-size tensors) broken by end, then name, so st_at is deterministic. */
static int st_cmp_offset(const void *a, const void *b)
{
    const st_tensor *x = a, *y = b;
    const uint8_t *xd = x->data, *yd = y->data;
    if (xd != yd)
        return xd < yd ? -1 : 1;
    if (x->nbytes != y->nbytes)
        return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* After sorting by begin, a tensor overlaps an earlier one iff it begins before the largest end
 * seen so far. Zero-size tensors occupy no bytes but still may not sit inside another tensor. */
static int st_check_overlap(const st_file *f, const uint8_t *data, ep_err *err)
{
    const st_tensor *far = NULL; /* the tensor reaching furthest so far */
    for (int i = 0; i < f->count; i++) {
        const st_tensor *t = &f->tensors[i];
        const uint8_t *b = t->data;
        if (far != NULL && b < (const uint8_t *)far->data + far->nbytes &&
            (t->nbytes > 0 || b > (const uint8_t *)far->data)) {
            uint64_t fb = (uint64_t)((const uint8_t *)far->data - data);
            uint64_t tb = (uint64_t)(b - data);
            return ep_err_set(err,
                              "%s: tensors \"%s\" [%llu, %llu) and \"%s\" [%llu, %llu) "
                              "overlap",
                              f->path, far->name, (unsigned long long)fb,
                              (unsigned long long)(fb + far->nbytes), t->name,
                              (unsigned long long)tb, (unsigned long long)(tb + t->nbytes));
        }
        if (far == NULL || b + t->nbytes > (const uint8_t *)far->data + far->nbytes)
            far = t;
    }
    return 0;
}

/* Fill f from a parsed header object; data is the data region (data_len bytes). */
static int st_load_entries(st_file *f, json_t *root, const uint8_t *data, uint64_t data_len,
                           ep_err *err)
{
    const char *key;
    json_t *val;
    size_t n = 0, name_bytes = 0;
    json_object_foreach(root, key, val)
    {
        if (strcmp(key, "__metadata__") == 0) {
            if (st_check_metadata(f->path, val, err) != 0)
                return -1;
            continue;
        }
        size_t len = strlen(key);
        if (len >= EP_MAX_NAME)
            return ep_err_set(err,
                              "%s: tensor name \"%.64s...\" is %zu bytes, longer than the "
                              "limit of %d",
                              f->path, key, len, EP_MAX_NAME - 1);
        if (++n > ST_MAX_TENSORS)
            return ep_err_set(err, "%s: header has more than %d tensors", f->path, ST_MAX_TENSORS);
        name_bytes += len + 1;
    }
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    f->names = malloc(name_bytes ? name_bytes : 1);
    if (f->tensors == NULL || f->names == NULL || st_table_init(&f->table, n) != 0)
        return ep_err_set(err, "%s: out of memory for %zu tensors", f->path, n);

    char *arena = f->names;
    json_object_foreach(root, key, val)
    {
        if (strcmp(key, "__metadata__") == 0)
            continue;
        st_entry e;
        if (st_parse_entry(f->path, key, val, data_len, &e, err) != 0)
            return -1;
        st_tensor *t = &f->tensors[f->count++];
        size_t len = strlen(key);
        memcpy(arena, key, len + 1);
        t->name = arena;
        arena += len + 1;
        t->dtype = e.dtype;
        t->ndim = e.ndim;
        memcpy(t->shape, e.shape, sizeof e.shape);
        t->numel = e.numel;
        t->nbytes = e.nbytes;
        t->data = data + e.begin;
        t->file = f;
    }
    qsort(f->tensors, (size_t)f->count, sizeof *f->tensors, st_cmp_offset);
    if (st_check_overlap(f, data, err) != 0)
        return -1;
    for (int i = 0; i < f->count; i++) {
        /* JSON_REJECT_DUPLICATES already refused these; kept so the table's invariant never
         * rests on the JSON library's options. */
        if (st_table_put(&f->table, &f->tensors[i]) != NULL)
            return ep_err_set(err, "%s: duplicate tensor name \"%s\"", f->path, f->tensors[i].name);
    }
    return 0;
}

/* The header length N from the first 8 bytes of a file of len bytes, checked. */
static int st_header_len(const st_file *f, const uint8_t b[8], size_t len, uint64_t *out,
                         ep_err *err)
{
    if (len < 8)
        return ep_err_set(err, "%s: file is %zu bytes, shorter than the 8-byte header length",
                          f->path, len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | b[i];
    if (n > ST_MAX_HEADER_BYTES)
        return ep_err_set(err,
                          "%s: not a safetensors file: header length %llu exceeds the limit of "
                          "%u bytes",
                          f->path, (unsigned long long)n, ST_MAX_HEADER_BYTES);
    if (n > len - 8)
        return ep_err_set(err,
                          "%s: header length %llu extends past the end of the file "
                          "(8 + %llu > %zu bytes)",
                          f->path, (unsigned long long)n, (unsigned long long)n, len);
    *out = n;
    return 0;
}

/* Parse the JSON header (n bytes at json) of a file whose data region is data[0, data_len). */
static int st_parse_json(st_file *f, const char *json, uint64_t n, const uint8_t *data,
                         uint64_t data_len, ep_err *err)
{
    json_error_t jerr;
    json_t *root = json_loadb(json, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return ep_err_set(err, "%s: header JSON line %d column %d: %s", f->path, jerr.line,
                          jerr.column, jerr.text);
    int rc = 0;
    if (!json_is_object(root))
        rc = ep_err_set(err, "%s: header JSON is not an object", f->path);
    else
        rc = st_load_entries(f, root, data, data_len, err);
    json_decref(root);
    return rc;
}

static st_file *st_file_new(const char *name, ep_err *err)
{
    st_file *f = calloc(1, sizeof *f);
    if (f == NULL || (f->path = strdup(name)) == NULL) {
        free(f);
        ep_err_set(err, "%s: out of memory", name);
        return NULL;
    }
    f->fd = -1;
    return f;
}

st_file *st_parse(const void *image, size_t len, const char *name, ep_err *err)
{
    st_file *f = st_file_new(name ? name : "(memory)", err);
    if (f == NULL)
        return NULL;
    const uint8_t *b = image;
    uint64_t n = 0;
    if (st_header_len(f, b, len, &n, err) != 0 ||
        st_parse_json(f, (const char *)b + 8, n, b + 8 + n, (uint64_t)(len - 8 - n), err) != 0) {
        st_close(&f);
        return NULL;
    }
    f->image = b;
    f->header_hash = st_fnv1a(b, (size_t)(8 + n));
    return f;
}

/* pread exactly n bytes at off; a short read is the file having shrunk. */
static int st_pread(int fd, void *dst, size_t n, uint64_t off, const char *path, ep_err *err)
{
    uint8_t *p = dst;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return ep_err_errno(err, "%s: read at byte %llu", path, (unsigned long long)off);
        if (r == 0) {
            struct stat sb;
            long long now = fstat(fd, &sb) == 0 ? (long long)sb.st_size : -1;
            return ep_err_set(err,
                              "%s: the file ends at byte %lld, byte %llu was expected: it was "
                              "truncated or replaced while being read",
                              path, now, (unsigned long long)off);
        }
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

/* The header of the file open at fd (len bytes), read rather than faulted in: a file truncated
 * after the fstat fails here with a message instead of killing the process with SIGBUS. */
static int st_open_header(st_file *f, int fd, size_t len, const uint8_t *map, ep_err *err)
{
    uint8_t head[8];
    uint64_t n = 0;
    if (st_pread(fd, head, len < 8 ? len : 8, 0, f->path, err) != 0 ||
        st_header_len(f, head, len, &n, err) != 0)
        return -1;
    uint8_t *buf = malloc((size_t)n + 8);
    if (buf == NULL)
        return ep_err_set(err, "%s: out of memory for a %llu-byte header", f->path,
                          (unsigned long long)n);
    memcpy(buf, head, 8);
    int rc = st_pread(fd, buf + 8, (size_t)n, 8, f->path, err);
    if (rc == 0)
        rc = st_parse_json(f, (const char *)buf + 8, n, map + 8 + n, (uint64_t)(len - 8 - n), err);
    if (rc == 0)
        f->header_hash = st_fnv1a(buf, (size_t)n + 8);
    free(buf);
    return rc;
}

st_file *st_open(const char *path, ep_err *err)
{
    /* O_NONBLOCK: a FIFO or device must not block the open before the regular-file check */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        ep_err_errno(err, "%s", path);
        return NULL;
    }
    struct stat sb;
    st_file *f = NULL;
    if (fstat(fd, &sb) != 0) {
        ep_err_errno(err, "%s: stat", path);
        goto fail_fd;
    }
    if (!S_ISREG(sb.st_mode)) {
        ep_err_set(err, "%s: not a regular file", path);
        goto fail_fd;
    }
    size_t len = (size_t)sb.st_size;
    if (len < 8) {
        /* mmap cannot map an empty file; the parse would refuse it anyway. */
        ep_err_set(err, "%s: file is %zu bytes, shorter than the 8-byte header length", path, len);
        goto fail_fd;
    }
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        ep_err_errno(err, "%s: mmap of %zu bytes", path, len);
        goto fail_fd;
    }
    if ((f = st_file_new(path, err)) == NULL || st_open_header(f, fd, len, map, err) != 0) {
        st_close(&f);
        munmap(map, len);
        goto fail_fd;
    }
    f->map = map;
    f->map_len = len;
    f->image = map;
    f->fd = fd;
    f->mtime_ns = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
    return f;

fail_fd:
    close(fd);
    return NULL;
}

int st_tensor_read(const st_tensor *t, uint64_t off, void *dst, size_t n, ep_err *err)
{
    if (off > t->nbytes || n > t->nbytes - off)
        return ep_err_set(err, "tensor %s: bytes [%llu, %llu) outside its %llu bytes", t->name,
                          (unsigned long long)off, (unsigned long long)(off + n),
                          (unsigned long long)t->nbytes);
    const st_file *f = t->file;
    if (f == NULL || f->fd < 0) {
        memcpy(dst, (const uint8_t *)t->data + off, n);
        return 0;
    }
    uint64_t at = (uint64_t)((const uint8_t *)t->data - f->image) + off;
    if (st_pread(f->fd, dst, n, at, f->path, err) != 0)
        return ep_err_prefix(err, "tensor %s", t->name);
    return 0;
}

void st_close(st_file **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    st_file *f = *self_p;
    if (f->map != NULL)
        munmap(f->map, f->map_len);
    if (f->fd >= 0)
        close(f->fd);
    st_table_free(&f->table);
    free(f->tensors);
    free(f->names);
    free(f->path);
    free(f);
    *self_p = NULL;
}

const char *st_file_path(const st_file *f)
{
    return f->path;
}

int st_count(const st_file *f)
{
    return f->count;
}

const st_tensor *st_at(const st_file *f, int i)
{
    if (i < 0 || i >= f->count)
        return NULL;
    return &f->tensors[i];
}

const st_tensor *st_find(const st_file *f, const char *name)
{
    return st_table_get(&f->table, name);
}

/* ---- a checkpoint directory -------------------------------------------------------------------
 */

struct st_model {
    char *dir;
    int nfiles;
    st_file **files;
    int count;
    const st_tensor **by_name; /* sorted by name */
    st_table table;
};

static int st_join(char *buf, size_t cap, const char *dir, const char *file, ep_err *err)
{
    if ((size_t)snprintf(buf, cap, "%s/%s", dir, file) >= cap)
        return ep_err_set(err, "%s: path of \"%.64s\" is longer than %zu bytes", dir, file,
                          cap - 1);
    return 0;
}

/* A shard named by an index must stay inside the checkpoint directory. */
static bool st_plain_file_name(const char *s)
{
    return s[0] != '\0' && strchr(s, '/') == NULL && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

static int st_model_add_file(st_model *m, st_file *f)
{
    st_file **nf = realloc(m->files, (size_t)(m->nfiles + 1) * sizeof *nf);
    if (nf == NULL)
        return -1;
    m->files = nf;
    m->files[m->nfiles++] = f;
    return 0;
}

/* Read a whole small file (the index), bounded by max bytes. Caller frees *out. */
static int st_read_small(const char *path, size_t max, char **out, size_t *len, ep_err *err)
{
    FILE *fp = rf_open(path, NULL, err);
    if (fp == NULL)
        return -1;
    struct stat sb;
    if (fstat(fileno(fp), &sb) != 0) {
        fclose(fp);
        return ep_err_errno(err, "%s", path);
    }
    if ((uint64_t)sb.st_size > max) {
        fclose(fp);
        return ep_err_set(err, "%s: %lld bytes, more than the limit of %zu", path,
                          (long long)sb.st_size, max);
    }
    size_t n = (size_t)sb.st_size;
    char *buf = malloc(n ? n : 1);
    if (buf == NULL || fread(buf, 1, n, fp) != n) {
        free(buf);
        fclose(fp);
        return ep_err_set(err, "%s: read of %zu bytes failed", path, n);
    }
    fclose(fp);
    *out = buf;
    *len = n;
    return 0;
}

/* Open (once) the shard `file` named by the index; its st_file index comes back in *slot.
 * shards maps file name -> index into m->files. */
static int st_model_shard(st_model *m, json_t *shards, const char *ipath, const char *name,
                          const char *file, int *slot, ep_err *err)
{
    json_t *known = json_object_get(shards, file);
    if (known != NULL) {
        *slot = (int)json_integer_value(known);
        return 0;
    }
    if (!st_plain_file_name(file))
        return ep_err_set(err,
                          "%s: tensor \"%s\": shard \"%s\" is not a plain file name in "
                          "the checkpoint directory",
                          ipath, name, file);
    if (m->nfiles >= ST_MAX_SHARDS)
        return ep_err_set(err, "%s: more than %d shard files", ipath, ST_MAX_SHARDS);
    char path[EP_MAX_PATH];
    if (st_join(path, sizeof path, m->dir, file, err) != 0)
        return -1;
    st_file *f = st_open(path, err);
    if (f == NULL)
        return ep_err_prefix(err, "%s: shard \"%s\" (holding tensor \"%s\")", ipath, file, name);
    if (st_model_add_file(m, f) != 0) {
        st_close(&f);
        return ep_err_set(err, "%s: out of memory", ipath);
    }
    /* From here the model owns f. */
    if (json_object_set_new(shards, file, json_integer(m->nfiles - 1)) != 0)
        return ep_err_set(err, "%s: out of memory", ipath);
    *slot = m->nfiles - 1;
    return 0;
}

static int st_model_from_weight_map(st_model *m, json_t *wm, const char *ipath, ep_err *err)
{
    size_t n = json_object_size(wm);
    if (n > ST_MAX_TENSORS)
        return ep_err_set(err, "%s: weight_map has %zu tensors, more than the limit of %d", ipath,
                          n, ST_MAX_TENSORS);
    m->by_name = calloc(n ? n : 1, sizeof *m->by_name);
    json_t *shards = json_object();
    if (m->by_name == NULL || shards == NULL) {
        json_decref(shards);
        return ep_err_set(err, "%s: out of memory", ipath);
    }
    int rc = 0;
    const char *name;
    json_t *val;
    json_object_foreach(wm, name, val)
    {
        int slot = 0;
        if (!json_is_string(val)) {
            rc = ep_err_set(err, "%s: weight_map[\"%s\"] is not a file name string", ipath, name);
            break;
        }
        const char *file = json_string_value(val);
        if ((rc = st_model_shard(m, shards, ipath, name, file, &slot, err)) != 0)
            break;
        const st_tensor *t = st_find(m->files[slot], name);
        if (t == NULL) {
            rc = ep_err_set(err,
                            "%s: tensor \"%s\" is listed in shard \"%s\" but that file does "
                            "not contain it",
                            ipath, name, file);
            break;
        }
        m->by_name[m->count++] = t;
    }
    json_decref(shards);
    if (rc == 0) {
        long unlisted = -(long)m->count;
        for (int i = 0; i < m->nfiles; i++)
            unlisted += st_count(m->files[i]);
        if (unlisted > 0)
            log_debug(LOG_SUB_LOAD, "%s: %ld tensors in shards are not in the index, ignored",
                      ipath, unlisted);
    }
    return rc;
}

static int st_model_load_index(st_model *m, const char *ipath, ep_err *err)
{
    char *buf = NULL;
    size_t len = 0;
    if (st_read_small(ipath, ST_MAX_INDEX_BYTES, &buf, &len, err) != 0)
        return -1;
    json_error_t jerr;
    json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
    free(buf);
    if (root == NULL)
        return ep_err_set(err, "%s: JSON line %d column %d: %s", ipath, jerr.line, jerr.column,
                          jerr.text);
    int rc;
    json_t *wm = json_object_get(root, "weight_map");
    json_t *md = json_object_get(root, "metadata");
    if (!json_is_object(root))
        rc = ep_err_set(err, "%s: not a JSON object", ipath);
    else if (!json_is_object(wm))
        rc = ep_err_set(err, "%s: \"weight_map\" is missing or not an object", ipath);
    else if (md != NULL && !json_is_object(md))
        rc = ep_err_set(err, "%s: \"metadata\" is not an object", ipath);
    else
        rc = st_model_from_weight_map(m, wm, ipath, err);
    json_decref(root);
    return rc;
}

static int st_cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* No index, no model.safetensors: the directory must hold exactly one *.safetensors file. */
static int st_model_find_single(const st_model *m, char *path, size_t cap, ep_err *err)
{
    DIR *d = opendir(m->dir);
    if (d == NULL)
        return ep_err_errno(err, "%s", m->dir);
    char **found = NULL;
    size_t nfound = 0, sl = strlen(ST_SUFFIX);
    int rc = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        size_t l = strlen(e->d_name);
        struct stat sb;
        if (l <= sl || strcmp(e->d_name + l - sl, ST_SUFFIX) != 0 ||
            fstatat(dirfd(d), e->d_name, &sb, 0) != 0 || !S_ISREG(sb.st_mode))
            continue;
        char **nf = realloc(found, (nfound + 1) * sizeof *nf);
        if (nf == NULL || (nf[nfound] = strdup(e->d_name)) == NULL) {
            found = nf ? nf : found;
            rc = ep_err_set(err, "%s: out of memory", m->dir);
            break;
        }
        found = nf;
        nfound++;
    }
    closedir(d);
    if (rc == 0 && nfound == 0)
        rc = ep_err_set(
            err, "%s: no " ST_INDEX_NAME ", no " ST_SINGLE_NAME " and no *" ST_SUFFIX " file",
            m->dir);
    if (rc == 0 && nfound > 1) {
        qsort(found, nfound, sizeof *found, st_cmp_str);
        char list[512] = "";
        for (size_t i = 0, k = 0; i < nfound && i < 4 && k < sizeof list; i++)
            k += (size_t)snprintf(list + k, sizeof list - k, "%s%s", i ? ", " : "", found[i]);
        rc = ep_err_set(err,
                        "%s: no " ST_INDEX_NAME " or " ST_SINGLE_NAME ", and %zu *" ST_SUFFIX
                        " files (%s%s) where exactly one was expected",
                        m->dir, nfound, list, nfound > 4 ? ", ..." : "");
    }
    if (rc == 0)
        rc = st_join(path, cap, m->dir, found[0], err);
    for (size_t i = 0; i < nfound; i++)
        free(found[i]);
    free(found);
    return rc;
}

static int st_model_load_single(st_model *m, ep_err *err)
{
    char path[EP_MAX_PATH];
    struct stat sb;
    if (st_join(path, sizeof path, m->dir, ST_SINGLE_NAME, err) != 0)
        return -1;
    if (stat(path, &sb) != 0 && st_model_find_single(m, path, sizeof path, err) != 0)
        return -1;
    st_file *f = st_open(path, err);
    if (f == NULL)
        return -1;
    if (st_model_add_file(m, f) != 0) {
        st_close(&f);
        return ep_err_set(err, "%s: out of memory", path);
    }
    m->by_name = calloc(f->count ? (size_t)f->count : 1, sizeof *m->by_name);
    if (m->by_name == NULL)
        return ep_err_set(err, "%s: out of memory", path);
    for (int i = 0; i < f->count; i++)
        m->by_name[m->count++] = &f->tensors[i];
    return 0;
}

static int st_cmp_tensor_name(const void *a, const void *b)
{
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    return strcmp(x->name, y->name);
}

st_model *st_model_open(const char *dir, ep_err *err)
{
    st_model *m = calloc(1, sizeof *m);
    if (m == NULL || (m->dir = strdup(dir)) == NULL) {
        free(m);
        ep_err_set(err, "%s: out of memory", dir);
        return NULL;
    }
    char ipath[EP_MAX_PATH];
    struct stat sb;
    if (st_join(ipath, sizeof ipath, dir, ST_INDEX_NAME, err) != 0)
        goto fail;
    if (stat(ipath, &sb) == 0) {
        if (st_model_load_index(m, ipath, err) != 0)
            goto fail;
    } else if (errno != ENOENT) {
        ep_err_errno(err, "%s", ipath);
        goto fail;
    } else if (st_model_load_single(m, err) != 0) {
        goto fail;
    }
    qsort(m->by_name, (size_t)m->count, sizeof *m->by_name, st_cmp_tensor_name);
    if (st_table_init(&m->table, (size_t)m->count) != 0) {
        ep_err_set(err, "%s: out of memory", dir);
        goto fail;
    }
    for (int i = 0; i < m->count; i++) {
        /* Index keys are unique (JSON_REJECT_DUPLICATES) and so are one file's names. */
        if (st_table_put(&m->table, m->by_name[i]) != NULL) {
            ep_err_set(err, "%s: duplicate tensor name \"%s\"", dir, m->by_name[i]->name);
            goto fail;
        }
    }
    return m;

fail:
    st_model_close(&m);
    return NULL;
}

void st_model_close(st_model **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    st_model *m = *self_p;
    for (int i = 0; i < m->nfiles; i++)
        st_close(&m->files[i]);
    free(m->files);
    free(m->by_name);
    st_table_free(&m->table);
    free(m->dir);
    free(m);
    *self_p = NULL;
}

bool st_model_has_files(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return false;
    bool found = false;
    struct dirent *e;
    while (!found && (e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        found = strcmp(e->d_name, ST_INDEX_NAME) == 0 ||
                (n > 12 && strcmp(e->d_name + n - 12, ".safetensors") == 0);
    }
    closedir(d);
    return found;
}

int st_model_nfiles(const st_model *m)
{
    return m->nfiles;
}

void st_model_print(const st_model *m, int i, st_file_print *out)
{
    const st_file *f = m->files[i];
    size_t dl = strlen(m->dir);
    const char *rel =
        strncmp(f->path, m->dir, dl) == 0 && f->path[dl] == '/' ? f->path + dl + 1 : f->path;
    snprintf(out->name, sizeof out->name, "%s", rel);
    out->size = f->map_len;
    out->mtime_ns = f->mtime_ns;
    out->header_hash = f->header_hash;
}

static const char *st_time_text(int64_t ns, char *buf, size_t cap)
{
    time_t sec = (time_t)(ns / 1000000000);
    struct tm tm;
    if (gmtime_r(&sec, &tm) == NULL || strftime(buf, cap, "%Y-%m-%dT%H:%M:%S", &tm) == 0)
        snprintf(buf, cap, "%lld", (long long)sec);
    size_t n = strlen(buf);
    snprintf(buf + n, cap - n, ".%09lldZ", (long long)(ns % 1000000000));
    return buf;
}

int st_model_check_prints(const st_model *m, const st_file_print *want, int n, ep_err *err)
{
    const char *hint = "the checkpoint changed since the coordinator started (regenerated, "
                       "truncated, or copied without keeping modification times): restore it, or "
                       "restart the coordinator to serve the new one";
    if (n != m->nfiles)
        return ep_err_set(err,
                          "%s: %d safetensors files here, the coordinator's checkpoint has %d; %s",
                          m->dir, m->nfiles, n, hint);
    for (int i = 0; i < n; i++) {
        st_file_print got;
        int j = 0;
        while (j < m->nfiles) {
            st_model_print(m, j, &got);
            if (strcmp(got.name, want[i].name) == 0)
                break;
            j++;
        }
        char a[48], b[48];
        if (j == m->nfiles)
            return ep_err_set(err, "%s: file %s of the coordinator's checkpoint is not here; %s",
                              m->dir, want[i].name, hint);
        if (got.size != want[i].size)
            return ep_err_set(err, "%s/%s: %llu bytes here, %llu at the coordinator; %s", m->dir,
                              got.name, (unsigned long long)got.size,
                              (unsigned long long)want[i].size, hint);
        if (got.mtime_ns != want[i].mtime_ns)
            return ep_err_set(err, "%s/%s: modified %s here, %s at the coordinator; %s", m->dir,
                              got.name, st_time_text(got.mtime_ns, a, sizeof a),
                              st_time_text(want[i].mtime_ns, b, sizeof b), hint);
        if (got.header_hash != want[i].header_hash)
            return ep_err_set(err,
                              "%s/%s: header hash %016llx here, %016llx at the coordinator; %s",
                              m->dir, got.name, (unsigned long long)got.header_hash,
                              (unsigned long long)want[i].header_hash, hint);
    }
    return 0;
}

int st_model_count(const st_model *m)
{
    return m->count;
}

const st_tensor *st_model_at(const st_model *m, int i)
{
    if (i < 0 || i >= m->count)
        return NULL;
    return m->by_name[i];
}

const st_tensor *st_model_find(const st_model *m, const char *name)
{
    return st_table_get(&m->table, name);
}

const char *st_model_dir(const st_model *m)
{
    return m->dir;
}

/* ---- writing ----------------------------------------------------------------------------------
 */

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
    if ((uint64_t)numel > room / st_dtypes[dt].size)
        return ep_err_set(err, "tensor \"%s\": %lld elements overflow the file's byte offsets",
                          name, (long long)numel);
    *nbytes = (uint64_t)numel * st_dtypes[dt].size;
    return 0;
}

static json_t *st_writer_entry(st_dtype dt, int ndim, const int64_t *shape, uint64_t begin,
                               uint64_t end)
{
    json_t *e = json_object(), *s = json_array(), *o = json_array();
    bool ok = e && s && o && json_object_set_new(e, "dtype", json_string(st_dtypes[dt].name)) == 0;
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
