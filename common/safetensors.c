/*
 * safetensors.c — reading one safetensors file (see safetensors.h, spec §2.1).
 *
 * st_open maps the file read-only (MAP_PRIVATE) and hands the image to st_parse, which
 * trusts nothing in it. The header is parsed by Jansson with duplicate keys rejected; every entry
 * is checked (types, dtype, dims, sizes, offsets) before anything derived from it is used, then
 * the tensors are sorted by data offset and neighbours checked for overlap. Gaps between tensors
 * are accepted (the reference writer never leaves any, but nothing breaks when there is one).
 * Names live in one arena; lookup is an open-addressing FNV-1a table sized at twice the count
 * (the checkpoint directory, safetensors_model.c, uses the same table for its names).
 *
 * A tensor's data pointer is not necessarily aligned: a header whose length is not a multiple
 * of 8 (legal, if unusual) puts the data region at any byte. Readers copy or use memcpy.
 * The mapping is MAP_PRIVATE over a file that must not be truncated while open (SIGBUS).
 */
#include "common/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/safetensors_internal.h"

/* Byte counts read from files are uint64_t and are used as size_t offsets into the mapping. */
_Static_assert(sizeof(size_t) >= sizeof(uint64_t), "epmoe needs a 64-bit size_t");

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

static uint64_t st_fnv1a(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

int st_table_init(st_table *t, size_t count)
{
    size_t cap = 2;
    while (cap < 2 * count)
        cap <<= 1;
    t->slots = calloc(cap, sizeof *t->slots);
    t->mask = cap - 1;
    return t->slots ? 0 : -1;
}

void st_table_free(st_table *t)
{
    free(t->slots);
    t->slots = NULL;
}

/* Insert x; returns NULL when inserted, or the tensor already holding that name. */
const st_tensor *st_table_put(st_table *t, const st_tensor *x)
{
    size_t i = (size_t)st_fnv1a((const uint8_t *)x->name, strlen(x->name)) & t->mask;
    for (; t->slots[i] != NULL; i = (i + 1) & t->mask) {
        if (strcmp(t->slots[i]->name, x->name) == 0)
            return t->slots[i];
    }
    t->slots[i] = x;
    return NULL;
}

const st_tensor *st_table_get(const st_table *t, const char *name)
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
