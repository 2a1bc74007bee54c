/*
 * metrics.c — the registry and the text exposition format (see metrics.h).
 *
 * Series of a family are found through an open-addressing hash table keyed by the joined label
 * values (FNV-1a); each series keeps its rendered label set ({layer="3",worker="a0"}) so a scrape
 * of tens of thousands of series is one pass of string copies.
 */
#include "common/metrics.h"

#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const double mx_seconds_buckets[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                     0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                     1,      2.5,     5,      10,    30,     60};
const int mx_n_seconds_buckets = (int)(sizeof mx_seconds_buckets / sizeof mx_seconds_buckets[0]);

struct mx_series {
    mx_family *fam;
    char *key;    /* label values joined by \x1f (hash key) */
    char *labels; /* rendered: {a="x",b="y"}, "" without labels */
    double value; /* counter, gauge; histogram: sum */
    uint64_t count;
    uint64_t *bucket; /* [n_buckets] (not cumulative) */
};

struct mx_family {
    mx_registry *reg;
    mx_type type;
    char *name, *help;
    int n_labels;
    char *label[MX_MAX_LABELS];
    double bound[MX_MAX_BUCKETS];
    int n_buckets;
    mx_series **series; /* [n], in creation order */
    int n, cap;
    int *slot; /* hash table of series indices (-1: empty), [n_slots] */
    int n_slots;
};

struct mx_registry {
    pthread_mutex_t lock;
    mx_family **fam;
    int n, cap;
};

mx_registry *mx_create(ep_err *err)
{
    mx_registry *r = calloc(1, sizeof *r);
    if (r == NULL) {
        ep_err_set(err, "metrics: out of memory");
        return NULL;
    }
    pthread_mutex_init(&r->lock, NULL);
    return r;
}

static void mx_series_free(mx_series *s)
{
    if (s == NULL)
        return;
    free(s->key);
    free(s->labels);
    free(s->bucket);
    free(s);
}

static void mx_clear_locked(mx_family *f)
{
    for (int i = 0; i < f->n; i++)
        mx_series_free(f->series[i]);
    f->n = 0;
    for (int i = 0; i < f->n_slots; i++)
        f->slot[i] = -1;
}

static void mx_family_free(mx_family *f)
{
    mx_clear_locked(f);
    free(f->series);
    free(f->slot);
    free(f->name);
    free(f->help);
    for (int i = 0; i < f->n_labels; i++)
        free(f->label[i]);
    free(f);
}

void mx_destroy(mx_registry **self_p)
{
    mx_registry *r = self_p ? *self_p : NULL;
    if (r == NULL)
        return;
    for (int i = 0; i < r->n; i++)
        mx_family_free(r->fam[i]);
    free(r->fam);
    pthread_mutex_destroy(&r->lock);
    free(r);
    *self_p = NULL;
}

static bool mx_name_ok(const char *s, bool label)
{
    if (s == NULL || s[0] == '\0' || isdigit((unsigned char)s[0]))
        return false;
    for (const char *p = s; *p; p++)
        if (!(isalnum((unsigned char)*p) || *p == '_' || (!label && *p == ':')))
            return false;
    return !(label && strncmp(s, "__", 2) == 0);
}

