/*
 * safetensors_model.c — a checkpoint directory, sharded or not, and its fingerprint (see
 * safetensors_model.h).
 *
 * Sharded checkpoints: the model's tensors are exactly the names of the index's weight_map.
 * A tensor present in a shard but absent from the index is ignored (counted in a debug line):
 * the index is what loaders (transformers, vLLM) treat as the list of weights, and taking only
 * it keeps one unambiguous owner per name even if two shards carry a stray copy. The names of
 * all files go into one table of the reader's kind (safetensors_internal.h); the fingerprint
 * reads what st_open recorded of each file (size, mtime, header hash).
 */
#include "common/safetensors_model.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>

#include "common/log.h"
#include "common/rfile.h"
#include "common/safetensors_internal.h"

/* model.safetensors.index.json is read whole into memory. Real indexes are a few MB (one line
 * per tensor); the header bound is a generous ceiling that keeps a stray huge file out. */
#define ST_MAX_INDEX_BYTES ST_MAX_HEADER_BYTES

#define ST_INDEX_NAME  "model.safetensors.index.json"
#define ST_SINGLE_NAME "model.safetensors"
#define ST_SUFFIX      ".safetensors"

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
