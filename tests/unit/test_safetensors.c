/*
 * test_safetensors.c — the safetensors reader, writer and checkpoint directories (spec §2.1).
 *
 * Expected bytes come from the format definition, not from the writer: hand-built images with
 * literal headers and little-endian data are read back; the writer's output is checked byte by
 * byte against the layout the spec prescribes (u64 LE length, compact JSON with __metadata__
 * first, space padding to a multiple of 8, data in insertion order). Every validation rule has
 * a broken image whose error message must name the file, the tensor and the numbers involved.
 * Files live under a fresh mkdtemp() directory that is removed at the end.
 */
#include <errno.h>
#include <ftw.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/safetensors_model.h"
#include "common/safetensors_writer.h"
#include "test.h"

static char tmp_root[64];

/* ---- helpers ---- */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void rm_rf(const char *path)
{
    nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* A fresh empty directory under the test root. */
static const char *fresh_dir(const char *name)
{
    static char buf[8][256];
    static int next;
    char *p = buf[next++ % 8];
    snprintf(p, 256, "%s/%s", tmp_root, name);
    rm_rf(p);
    mkdir(p, 0755);
    return p;
}

static const char *path_in(const char *dir, const char *file)
{
    static char buf[8][512];
    static int next;
    char *p = buf[next++ % 8];
    snprintf(p, 512, "%s/%s", dir, file);
    return p;
}

static void write_bytes(const char *path, const void *buf, size_t len)
{
    FILE *fp = fopen(path, "wb");
    if (fp == NULL) {
        perror(path);
        exit(2);
    }
    if (len > 0 && fwrite(buf, 1, len, fp) != len)
        exit(2);
    fclose(fp);
}

static uint8_t *read_bytes(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (fp == NULL)
        return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, fp) != (size_t)n)
        exit(2);
    fclose(fp);
    *len = (size_t)n;
    return buf;
}

static void put_u64le(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_u64le(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Image = u64 LE strlen(hdr) + hdr + data_len bytes (pattern b*7+1), as the spec lays it out. */
static uint8_t *mk_image(const char *hdr, size_t data_len, size_t *len)
{
    size_t n = strlen(hdr);
    *len = 8 + n + data_len;
    uint8_t *img = malloc(*len);
    put_u64le(img, n);
    memcpy(img + 8, hdr, n);
    for (size_t b = 0; b < data_len; b++)
        img[8 + n + b] = (uint8_t)(b * 7 + 1);
    return img;
}

/* Parse hdr + data_len bytes as file "bad.st"; returns 1 when it was refused (msg in err). */
static int refused(const char *hdr, size_t data_len, ep_err *err)
{
    size_t len;
    uint8_t *img = mk_image(hdr, data_len, &len);
    ep_err_clear(err);
    st_file *f = st_parse(img, len, "bad.st", err);
    int r = f == NULL;
    st_close(&f);
    free(img);
    return r;
}

/* ---- dtypes ---- */

/* Names and sizes as spec §2.1 lists them. */
static const struct {
    const char *name;
    size_t size;
} spec_dtypes[] = {
    {"BOOL", 1}, {"U8", 1},      {"I8", 1},      {"I16", 2},     {"U16", 2}, {"F16", 2},
    {"BF16", 2}, {"I32", 4},     {"U32", 4},     {"F32", 4},     {"F64", 8}, {"I64", 8},
    {"U64", 8},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1},
};
#define N_SPEC_DTYPES ((int)(sizeof spec_dtypes / sizeof spec_dtypes[0]))

/* Spec size of dt, found by its name (the name mapping is checked on its own below). */
static size_t spec_size(st_dtype dt)
{
    for (int i = 0; i < N_SPEC_DTYPES; i++) {
        if (strcmp(spec_dtypes[i].name, st_dtype_name(dt)) == 0)
            return spec_dtypes[i].size;
    }
    return 0;
}

TEST(dtype_names_sizes_and_refusals)
{
    ep_err err;
    CHECK_EQ(N_SPEC_DTYPES, ST_DTYPE_COUNT);
    int seen[ST_DTYPE_COUNT] = {0};
    for (int i = 0; i < N_SPEC_DTYPES; i++) {
        st_dtype dt = ST_DTYPE_COUNT;
        CHECK_EQ(st_dtype_parse(spec_dtypes[i].name, &dt, &err), 0);
        if ((unsigned)dt >= ST_DTYPE_COUNT)
            continue;
        seen[dt]++;
        CHECK_STR_EQ(st_dtype_name(dt), spec_dtypes[i].name);
        CHECK_EQ(st_dtype_size(dt), spec_dtypes[i].size);
    }
    for (int i = 0; i < ST_DTYPE_COUNT; i++)
        CHECK_EQ(seen[i], 1);
    const char *unsupported[] = {"F4", "F6_E2M3", "F6_E3M2", "C64"};
    for (int i = 0; i < 4; i++) {
        st_dtype dt;
        ep_err_clear(&err);
        CHECK_EQ(st_dtype_parse(unsupported[i], &dt, &err), -1);
        CHECK_STR_HAS(err.msg, "unsupported dtype");
        CHECK_STR_HAS(err.msg, unsupported[i]);
    }
    const char *unknown[] = {"Q8", "bf16", "", "F8_E4M3FNUZ"};
    for (int i = 0; i < 4; i++) {
        st_dtype dt;
        ep_err_clear(&err);
        CHECK_EQ(st_dtype_parse(unknown[i], &dt, &err), -1);
        CHECK_STR_HAS(err.msg, "unknown dtype");
    }
}

/* ---- writer -> reader ---- */

static void fill_pattern(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i * 31u + seed * 7u + 3u);
}