mx_family *mx_family_new(mx_registry *r, mx_type type, const char *name, const char *help,
                         const char *labels, const double *buckets, int n_buckets)
{
    if (r == NULL || !mx_name_ok(name, false) || n_buckets < 0 || n_buckets > MX_MAX_BUCKETS)
        return NULL;
    mx_family *f = calloc(1, sizeof *f);
    if (f == NULL)
        return NULL;
    f->reg = r;
    f->type = type;
    f->name = strdup(name);
    f->help = strdup(help ? help : "");
    for (const char *p = labels; p && *p;) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        if (f->n_labels == MX_MAX_LABELS || (f->label[f->n_labels] = strndup(p, n)) == NULL ||
            !mx_name_ok(f->label[f->n_labels++], true) ||
            (type == MX_HISTOGRAM && strcmp(f->label[f->n_labels - 1], "le") == 0)) {
            mx_family_free(f);
            return NULL;
        }
        p = comma ? comma + 1 : p + n;
    }
    if (type == MX_HISTOGRAM) {
        for (int i = 0; i < n_buckets; i++)
            f->bound[i] = buckets[i];
        f->n_buckets = n_buckets;
    }
    if (f->name == NULL || f->help == NULL) {
        mx_family_free(f);
        return NULL;
    }
    pthread_mutex_lock(&r->lock);
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 32;
        mx_family **g = realloc(r->fam, (size_t)cap * sizeof *g);
        if (g == NULL) {
            pthread_mutex_unlock(&r->lock);
            mx_family_free(f);
            return NULL;
        }
        r->fam = g;
        r->cap = cap;
    }
    r->fam[r->n++] = f;
    pthread_mutex_unlock(&r->lock);
    return f;
}

mx_family *mx_family_s(mx_registry *r, mx_type type, const char *name, const char *help,
                       const char *labels)
{
    return mx_family_new(r, type, name, help, labels, mx_seconds_buckets,
                         type == MX_HISTOGRAM ? mx_n_seconds_buckets : 0);
}

static uint64_t mx_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* A label value escaped for the exposition format into out (NULL: only count); its length. */
static size_t mx_escape(char *out, const char *v)
{
    size_t n = 0;
    for (; *v; v++) {
        const char *rep = *v == '\\' ? "\\\\" : *v == '"' ? "\\\"" : *v == '\n' ? "\\n" : NULL;
        if (rep != NULL) {
            if (out)
                memcpy(out + n, rep, 2);
            n += 2;
        } else {
            if (out)
                out[n] = *v;
            n++;
        }
    }
    return n;
}

static char *mx_render_labels(const mx_family *f, const char *const *values)
{
    if (f->n_labels == 0)
        return strdup("");
    size_t n = 2;
    for (int i = 0; i < f->n_labels; i++)
        n += strlen(f->label[i]) + 4 + mx_escape(NULL, values[i]);
    char *s = malloc(n + 1), *p = s;
    if (s == NULL)
        return NULL;
    *p++ = '{';
    for (int i = 0; i < f->n_labels; i++) {
        p += sprintf(p, "%s%s=\"", i ? "," : "", f->label[i]);
        p += mx_escape(p, values[i]);
        *p++ = '"';
    }
    *p++ = '}';
    *p = '\0';
    return s;
}

static int mx_grow_index(mx_family *f)
{
    int n_slots = f->n_slots ? 2 * f->n_slots : 64;
    int *slot = malloc((size_t)n_slots * sizeof *slot);
    if (slot == NULL)
        return -1;
    for (int i = 0; i < n_slots; i++)
        slot[i] = -1;
    for (int i = 0; i < f->n; i++) {
        uint64_t h = mx_hash(f->series[i]->key);
        int j = (int)(h & (uint64_t)(n_slots - 1));
        while (slot[j] >= 0)
            j = (j + 1) & (n_slots - 1);
        slot[j] = i;
    }
    free(f->slot);
    f->slot = slot;
    f->n_slots = n_slots;
    return 0;
}

static mx_series *mx_series_new(mx_family *f, const char *key, const char *const *values)
{
    if (f->n == f->cap) {
        int cap = f->cap ? 2 * f->cap : 16;
        mx_series **g = realloc(f->series, (size_t)cap * sizeof *g);
        if (g == NULL)
            return NULL;
        f->series = g;
        f->cap = cap;
    }
    if ((f->n + 1) * 2 > f->n_slots && mx_grow_index(f) != 0)
        return NULL;
    mx_series *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    s->fam = f;
    s->key = strdup(key);
    s->labels = mx_render_labels(f, values);
    if (f->type == MX_HISTOGRAM)
        s->bucket = calloc((size_t)f->n_buckets + 1, sizeof *s->bucket);
    if (s->key == NULL || s->labels == NULL || (f->type == MX_HISTOGRAM && s->bucket == NULL)) {
        mx_series_free(s);
        return NULL;
    }
    uint64_t h = mx_hash(key);
    int j = (int)(h & (uint64_t)(f->n_slots - 1));
    while (f->slot[j] >= 0)
        j = (j + 1) & (f->n_slots - 1);
    f->slot[j] = f->n;
    f->series[f->n++] = s;
    return s;
}

