/*
 * spec_load.c — loading a cluster spec (spec_parse, spec_load; see spec.h). Two phases: the YAML
 * becomes a tree (spec_yaml.c), a walker checks the tree against the sections' tables
 * (spec_schema.c); then the cross-field rules run over the filled struct (spec_check.c). The
 * first error wins; nothing partial is returned.
 */
#include "coordinator/spec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rfile.h"
#include "coordinator/spec_check.h"
#include "coordinator/spec_schema.h"
#include "coordinator/spec_yaml.h"

static void spec_ctx_free(spec_ctx *c)
{
    for (int i = 0; i < c->n_nodes; i++)
        free(c->nodes[i].str);
    free(c->nodes);
}

static int spec_build(spec_ctx *c)
{
    if (c->len > SPEC_MAX_BYTES)
        return ep_err_set(c->err,
                          "%s: %zu bytes is larger than a cluster spec may be (%u, "
                          "SPEC_MAX_BYTES)",
                          c->file, c->len, SPEC_MAX_BYTES);
    if (spec_tree_build(c) != 0)
        return -1;
    if (c->root < 0)
        return spec_fail(c, (spec_pos){1, 1},
                         "empty cluster spec (expected a mapping with keys cluster, "
                         "coordinator, model, expert_parallel, nodes)");
    spec_cluster *s = c->s;
    s->pos = c->nodes[c->root].pos;
    if (spec_walk_top(c) != 0)
        return -1;
    for (int i = 0; i < s->n_workers; i++)
        memcpy(s->workers[i].node, s->nodes[s->workers[i].node_index].name,
               sizeof s->workers[i].node);
    if (spec_cross_check(c) != 0)
        return -1;
    return spec_resolve_model(c);
}

static spec_cluster *spec_parse_in(const char *text, size_t len, const char *file,
                                   const char *basedir, ep_err *err)
{
    spec_cluster *s = calloc(1, sizeof *s);
    if (s == NULL) {
        ep_err_set(err, "%s: out of memory", file);
        return NULL;
    }
    snprintf(s->file, sizeof s->file, "%s", file);
    s->heartbeat_ms = 1000;
    s->liveness = 3;
    s->step_timeout_ms = 30000;
    s->placement = SPEC_PLACE_CONTIGUOUS;
    s->dispatch = SPEC_DISPATCH_FP8;
    s->expert_groups = 1;
    s->window_steps = SPEC_DEFAULT_WINDOW;
    spec_ctx c = {.file = s->file,
                  .text = text ? text : "",
                  .len = len,
                  .basedir = basedir,
                  .err = err,
                  .s = s,
                  .root = -1};
    int rc = spec_build(&c);
    spec_ctx_free(&c);
    if (rc != 0)
        spec_free(&s);
    return s;
}

/* dirname of path as written into buf: "" when path has no directory part. */
static void spec_dirname(const char *path, char *buf, size_t cap)
{
    const char *slash = strrchr(path, '/');
    if (slash == NULL) {
        buf[0] = '\0';
        return;
    }
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    if (n >= cap)
        n = cap - 1;
    memcpy(buf, path, n);
    buf[n] = '\0';
}

spec_cluster *spec_parse(const char *text, size_t len, const char *file, ep_err *err)
{
    char dir[EP_MAX_PATH];
    if (file == NULL)
        file = "<spec>";
    spec_dirname(file, dir, sizeof dir);
    return spec_parse_in(text, len, file, dir, err);
}

/* Read at most SPEC_MAX_BYTES + 1 bytes, so an oversized file is noticed without reading it
 * all. */
static char *spec_read(const char *path, size_t *len, ep_err *err)
{
    FILE *f = rf_open(path, "cluster spec", err);
    if (f == NULL)
        return NULL;
    char *buf = malloc((size_t)SPEC_MAX_BYTES + 1);
    size_t n = buf ? fread(buf, 1, (size_t)SPEC_MAX_BYTES + 1, f) : 0;
    int failed = buf == NULL || ferror(f);
    fclose(f);
    if (failed) {
        if (buf == NULL)
            ep_err_set(err, "%s: out of memory", path);
        else
            ep_err_set(err, "%s: read error", path);
        free(buf);
        return NULL;
    }
    if (n > SPEC_MAX_BYTES) {
        ep_err_set(err, "%s: larger than a cluster spec may be (%u bytes, SPEC_MAX_BYTES)", path,
                   SPEC_MAX_BYTES);
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

spec_cluster *spec_load(const char *path, ep_err *err)
{
    size_t len;
    char *text = spec_read(path, &len, err);
    if (text == NULL)
        return NULL;
    char dir[EP_MAX_PATH];
    char *real = realpath(path, NULL);
    spec_dirname(real ? real : path, dir, sizeof dir);
    free(real);
    spec_cluster *s = spec_parse_in(text, len, path, dir, err);
    free(text);
    return s;
}