TEST(roundtrip_every_dtype)
{
    const char *dir = fresh_dir("roundtrip");
    const char *path = path_in(dir, "rt.safetensors");
    st_writer *w = st_writer_create();
    ep_err err;
    char names[ST_DTYPE_COUNT + 3][32];
    uint8_t *bufs[ST_DTYPE_COUNT + 3];
    int64_t shapes[ST_DTYPE_COUNT + 3][3];
    int ndims[ST_DTYPE_COUNT + 3];
    st_dtype dts[ST_DTYPE_COUNT + 3];
    size_t sizes[ST_DTYPE_COUNT + 3];
    int n = 0;
    uint64_t total = 0;
    for (int d = 0; d < ST_DTYPE_COUNT + 3; d++, n++) {
        /* every dtype as [3, 5]; then a scalar, a 3-D tensor and a zero-size one (last, so the
         * offset order equals the insertion order) */
        dts[n] = d < ST_DTYPE_COUNT ? (st_dtype)d : d == ST_DTYPE_COUNT ? ST_F32 : ST_I64;
        if (d == ST_DTYPE_COUNT + 2)
            dts[n] = ST_BF16;
        int64_t *s = shapes[n];
        if (d < ST_DTYPE_COUNT) {
            ndims[n] = 2, s[0] = 3, s[1] = 5;
        } else if (d == ST_DTYPE_COUNT) {
            ndims[n] = 0;
        } else if (d == ST_DTYPE_COUNT + 1) {
            ndims[n] = 3, s[0] = 2, s[1] = 3, s[2] = 4;
        } else {
            ndims[n] = 2, s[0] = 0, s[1] = 4;
        }
        size_t numel = 1;
        for (int k = 0; k < ndims[n]; k++)
            numel *= (size_t)s[k];
        sizes[n] = numel * spec_size(dts[n]);
        snprintf(names[n], sizeof names[n], "t%d.%s", d, st_dtype_name(dts[n]));
        bufs[n] = malloc(sizes[n] + 1);
        fill_pattern(bufs[n], sizes[n], (unsigned)d);
        CHECK_EQ(st_writer_add(w, names[n], dts[n], ndims[n], s, bufs[n], &err), 0);
        total += sizes[n];
    }
    CHECK_EQ(st_writer_bytes(w), total);
    CHECK_EQ(st_writer_write(w, path, &err), 0);
    st_writer_destroy(&w);
    CHECK(w == NULL);

    st_file *f = st_open(path, &err);
    CHECK(f != NULL);
    if (f == NULL) {
        printf("  %s\n", err.msg);
        return;
    }
    CHECK_STR_EQ(st_file_path(f), path);
    CHECK_EQ(st_count(f), n);
    for (int i = 0; i < n; i++) {
        const st_tensor *t = st_find(f, names[i]);
        CHECK(t != NULL);
        if (t == NULL)
            continue;
        CHECK(st_at(f, i) == t); /* offsets ascend in insertion order */
        CHECK_STR_EQ(t->name, names[i]);
        CHECK_EQ(t->dtype, dts[i]);
        CHECK_EQ(t->ndim, ndims[i]);
        int64_t numel = 1;
        for (int k = 0; k < ndims[i]; k++) {
            CHECK_EQ(t->shape[k], shapes[i][k]);
            numel *= shapes[i][k];
        }
        CHECK_EQ(t->numel, numel);
        CHECK_EQ(t->nbytes, sizes[i]);
        CHECK(t->file == f);
        CHECK(sizes[i] == 0 || memcmp(t->data, bufs[i], sizes[i]) == 0);
        free(bufs[i]);
    }
    CHECK(st_at(f, -1) == NULL);
    CHECK(st_at(f, n) == NULL);
    st_close(&f);
    CHECK(f == NULL);
    st_close(&f); /* tolerates NULL */
}