mx_series *mx_series_of(mx_family *f, const char *const *values)
{
    if (f == NULL)
        return NULL;
    char key[1024];
    size_t n = 0;
    for (int i = 0; i < f->n_labels; i++) {
        int k = snprintf(key + n, sizeof key - n, "%s%s", i ? "\x1f" : "", values[i]);
        if (k < 0 || (size_t)k >= sizeof key - n)
            return NULL;
        n += (size_t)k;
    }
    key[n] = '\0';
    pthread_mutex_lock(&f->reg->lock);
    mx_series *s = NULL;
    if (f->n_slots > 0) {
        uint64_t h = mx_hash(key);
        for (int j = (int)(h & (uint64_t)(f->n_slots - 1)); f->slot[j] >= 0;
             j = (j + 1) & (f->n_slots - 1))
            if (strcmp(f->series[f->slot[j]]->key, key) == 0) {
                s = f->series[f->slot[j]];
                break;
            }
    }
    if (s == NULL)
        s = mx_series_new(f, key, values);
    pthread_mutex_unlock(&f->reg->lock);
    return s;
}

mx_series *mx_series0(mx_family *f)
{
    return mx_series_of(f, NULL);
}

mx_series *mx_series1(mx_family *f, const char *v0)
{
    const char *v[1] = {v0};
    return mx_series_of(f, v);
}

mx_series *mx_series2(mx_family *f, const char *v0, const char *v1)
{
    const char *v[2] = {v0, v1};
    return mx_series_of(f, v);
}

void mx_set(mx_series *s, double v)
{
    if (s == NULL)
        return;
    pthread_mutex_lock(&s->fam->reg->lock);
    s->value = v;
    pthread_mutex_unlock(&s->fam->reg->lock);
}

void mx_add(mx_series *s, double v)
{
    if (s == NULL)
        return;
    pthread_mutex_lock(&s->fam->reg->lock);
    s->value += v;
    pthread_mutex_unlock(&s->fam->reg->lock);
}

void mx_observe(mx_series *s, double v)
{
    if (s == NULL || s->bucket == NULL)
        return;
    const mx_family *f = s->fam;
    pthread_mutex_lock(&f->reg->lock);
    int i = 0;
    while (i < f->n_buckets && v > f->bound[i])
        i++;
    s->bucket[i]++; /* bucket n_buckets: above every bound (+Inf) */
    s->count++;
    s->value += v;
    pthread_mutex_unlock(&f->reg->lock);
}

int mx_observe_many(mx_series *s, const uint32_t *counts, int n, double sum)
{
    if (s == NULL || s->bucket == NULL)
        return 0;
    const mx_family *f = s->fam;
    if (n != f->n_buckets + 1)
        return -1;
    pthread_mutex_lock(&f->reg->lock);
    for (int i = 0; i < n; i++) {
        s->bucket[i] += counts[i];
        s->count += counts[i];
    }
    s->value += sum;
    pthread_mutex_unlock(&f->reg->lock);
    return 0;
}

int mx_seconds_bucket(double v)
{
    int i = 0;
    while (i < mx_n_seconds_buckets && v > mx_seconds_buckets[i])
        i++;
    return i;
}

double mx_value(const mx_series *s)
{
    if (s == NULL)
        return 0;
    pthread_mutex_lock(&s->fam->reg->lock);
    double v = s->fam->type == MX_HISTOGRAM ? (double)s->count : s->value;
    pthread_mutex_unlock(&s->fam->reg->lock);
    return v;
}

void mx_clear(mx_family *f)
{
    if (f == NULL)
        return;
    pthread_mutex_lock(&f->reg->lock);
    mx_clear_locked(f);
    pthread_mutex_unlock(&f->reg->lock);
}