TEST(handbuilt_file_is_read)
{
    /* Written by hand: keys not in offset order, __metadata__ in the middle, a header length
     * that is not a multiple of 8 (so the data starts unaligned), a scalar. */
    const char *hdr = "{\"b\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[8,24]},"
                      "\"__metadata__\":{\"format\":\"pt\",\"note\":\"by hand\"},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"s\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[24,26]}}";
    static const uint8_t data[26] = {
        0x00, 0x00, 0xC0, 0x3F, 0x00, 0x00, 0x00, 0xC0, /* 1.5f, -2.0f */
        0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* 1 */
        0xFD, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, /* -3 */
        0x80, 0x3F,                                     /* bf16 1.0 */
    };
    size_t n = strlen(hdr);
    CHECK((8 + n) % 8 != 0);
    size_t len = 8 + n + sizeof data;
    uint8_t *img = malloc(len);
    put_u64le(img, n);
    memcpy(img + 8, hdr, n);
    memcpy(img + 8 + n, data, sizeof data);
    const char *dir = fresh_dir("hand");
    const char *path = path_in(dir, "hand.safetensors");
    write_bytes(path, img, len);

    ep_err err;
    for (int via_file = 0; via_file < 2; via_file++) {
        st_file *f = via_file ? st_open(path, &err) : st_parse(img, len, "hand", &err);
        CHECK(f != NULL);
        if (f == NULL) {
            printf("  %s\n", err.msg);
            continue;
        }
        CHECK_EQ(st_count(f), 3);
        const st_tensor *a = st_find(f, "a"), *b = st_find(f, "b"), *s = st_find(f, "s");
        CHECK(a && b && s);
        if (a && b && s) {
            CHECK(st_at(f, 0) == a && st_at(f, 1) == b && st_at(f, 2) == s);
            float fv[2];
            int64_t iv[2];
            uint16_t sv;
            memcpy(fv, a->data, sizeof fv);
            memcpy(iv, b->data, sizeof iv);
            memcpy(&sv, s->data, sizeof sv);
            CHECK(fv[0] == 1.5f && fv[1] == -2.0f);
            CHECK_EQ(iv[0], 1);
            CHECK_EQ(iv[1], -3);
            CHECK_EQ(sv, 0x3F80);
            CHECK_EQ(a->dtype, ST_F32);
            CHECK_EQ(b->dtype, ST_I64);
            CHECK_EQ(s->dtype, ST_BF16);
            CHECK_EQ(s->ndim, 0);
            CHECK_EQ(s->numel, 1);
            CHECK_EQ(s->nbytes, 2);
            CHECK_EQ(a->shape[0], 2);
            CHECK_EQ(b->nbytes, 16);
        }
        CHECK(st_find(f, "__metadata__") == NULL);
        st_close(&f);
    }
    free(img);
}

TEST(lenient_layouts_are_accepted)
{
    ep_err err;
    /* a gap between tensors, unused bytes after the last one, whitespace around the JSON,
     * zero-size tensors at a tensor boundary and sharing an offset, an empty header */
    const char *ok[] = {
        "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
        "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[8,12]}}",
        "\n  {\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}      ",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]},"
        "\"y\":{\"dtype\":\"F32\",\"shape\":[3,0],\"data_offsets\":[8,8]},"
        "\"x\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}",
        "{}",
        "{\"__metadata__\":{}}",
    };
    for (int i = 0; i < 5; i++) {
        size_t len;
        uint8_t *img = mk_image(ok[i], 16, &len);
        st_file *f = st_parse(img, len, "ok.st", &err);
        CHECK(f != NULL);
        if (f == NULL)
            printf("  case %d: %s\n", i, err.msg);
        if (f != NULL && i == 2) {
            /* zero-size ties are ordered by name after the offset */
            CHECK_STR_EQ(st_at(f, 0)->name, "x");
            CHECK_STR_EQ(st_at(f, 1)->name, "a");
            CHECK_STR_EQ(st_at(f, 2)->name, "y");
            CHECK_STR_EQ(st_at(f, 3)->name, "z");
        }
        st_close(&f);
        free(img);
    }
}

TEST(written_file_layout)
{
    const char *dir = fresh_dir("layout");
    ep_err err;
    /* names of length 1..8 move the header length through every residue mod 8 */
    for (int nl = 1; nl <= 8; nl++) {
        char name[16], path[512], expect[256];
        memset(name, 'n', (size_t)nl);
        name[nl] = '\0';
        snprintf(path, sizeof path, "%s/l%d.safetensors", dir, nl);
        float x[3] = {1.0f, 2.0f, -0.5f};
        uint8_t y[5] = {9, 8, 7, 6, 5};
        int64_t sx[1] = {3}, sy[1] = {5};
        st_writer *w = st_writer_create();
        CHECK_EQ(st_writer_add(w, name, ST_F32, 1, sx, x, &err), 0);
        CHECK_EQ(st_writer_add(w, "y", ST_U8, 1, sy, y, &err), 0);
        CHECK_EQ(st_writer_write(w, path, &err), 0);
        st_writer_destroy(&w);

        size_t len;
        uint8_t *img = read_bytes(path, &len);
        CHECK(img != NULL);
        if (img == NULL)
            continue;
        uint64_t n = get_u64le(img);
        snprintf(expect, sizeof expect,
                 "{\"__metadata__\":{\"format\":\"pt\"},"
                 "\"%s\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]},"
                 "\"y\":{\"dtype\":\"U8\",\"shape\":[5],\"data_offsets\":[12,17]}}",
                 name);
        size_t el = strlen(expect);
        CHECK_EQ((8 + n) % 8, 0);
        CHECK(n >= el && n < el + 8);
        CHECK_EQ(len, 8 + n + 17);
        if (n >= el && len == 8 + n + 17) {
            CHECK(memcmp(img + 8, expect, el) == 0);
            for (size_t i = 8 + el; i < 8 + n; i++)
                CHECK_EQ(img[i], ' ');
            CHECK(memcmp(img + 8 + n, x, 12) == 0);
            CHECK(memcmp(img + 8 + n + 12, y, 5) == 0);
        }
        free(img);
        char tmp[520];
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        CHECK(access(tmp, F_OK) != 0);

        /* the mapping is page aligned, so the first tensor's data is 8-byte aligned */
        st_file *f = st_open(path, &err);
        CHECK(f != NULL);
        if (f != NULL)
            CHECK_EQ((uintptr_t)st_at(f, 0)->data % 8, 0);
        st_close(&f);
    }
}

TEST(writer_refuses_bad_tensors)
{
    ep_err err;
    st_writer *w = st_writer_create();
    int64_t s2[2] = {2, 2}, neg[2] = {2, -1}, big[3] = {INT64_MAX, 2, 1};
    int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    uint8_t d[16] = {0};
    CHECK_EQ(st_writer_add(w, "a", ST_U8, 2, s2, d, &err), 0);
    CHECK_EQ(st_writer_add(w, "a", ST_U8, 2, s2, d, &err), -1);
    CHECK_STR_HAS(err.msg, "duplicate");
    CHECK_STR_HAS(err.msg, "\"a\"");
    CHECK_EQ(st_writer_add(w, "__metadata__", ST_U8, 2, s2, d, &err), -1);
    CHECK_STR_HAS(err.msg, "reserved");
    CHECK_EQ(st_writer_add(w, "n", ST_U8, 2, neg, d, &err), -1);
    CHECK_STR_HAS(err.msg, "negative");
    CHECK_EQ(st_writer_add(w, "o", ST_U8, 2, big, d, &err), -1);
    CHECK_STR_HAS(err.msg, "overflow");
    CHECK_EQ(st_writer_add(w, "nine", ST_U8, 9, nine, d, &err), -1);
    CHECK_STR_HAS(err.msg, "9 dimensions");
    CHECK_EQ(st_writer_add(w, "dt", (st_dtype)99, 2, s2, d, &err), -1);
    CHECK_STR_HAS(err.msg, "dtype");
    CHECK_EQ(st_writer_add(w, "null", ST_U8, 2, s2, NULL, &err), -1);
    CHECK_STR_HAS(err.msg, "NULL");
    CHECK_EQ(st_writer_add(w, "bad\xff", ST_U8, 2, s2, d, &err), -1);
    CHECK_STR_HAS(err.msg, "UTF-8");
    CHECK_EQ(st_writer_bytes(w), 4); /* only "a" went in */
    CHECK_EQ(st_writer_write(w, "/nonexistent-epmoe-dir/x.safetensors", &err), -1);
    CHECK_STR_HAS(err.msg, "/nonexistent-epmoe-dir/x.safetensors.tmp");
    st_writer_destroy(&w);
    st_writer_destroy(&w);
}

/* ---- validation ---- */

TEST(truncated_files_are_refused)
{
    const char *dir = fresh_dir("trunc");
    const char *path = path_in(dir, "full.safetensors");
    ep_err err;
    st_writer *w = st_writer_create();
    int64_t s[1] = {8};
    float v[8] = {0};
    CHECK_EQ(st_writer_add(w, "w", ST_F32, 1, s, v, &err), 0);
    CHECK_EQ(st_writer_write(w, path, &err), 0);
    st_writer_destroy(&w);
    size_t len;
    uint8_t *img = read_bytes(path, &len);
    if (img == NULL)
        return;
    uint64_t n = get_u64le(img);
    struct {
        size_t cut;
        const char *needle;
    } cuts[] = {
        {0, "shorter than the 8-byte"},
        {3, "shorter than the 8-byte"},
        {7, "shorter than the 8-byte"},
        {8, "extends past the end"},
        {8 + n / 2, "extends past the end"},
        {8 + n - 1, "extends past the end"},
        {8 + n, "end past the data region"},
        {8 + n + 5, "end past the data region of 5"},
        {len - 1, "end past the data region of 31"},
    };
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        ep_err_clear(&err);
        st_file *f = st_parse(img, cuts[i].cut, "cut.st", &err);
        CHECK(f == NULL);
        st_close(&f);
        CHECK_STR_HAS(err.msg, "cut.st: ");
        CHECK_STR_HAS(err.msg, cuts[i].needle);
        if (cuts[i].cut >= 8 + n)
            CHECK_STR_HAS(err.msg, "tensor \"w\"");
    }
    /* the same through st_open: an empty file and a cut one */
    const char *p0 = path_in(dir, "empty.safetensors");
    write_bytes(p0, img, 0);
    st_file *f = st_open(p0, &err);
    CHECK(f == NULL);
    CHECK_STR_HAS(err.msg, p0);
    CHECK_STR_HAS(err.msg, "shorter");
    const char *p1 = path_in(dir, "cut.safetensors");
    write_bytes(p1, img, 8 + n + 4);
    f = st_open(p1, &err);
    CHECK(f == NULL);
    CHECK_STR_HAS(err.msg, p1);
    CHECK_STR_HAS(err.msg, "end past the data region of 4 bytes");
    free(img);
}