/* ---- rendering ---- */

typedef struct mx_buf {
    char *p;
    size_t n, cap;
    bool oom;
} mx_buf;

static void mx_put(mx_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void mx_put(mx_buf *b, const char *fmt, ...)
{
    for (int tries = 0; tries < 2 && !b->oom; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = true;
            return;
        }
        if (b->p && (size_t)k < b->cap - b->n) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = b->cap ? b->cap : 65536;
        while (cap - b->n <= (size_t)k)
            cap *= 2;
        char *g = realloc(b->p, cap);
        if (g == NULL) {
            b->oom = true;
            return;
        }
        b->p = g;
        b->cap = cap;
    }
}

/* The shortest %g text that reads back as v (15, 16 or 17 digits). */
static void mx_fmt(char *buf, size_t cap, double v)
{
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

/* A sample value: Prometheus's Go float syntax (+Inf, -Inf, NaN, shortest round trip). */
static void mx_put_value(mx_buf *b, double v)
{
    char t[40];
    if (isnan(v))
        mx_put(b, "NaN\n");
    else if (isinf(v))
        mx_put(b, "%sInf\n", v > 0 ? "+" : "-");
    else if (v == (double)(int64_t)v && fabs(v) < 9e15)
        mx_put(b, "%lld\n", (long long)v);
    else {
        mx_fmt(t, sizeof t, v);
        mx_put(b, "%s\n", t);
    }
}

/* The labels of a histogram series plus le="bound". */
static void mx_put_bucket(mx_buf *b, const mx_family *f, const mx_series *s, const char *le,
                          uint64_t cum)
{
    size_t n = strlen(s->labels);
    if (n == 0)
        mx_put(b, "%s_bucket{le=\"%s\"} %llu\n", f->name, le, (unsigned long long)cum);
    else
        mx_put(b, "%s_bucket%.*s,le=\"%s\"} %llu\n", f->name, (int)(n - 1), s->labels, le,
               (unsigned long long)cum);
}

static void mx_render_family(mx_buf *b, const mx_family *f)
{
    static const char *const types[] = {"counter", "gauge", "histogram"};
    char help[512];
    size_t n = 0;
    for (const char *h = f->help; *h && n + 3 < sizeof help; h++) { /* escapes \\ and \n only */
        if (*h == '\\' || *h == '\n')
            help[n++] = '\\';
        help[n++] = *h == '\n' ? 'n' : *h;
    }
    help[n] = '\0';
    mx_put(b, "# HELP %s %s\n# TYPE %s %s\n", f->name, help, f->name, types[f->type]);
    for (int i = 0; i < f->n; i++) {
        const mx_series *s = f->series[i];
        if (f->type != MX_HISTOGRAM) {
            mx_put(b, "%s%s ", f->name, s->labels);
            mx_put_value(b, s->value);
            continue;
        }
        uint64_t cum = 0;
        for (int k = 0; k < f->n_buckets; k++) {
            char le[40];
            mx_fmt(le, sizeof le, f->bound[k]);
            cum += s->bucket[k];
            mx_put_bucket(b, f, s, le, cum);
        }
        mx_put_bucket(b, f, s, "+Inf", s->count);
        mx_put(b, "%s_sum%s ", f->name, s->labels);
        mx_put_value(b, s->value);
        mx_put(b, "%s_count%s %llu\n", f->name, s->labels, (unsigned long long)s->count);
    }
}

char *mx_render(mx_registry *r, size_t *len)
{
    mx_buf b = {0};
    pthread_mutex_lock(&r->lock);
    for (int i = 0; i < r->n; i++)
        mx_render_family(&b, r->fam[i]);
    pthread_mutex_unlock(&r->lock);
    if (b.oom || (b.p == NULL && (mx_put(&b, "%s", ""), b.oom))) {
        free(b.p);
        return NULL;
    }
    if (len)
        *len = b.n;
    return b.p;
}