TEST(bad_header_lengths_are_refused)
{
    uint8_t img[64];
    memset(img, ' ', sizeof img);
    ep_err err;
    struct {
        uint64_t n;
        const char *needle;
    } cases[] = {
        {UINT64_MAX, "header length 18446744073709551615 exceeds the limit of 100000000"},
        {(uint64_t)ST_MAX_HEADER_BYTES + 1, "exceeds the limit"},
        {ST_MAX_HEADER_BYTES, "extends past the end of the file (8 + 100000000 > 64 bytes)"},
        {57, "extends past the end"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        put_u64le(img, cases[i].n);
        st_file *f = st_parse(img, sizeof img, "len.st", &err);
        CHECK(f == NULL);
        st_close(&f);
        CHECK_STR_HAS(err.msg, "len.st: ");
        CHECK_STR_HAS(err.msg, cases[i].needle);
    }
}

TEST(malformed_json_is_refused_with_line_and_column)
{
    ep_err err;
    CHECK(refused("{\"a\": {\"dtype\": \"F32\",", 0, &err));
    CHECK_STR_HAS(err.msg, "bad.st: header JSON line 1 column");
    CHECK(refused("{\"a\": {\"dtype\": \"U8\",\n  \"shape\": [1,, 2]}}", 0, &err));
    CHECK_STR_HAS(err.msg, "bad.st: header JSON line 2 column 15");
    CHECK(refused("{} trailing", 0, &err));
    CHECK_STR_HAS(err.msg, "header JSON line 1");
    CHECK(refused("{\"\xff\": 1}", 0, &err));
    CHECK_STR_HAS(err.msg, "header JSON");
    CHECK(refused("", 0, &err));
    CHECK_STR_HAS(err.msg, "header JSON");
    CHECK(refused("{\"a\": {\"dtype\": \"U8\", \"shape\": [99999999999999999999], "
                  "\"data_offsets\": [0, 1]}}",
                  1, &err));
    CHECK_STR_HAS(err.msg, "header JSON");
    CHECK(refused("[1, 2]", 0, &err));
    CHECK_STR_HAS(err.msg, "bad.st: header JSON is not an object");
}

TEST(bad_entries_are_refused_naming_the_tensor)
{
    ep_err err;
    struct {
        const char *hdr;
        const char *needle;
    } cases[] = {
        {"{\"w\": [1, 2]}", "entry is not an object"},
        {"{\"w\": 5}", "entry is not an object"},
        {"{\"w\": {\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"foo\":1}}",
         "unexpected key \"foo\""},
        {"{\"w\": {\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", "missing \"shape\""},
        {"{\"w\": {\"shape\":[1],\"data_offsets\":[0,1]}}", "missing \"dtype\""},
        {"{\"w\": {\"dtype\":\"U8\",\"shape\":[1]}}", "missing \"data_offsets\""},
        {"{\"w\": {\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,1]}}",
         "\"dtype\" must be a string"},
        {"{\"w\": {\"dtype\":\"U8\",\"shape\":\"1\",\"data_offsets\":[0,1]}}",
         "\"shape\" must be an array"},
        {"{\"w\": {\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}",
         "shape[0] is not an integer"},
        {"{\"w\": {\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", "two integers"},
        {"{\"w\": {\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", "two integers"},
        {"{\"w\": {\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,\"1\"]}}", "two integers"},
        {"{\"w\": {\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", "negative"},
        {"{\"w\": {\"dtype\":\"Q8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
         "unknown dtype \"Q8\""},
        {"{\"w\": {\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,1]}}",
         "unsupported dtype \"F4\""},
        {"{\"w\": {\"dtype\":\"C64\",\"shape\":[1],\"data_offsets\":[0,8]}}",
         "unsupported dtype \"C64\""},
        {"{\"w\": {\"dtype\":\"U8\",\"shape\":[2,-3],\"data_offsets\":[0,1]}}",
         "shape[1] is -3, negative"},
        {"{\"w\": {\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}",
         "shape has 9 dimensions, more than the limit of 8"},
        {"{\"w\": {\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,1]}}",
         "more elements than fit in 64 bits"},
        {"{\"w\": {\"dtype\":\"U8\",\"shape\":[0,4294967296,4294967296,4294967296],"
         "\"data_offsets\":[0,1]}}",
         "0 bytes but data_offsets [0, 1] span 1 bytes"},
        {"{\"w\": {\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,1]}}",
         "overflow a 64-bit byte count"},
        {"{\"w\": {\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}",
         "shape [2, 3] x F32 is 24 bytes but data_offsets [0, 20] span 20 bytes"},
        {"{\"w\": {\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[8,4]}}", "begin > end"},
        {"{\"w\": {\"dtype\":\"F32\",\"shape\":[10],\"data_offsets\":[0,40]}}",
         "data_offsets [0, 40] end past the data region of 32 bytes"},
        {"{\"w\": {\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[32,33]}}",
         "end past the data region"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK(refused(cases[i].hdr, 32, &err));
        CHECK_STR_HAS(err.msg, "bad.st: tensor \"w\"");
        CHECK_STR_HAS(err.msg, cases[i].needle);
    }
}

TEST(overlaps_duplicates_and_metadata_are_refused)
{
    ep_err err;
    CHECK(refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                  16, &err));
    CHECK_STR_HAS(err.msg, "bad.st: tensors \"a\" [0, 8) and \"b\" [4, 12) overlap");
    /* the overlap is found whatever the header order, and across a small tensor between */
    CHECK(refused("{\"c\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[12,14]},"
                  "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]},"
                  "\"a\":{\"dtype\":\"U8\",\"shape\":[16],\"data_offsets\":[0,16]}}",
                  16, &err));
    CHECK_STR_HAS(err.msg, "tensors \"a\" [0, 16) and \"b\" [2, 4) overlap");
    CHECK(refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[16],\"data_offsets\":[0,16]},"
                  "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]},"
                  "\"c\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[12,14]}}",
                  16, &err));
    CHECK_STR_HAS(err.msg, "overlap");
    CHECK(refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}",
                  16, &err));
    CHECK_STR_HAS(err.msg, "tensors \"a\" [0, 8) and \"z\" [4, 4) overlap");
    CHECK(refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
                  16, &err));
    CHECK_STR_HAS(err.msg, "bad.st: header JSON");
    CHECK_STR_HAS(err.msg, "duplicate");
    CHECK_STR_HAS(err.msg, "\"a\"");
    CHECK(refused("{\"__metadata__\":{\"format\":1}}", 0, &err));
    CHECK_STR_HAS(err.msg, "bad.st: \"__metadata__\" value for \"format\" is not a string");
    CHECK(refused("{\"__metadata__\":[\"pt\"]}", 0, &err));
    CHECK_STR_HAS(err.msg, "\"__metadata__\" is not an object");
    char hdr[512];
    char longname[301];
    memset(longname, 'x', 300);
    longname[300] = '\0';
    snprintf(hdr, sizeof hdr, "{\"%s\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
             longname);
    CHECK(refused(hdr, 1, &err));
    CHECK_STR_HAS(err.msg, "300 bytes, longer than the limit of 255");
}

TEST(open_errors_name_the_path)
{
    ep_err err;
    const char *dir = fresh_dir("openerr");
    const char *missing = path_in(dir, "missing.safetensors");
    st_file *f = st_open(missing, &err);
    CHECK(f == NULL);
    CHECK_STR_HAS(err.msg, missing);
    CHECK_STR_HAS(err.msg, "No such file");
    f = st_open(dir, &err);
    CHECK(f == NULL);
    CHECK_STR_HAS(err.msg, "not a regular file");
}

/* ---- lookup ---- */

TEST(absent_names_are_not_found)
{
    ep_err err;
    size_t len;
    uint8_t *img = mk_image(
        "{\"layers.0.w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, &len);
    st_file *f = st_parse(img, len, "find", &err);
    CHECK(f != NULL);
    if (f != NULL) {
        CHECK(st_find(f, "layers.0.w") != NULL);
        CHECK(st_find(f, "layers.0.") == NULL);
        CHECK(st_find(f, "layers.0.ww") == NULL);
        CHECK(st_find(f, "") == NULL);
        CHECK(st_find(f, "__metadata__") == NULL);
        CHECK(st_find(f, NULL) == NULL);
    }
    st_close(&f);
    free(img);
    img = mk_image("{}", 0, &len);
    f = st_parse(img, len, "empty", &err);
    CHECK(f != NULL);
    if (f != NULL) {
        CHECK_EQ(st_count(f), 0);
        CHECK(st_find(f, "x") == NULL);
        CHECK(st_at(f, 0) == NULL);
    }
    st_close(&f);
    free(img);
}

#define MANY 10000

static void many_name(char *buf, size_t cap, int i)
{
    snprintf(buf, cap, "layers.%d.ffn.experts.%d.w%d.%s", i / 768, (i / 3) % 256, i % 3 + 1,
             i % 2 ? "scale" : "weight");
}

TEST(ten_thousand_tensors_are_all_found)
{
    const char *dir = fresh_dir("many");
    const char *path = path_in(dir, "model.safetensors");
    ep_err err;
    st_writer *w = st_writer_create();
    for (int i = 0; i < MANY; i++) {
        char name[96];
        int32_t v = i * 3 + 1;
        many_name(name, sizeof name, i);
        int64_t s[1] = {1};
        if (st_writer_add(w, name, ST_I32, 1, s, &v, &err) != 0) {
            CHECK_STR_EQ(err.msg, "");
            break;
        }
    }
    CHECK_EQ(st_writer_write(w, path, &err), 0);
    st_writer_destroy(&w);
    st_file *f = st_open(path, &err);
    st_model *m = st_model_open(dir, &err);
    CHECK(f != NULL && m != NULL);
    if (f == NULL || m == NULL) {
        st_close(&f);
        st_model_close(&m);
        return;
    }
    CHECK_EQ(st_count(f), MANY);
    CHECK_EQ(st_model_count(m), MANY);
    int bad = 0;
    for (int i = 0; i < MANY; i++) {
        char name[96];
        many_name(name, sizeof name, i);
        const st_tensor *t = st_find(f, name), *u = st_model_find(m, name);
        int32_t v = -1, vm = -1;
        if (t != NULL)
            memcpy(&v, t->data, 4);
        if (u != NULL)
            memcpy(&vm, u->data, 4);
        if (t == NULL || u == NULL || strcmp(t->name, name) != 0 || v != i * 3 + 1 ||
            vm != i * 3 + 1 || st_at(f, i) != t)
            bad++;
        strcat(name, "x");
        if (st_find(f, name) != NULL || st_model_find(m, name) != NULL)
            bad++;
    }
    CHECK_EQ(bad, 0);
    /* st_model_at is sorted by name (strcmp order) */
    for (int i = 1; i < MANY; i++) {
        if (strcmp(st_model_at(m, i - 1)->name, st_model_at(m, i)->name) >= 0)
            bad++;
    }
    CHECK_EQ(bad, 0);
    st_close(&f);
    st_model_close(&m);
}

/* ---- checkpoint directories ---- */

/* Write a shard with tensors names[0..n), tensor i = U8 [4] of bytes seed+i. */
static void write_shard(const char *path, int n, const char *const *names, int seed)
{
    ep_err err;
    st_writer *w = st_writer_create();
    for (int i = 0; i < n; i++) {
        uint8_t d[4];
        memset(d, seed + i, sizeof d);
        int64_t s[1] = {4};
        CHECK_EQ(st_writer_add(w, names[i], ST_U8, 1, s, d, &err), 0);
    }
    CHECK_EQ(st_writer_write(w, path, &err), 0);
    st_writer_destroy(&w);
}

static const char *const shard1_names[] = {"layers.1.b", "layers.0.a"};
static const char *const shard2_names[] = {"embed.weight", "stray.not_indexed", "layers.1.a"};
static const char *const shard3_names[] = {"z.last"};
#define SH1 "model-00001-of-00003.safetensors"
#define SH2 "model-00002-of-00003.safetensors"
#define SH3 "model-00003-of-00003.safetensors"

static const char *make_sharded(const char *name)
{
    const char *dir = fresh_dir(name);
    write_shard(path_in(dir, SH1), 2, shard1_names, 10);
    write_shard(path_in(dir, SH2), 3, shard2_names, 20);
    write_shard(path_in(dir, SH3), 1, shard3_names, 30);
    return dir;
}

static void write_index(const char *dir, int n, const char *const *names, const char *const *files)
{
    ep_err err;
    CHECK_EQ(st_index_write(path_in(dir, "model.safetensors.index.json"), n, names, files,
                            4u * (unsigned)n, &err),
             0);
}

static const char *const idx_names[] = {"layers.0.a", "layers.1.b", "embed.weight", "layers.1.a",
                                        "z.last"};
static const char *const idx_files[] = {SH1, SH1, SH2, SH2, SH3};

TEST(sharded_model_via_index)
{
    const char *dir = make_sharded("sharded");
    write_index(dir, 5, idx_names, idx_files);

    /* the index as written: transformers' layout, checked with an independent JSON read */
    json_error_t jerr;
    json_t *root = json_load_file(path_in(dir, "model.safetensors.index.json"), 0, &jerr);
    CHECK(root != NULL);
    if (root != NULL) {
        json_t *ts = json_object_get(json_object_get(root, "metadata"), "total_size");
        CHECK(json_is_integer(ts) && json_integer_value(ts) == 20);
        json_t *wm = json_object_get(root, "weight_map");
        CHECK_EQ(json_object_size(wm), 5);
        for (int i = 0; i < 5; i++)
            CHECK_STR_EQ(json_string_value(json_object_get(wm, idx_names[i])), idx_files[i]);
        json_decref(root);
    }

    ep_err err;
    st_model *m = st_model_open(dir, &err);
    CHECK(m != NULL);
    if (m == NULL) {
        printf("  %s\n", err.msg);
        return;
    }
    CHECK_STR_EQ(st_model_dir(m), dir);
    CHECK_EQ(st_model_count(m), 5);
    static const char *const sorted[] = {"embed.weight", "layers.0.a", "layers.1.a", "layers.1.b",
                                         "z.last"};
    static const char *const shard_of[] = {SH2, SH1, SH2, SH1, SH3};
    static const int value_of[] = {20, 11, 22, 10, 30};
    for (int i = 0; i < 5; i++) {
        const st_tensor *t = st_model_at(m, i);
        CHECK(t != NULL);
        if (t == NULL)
            continue;
        CHECK_STR_EQ(t->name, sorted[i]);
        CHECK(st_model_find(m, sorted[i]) == t);
        CHECK_STR_EQ(st_file_path(t->file), path_in(dir, shard_of[i]));
        CHECK_EQ(t->nbytes, 4);
        CHECK_EQ(((const uint8_t *)t->data)[3], value_of[i]);
    }
    CHECK(st_model_at(m, 5) == NULL);
    /* a tensor in a shard but not in the index is ignored (documented choice) */
    CHECK(st_model_find(m, "stray.not_indexed") == NULL);
    CHECK(st_model_find(m, "absent") == NULL);
    CHECK(st_model_find(m, "") == NULL);
    st_model_close(&m);
    CHECK(m == NULL);
    st_model_close(&m);
}

TEST(sharded_model_errors)
{
    ep_err err;
    const char *dir = make_sharded("shard_err");
    const char *ipath = path_in(dir, "model.safetensors.index.json");

    /* a shard file that is missing */
    const char *f_missing[] = {SH1, SH1, SH2, SH2, "model-00009-of-00009.safetensors"};
    write_index(dir, 5, idx_names, f_missing);
    st_model *m = st_model_open(dir, &err);
    CHECK(m == NULL);
    CHECK_STR_HAS(err.msg, "shard \"model-00009-of-00009.safetensors\"");
    CHECK_STR_HAS(err.msg, "\"z.last\"");
    CHECK_STR_HAS(err.msg, "No such file");

    /* a name in the index that its shard does not hold */
    const char *n_ghost[] = {"layers.0.a", "ghost.weight"};
    const char *f_ghost[] = {SH1, SH2};
    write_index(dir, 2, n_ghost, f_ghost);
    m = st_model_open(dir, &err);
    CHECK(m == NULL);
    CHECK_STR_HAS(err.msg, "tensor \"ghost.weight\" is listed in shard \"" SH2 "\"");

    /* shard names that would leave the directory (written by hand: st_index_write refuses) */
    const char *escapes[] = {"../x.safetensors", "sub/model-00001-of-00003.safetensors", "..",
                             "/etc/passwd", ""};
    for (int i = 0; i < 5; i++) {
        char text[256];
        snprintf(text, sizeof text, "{\"metadata\":{},\"weight_map\":{\"layers.0.a\":\"%s\"}}",
                 escapes[i]);
        write_bytes(ipath, text, strlen(text));
        m = st_model_open(dir, &err);
        CHECK(m == NULL);
        CHECK_STR_HAS(err.msg, "not a plain file name");
        CHECK_STR_HAS(err.msg, "\"layers.0.a\"");
    }

    /* a broken shard is reported with its name */
    const char *broken = path_in(dir, SH3);
    write_bytes(broken, "\x05\0\0\0\0\0\0\0{}", 10);
    write_index(dir, 5, idx_names, idx_files);
    m = st_model_open(dir, &err);
    CHECK(m == NULL);
    CHECK_STR_HAS(err.msg, "shard \"" SH3 "\"");
    CHECK_STR_HAS(err.msg, "extends past the end");

    /* broken index files */
    struct {
        const char *text;
        const char *needle;
    } bad[] = {
        {"{\"weight_map\": {\n\"a\": }", "JSON line 2 column"},
        {"{\"metadata\": {}}", "\"weight_map\" is missing"},
        {"{\"weight_map\": {\"layers.0.a\": 3}}", "weight_map[\"layers.0.a\"] is not a file"},
        {"{\"weight_map\": {}, \"metadata\": 1}", "\"metadata\" is not an object"},
        {"[]", "not a JSON object"},
        {"{\"weight_map\": {\"a\": \"x\", \"a\": \"y\"}}", "duplicate"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_bytes(ipath, bad[i].text, strlen(bad[i].text));
        m = st_model_open(dir, &err);
        CHECK(m == NULL);
        CHECK_STR_HAS(err.msg, ipath);
        CHECK_STR_HAS(err.msg, bad[i].needle);
    }

    /* st_index_write refuses what st_model_open would refuse */
    const char *n2[] = {"a", "a"};
    const char *f2[] = {SH1, SH1};
    const char *f3[] = {"sub/x.safetensors"};
    CHECK_EQ(st_index_write(ipath, 2, n2, f2, 0, &err), -1);
    CHECK_STR_HAS(err.msg, "tensor \"a\": listed twice");
    CHECK_EQ(st_index_write(ipath, 1, n2, f3, 0, &err), -1);
    CHECK_STR_HAS(err.msg, "not a plain file name");
}

TEST(unsharded_directories)
{
    ep_err err;
    const char *one[] = {"w"};
    /* model.safetensors wins even beside other *.safetensors files */
    const char *dir = fresh_dir("single");
    write_shard(path_in(dir, "model.safetensors"), 1, one, 40);
    write_shard(path_in(dir, "other.safetensors"), 1, one, 50);
    st_model *m = st_model_open(dir, &err);
    CHECK(m != NULL);
    if (m != NULL) {
        CHECK_EQ(st_model_count(m), 1);
        CHECK_EQ(((const uint8_t *)st_model_find(m, "w")->data)[0], 40);
        CHECK_STR_EQ(st_file_path(st_model_at(m, 0)->file), path_in(dir, "model.safetensors"));
    }
    st_model_close(&m);

    /* exactly one *.safetensors file */
    dir = fresh_dir("lone");
    write_shard(path_in(dir, "weights.safetensors"), 1, one, 60);
    write_bytes(path_in(dir, "config.json"), "{}", 2);
    m = st_model_open(dir, &err);
    CHECK(m != NULL);
    if (m != NULL)
        CHECK_EQ(((const uint8_t *)st_model_find(m, "w")->data)[0], 60);
    st_model_close(&m);

    /* two candidates: the error lists what was found */
    dir = fresh_dir("two");
    write_shard(path_in(dir, "b.safetensors"), 1, one, 1);
    write_shard(path_in(dir, "a.safetensors"), 1, one, 2);
    m = st_model_open(dir, &err);
    CHECK(m == NULL);
    CHECK_STR_HAS(err.msg, dir);
    CHECK_STR_HAS(err.msg, "2 *.safetensors files (a.safetensors, b.safetensors)");

    /* nothing at all */
    dir = fresh_dir("none");
    write_bytes(path_in(dir, "config.json"), "{}", 2);
    mkdir(path_in(dir, "dir.safetensors"), 0755);
    m = st_model_open(dir, &err);
    CHECK(m == NULL);
    CHECK_STR_HAS(err.msg, "no model.safetensors.index.json, no model.safetensors and no");

    /* no such directory */
    m = st_model_open(path_in(tmp_root, "does-not-exist"), &err);
    CHECK(m == NULL);
    CHECK_STR_HAS(err.msg, "does-not-exist");
    CHECK_STR_HAS(err.msg, "No such file");
}

int main(void)
{
    snprintf(tmp_root, sizeof tmp_root, "/tmp/epmoe-st-XXXXXX");
    if (mkdtemp(tmp_root) == NULL) {
        perror("mkdtemp");
        return 2;
    }
    RUN(dtype_names_sizes_and_refusals);
    RUN(roundtrip_every_dtype);
    RUN(handbuilt_file_is_read);
    RUN(lenient_layouts_are_accepted);
    RUN(written_file_layout);
    RUN(writer_refuses_bad_tensors);
    RUN(truncated_files_are_refused);
    RUN(bad_header_lengths_are_refused);
    RUN(malformed_json_is_refused_with_line_and_column);
    RUN(bad_entries_are_refused_naming_the_tensor);
    RUN(overlaps_duplicates_and_metadata_are_refused);
    RUN(open_errors_name_the_path);
    RUN(absent_names_are_not_found);
    RUN(ten_thousand_tensors_are_all_found);
    RUN(sharded_model_via_index);
    RUN(sharded_model_errors);
    RUN(unsharded_directories);
    rm_rf(tmp_root);
    return test_report();
}
