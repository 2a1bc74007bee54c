/*
 * spec_yaml.c — a cluster spec's YAML: the document tree, its scalars and the walker (see
 * spec_yaml.h).
 *
 * libyaml's event API builds a small tree of our own (ynode). libyaml 0.2.5 has no nesting
 * limit, and its document API (yaml_parser_load) builds the whole tree before we could look at
 * it, so depth could only be checked after the fact. Events let us enforce SPEC_MAX_DEPTH and
 * SPEC_MAX_NODES while loading, refuse aliases, anchors and tags at the event that carries them,
 * and still report every YAML syntax error (anywhere in the file) before any schema error.
 * The walker is the one place that handles unknown keys, duplicate keys, wrong node types and
 * missing required keys, whatever the section (netplan's parse.c is the model).
 */
#include "coordinator/spec_yaml.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

/* ---- the document tree -------------------------------------------------------------------- */

int spec_fail(const spec_ctx *c, spec_pos pos, const char *fmt, ...)
{
    char msg[EP_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ep_err_set(c->err, "%s:%d:%d: %s", c->file, pos.line, pos.col, msg);
}

static spec_pos spec_mark(yaml_mark_t m)
{
    return (spec_pos){(int)m.line + 1, (int)m.column + 1};
}

/* Reader errors (bad UTF-8, control characters) carry a byte offset, not a mark. Columns
 * count characters, as libyaml's marks do: UTF-8 continuation bytes do not advance them. */
static spec_pos spec_offset_pos(const spec_ctx *c, size_t off)
{
    spec_pos p = {1, 1};
    for (size_t i = 0; i < off && i < c->len; i++) {
        if (c->text[i] == '\n') {
            p.line++;
            p.col = 1;
        } else if (((unsigned char)c->text[i] & 0xc0) != 0x80) {
            p.col++;
        }
    }
    return p;
}

static int spec_syntax_error(const spec_ctx *c, const yaml_parser_t *yp)
{
    const char *problem = yp->problem ? yp->problem : "unknown problem";
    switch (yp->error) {
    case YAML_MEMORY_ERROR:
        return ep_err_set(c->err, "%s: out of memory while parsing YAML", c->file);
    case YAML_READER_ERROR:
        if (yp->problem_value >= 0)
            return spec_fail(c, spec_offset_pos(c, yp->problem_offset),
                             "invalid input: %s (byte 0x%02x)", problem, yp->problem_value);
        return spec_fail(c, spec_offset_pos(c, yp->problem_offset), "invalid input: %s", problem);
    default:
        break;
    }
    spec_pos at = spec_mark(yp->problem_mark);
    if (yp->context == NULL)
        return spec_fail(c, at, "YAML syntax error: %s", problem);
    spec_pos ctx = spec_mark(yp->context_mark);
    return spec_fail(c, at, "YAML syntax error: %s (%s at line %d, column %d)", problem,
                     yp->context, ctx.line, ctx.col);
}

static int spec_tree_add(spec_ctx *c, ykind kind, spec_pos pos)
{
    if (c->n_nodes == SPEC_MAX_NODES)
        return spec_fail(c, pos,
                         "more than %d YAML nodes (SPEC_MAX_NODES); this is not a "
                         "cluster spec",
                         SPEC_MAX_NODES);
    if (c->n_nodes == c->cap_nodes) {
        int cap = c->cap_nodes ? 2 * c->cap_nodes : 64;
        ynode *grown = realloc(c->nodes, (size_t)cap * sizeof *grown);
        if (grown == NULL)
            return ep_err_set(c->err, "%s: out of memory", c->file);
        c->nodes = grown;
        c->cap_nodes = cap;
    }
    c->nodes[c->n_nodes] = (ynode){.kind = kind, .pos = pos, .first = -1, .last = -1, .next = -1};
    return c->n_nodes++;
}

static void spec_tree_attach(spec_ctx *c, int idx, const int *stack, int depth)
{
    if (depth == 0) {
        c->root = idx;
        return;
    }
    ynode *parent = &c->nodes[stack[depth - 1]];
    if (parent->last < 0)
        parent->first = idx;
    else
        c->nodes[parent->last].next = idx;
    parent->last = idx;
    parent->count++;
}

/* Anchors, aliases and tags make a spec harder to read than it is worth: refuse them. */
static int spec_check_props(const spec_ctx *c, spec_pos pos, const yaml_char_t *anchor,
                            const yaml_char_t *tag)
{
    if (anchor != NULL)
        return spec_fail(c, pos, "anchors (&%.64s) are not allowed in a cluster spec",
                         (const char *)anchor);
    if (tag != NULL)
        return spec_fail(c, pos, "tags (%.64s) are not allowed in a cluster spec",
                         (const char *)tag);
    return 0;
}

static int spec_tree_scalar(spec_ctx *c, const yaml_event_t *ev, spec_pos pos)
{
    int idx = spec_tree_add(c, YK_SCALAR, pos);
    if (idx < 0)
        return -1;
    ynode *n = &c->nodes[idx];
    n->len = ev->data.scalar.length;
    n->plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
    n->str = malloc(n->len + 1);
    if (n->str == NULL)
        return ep_err_set(c->err, "%s: out of memory", c->file);
    memcpy(n->str, ev->data.scalar.value, n->len);
    n->str[n->len] = '\0';
    return idx;
}

/* Add one event to the tree. stack holds the open mappings and sequences. */
static int spec_tree_event(spec_ctx *c, const yaml_event_t *ev, int *stack, int *depth, int *docs)
{
    spec_pos pos = spec_mark(ev->start_mark);
    int idx;
    switch (ev->type) {
    case YAML_DOCUMENT_START_EVENT:
        if (++*docs > 1)
            return spec_fail(c, pos,
                             "a cluster spec is a single YAML document; a second one "
                             "starts here");
        return 0;
    case YAML_ALIAS_EVENT:
        return spec_fail(c, pos, "aliases (*%.64s) are not allowed in a cluster spec",
                         (const char *)ev->data.alias.anchor);
    case YAML_SCALAR_EVENT:
        if (spec_check_props(c, pos, ev->data.scalar.anchor, ev->data.scalar.tag) != 0)
            return -1;
        if ((idx = spec_tree_scalar(c, ev, pos)) < 0)
            return -1;
        spec_tree_attach(c, idx, stack, *depth);
        return 0;
    case YAML_SEQUENCE_START_EVENT:
    case YAML_MAPPING_START_EVENT: {
        bool map = ev->type == YAML_MAPPING_START_EVENT;
        const yaml_char_t *anchor =
            map ? ev->data.mapping_start.anchor : ev->data.sequence_start.anchor;
        const yaml_char_t *tag = map ? ev->data.mapping_start.tag : ev->data.sequence_start.tag;
        if (spec_check_props(c, pos, anchor, tag) != 0)
            return -1;
        if (*depth == SPEC_MAX_DEPTH)
            return spec_fail(c, pos, "nesting deeper than %d levels (SPEC_MAX_DEPTH)",
                             SPEC_MAX_DEPTH);
        if ((idx = spec_tree_add(c, map ? YK_MAP : YK_SEQ, pos)) < 0)
            return -1;
        spec_tree_attach(c, idx, stack, *depth);
        stack[(*depth)++] = idx;
        return 0;
    }
    case YAML_SEQUENCE_END_EVENT:
    case YAML_MAPPING_END_EVENT:
        (*depth)--;
        return 0;
    default:
        return 0;
    }
}

int spec_tree_build(spec_ctx *c)
{
    yaml_parser_t yp;
    if (!yaml_parser_initialize(&yp))
        return ep_err_set(c->err, "%s: out of memory", c->file);
    yaml_parser_set_input_string(&yp, (const unsigned char *)c->text, c->len);
    int stack[SPEC_MAX_DEPTH];
    int depth = 0, docs = 0, rc = -1;
    c->root = -1;
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&yp, &ev)) {
            spec_syntax_error(c, &yp);
            break;
        }
        bool end = ev.type == YAML_STREAM_END_EVENT;
        int bad = spec_tree_event(c, &ev, stack, &depth, &docs);
        yaml_event_delete(&ev);
        if (bad)
            break;
        if (end) {
            rc = 0;
            break;
        }
    }
    yaml_parser_delete(&yp);
    return rc;
}

/* ---- scalar helpers ----------------------------------------------------------------------- */

const ynode *spec_node_at(const spec_ctx *c, int idx)
{
    return idx < 0 ? NULL : &c->nodes[idx];
}

static bool spec_is_null(const ynode *v)
{
    if (v->kind != YK_SCALAR || !v->plain)
        return false;
    return v->len == 0 || strcmp(v->str, "~") == 0 || strcmp(v->str, "null") == 0 ||
           strcmp(v->str, "Null") == 0 || strcmp(v->str, "NULL") == 0;
}

static bool spec_needs_escape(unsigned char ch)
{
    return ch < 0x20 || ch == 0x7f || ch == '"' || ch == '\\';
}

/* Bytes that ch takes in a quoted message: \xHH escapes, whole UTF-8 sequences. */
static size_t spec_quote_width(unsigned char ch)
{
    if (spec_needs_escape(ch) || ch >= 0xf0)
        return 4;
    if (ch >= 0xe0)
        return 3;
    return ch >= 0xc0 ? 2 : 1;
}

/* Text for messages: quoted, at most cap - 8 bytes of it, control bytes escaped, never a
 * UTF-8 sequence cut in half. */
const char *spec_quote(const char *s, size_t len, char *buf, size_t cap)
{
    size_t o = 0, limit = cap - 8;
    buf[o++] = '"';
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        size_t need = spec_quote_width(ch);
        if (ch >= 0x80 && ch < 0xc0) { /* continuation: its lead byte reserved the room */
            if (o >= limit)
                break; /* only reached by invalid UTF-8 */
            buf[o++] = (char)ch;
            continue;
        }
        if (o + need > limit) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        if (spec_needs_escape(ch))
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", ch);
        else
            buf[o++] = (char)ch;
    }
    buf[o++] = '"';
    buf[o] = '\0';
    return buf;
}

/* What a node is, for "found ..." in messages. */
const char *spec_found(const ynode *v, char *buf, size_t cap)
{
    if (v->kind == YK_MAP)
        return "a mapping";
    if (v->kind == YK_SEQ)
        return "a sequence";
    if (spec_is_null(v))
        return "an empty value";
    return spec_quote(v->str, v->len, buf, cap);
}

int spec_type_error(const spec_ctx *c, const ynode *v, const char *path, const char *expected)
{
    char buf[64];
    return spec_fail(c, v->pos, "%s: expected %s, found %s", path[0] ? path : "top level", expected,
                     spec_found(v, buf, sizeof buf));
}

/* The text of a non-empty string scalar without embedded NULs. what: "a name", "a path"... */
const char *spec_str(const spec_ctx *c, const ynode *v, const char *path, const char *what)
{
    if (v->kind != YK_SCALAR || spec_is_null(v) || v->len == 0) {
        spec_type_error(c, v, path, what);
        return NULL;
    }
    if (strlen(v->str) != v->len) {
        spec_fail(c, v->pos, "%s: the value contains a NUL byte", path);
        return NULL;
    }
    return v->str;
}

int spec_int(const spec_ctx *c, const ynode *v, const char *path, long long lo, long long hi,
             long long *out)
{
    const char *s = v->kind == YK_SCALAR ? v->str : "";
    /* strtoll would skip blanks and accept '+'; a spec integer is [-]digits and nothing else */
    if (v->kind != YK_SCALAR || strlen(s) != v->len ||
        !(isdigit((unsigned char)s[0]) || s[0] == '-'))
        return spec_type_error(c, v, path, "an integer");
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (end == s || *end != '\0')
        return spec_type_error(c, v, path, "an integer");
    if (errno == ERANGE || x < lo || x > hi)
        return spec_fail(c, v->pos, "%s: %.32s%s is out of range (expected %lld..%lld)", path, s,
                         v->len > 32 ? "..." : "", lo, hi);
    *out = x;
    return 0;
}

/* ---- the walker --------------------------------------------------------------------------- */

static int spec_unknown_key(const spec_ctx *c, const ynode *k, const spec_section *sec,
                            const char *path)
{
    char buf[64], list[256] = "";
    for (int i = 0; i < sec->n_fields; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                 sec->fields[i].key);
    return spec_fail(c, k->pos, "unknown key %s %s%s (expected one of %s)",
                     spec_quote(k->str, k->len, buf, sizeof buf), path[0] ? "in " : "at the ",
                     path[0] ? path : "top level", list);
}

static int spec_find_field(const spec_section *sec, const ynode *k)
{
    for (int i = 0; i < sec->n_fields; i++)
        if (strlen(sec->fields[i].key) == k->len && memcmp(sec->fields[i].key, k->str, k->len) == 0)
            return i;
    return -1;
}

/* Walk one mapping against its section: every key known, none twice, every required one
 * present (reported at the mapping's own position). path names the mapping ("" = top). */
int spec_walk(spec_ctx *c, const ynode *map, const spec_section *sec, const char *path, void *obj)
{
    spec_pos seen[SPEC_MAX_FIELDS] = {{0, 0}};
    if (map->kind != YK_MAP)
        return spec_type_error(c, map, path, "a mapping (check indentation)");
    const ynode *k = spec_node_at(c, map->first);
    while (k != NULL) {
        /* libyaml gives every key a value (an empty scalar when none is written) */
        const ynode *v = spec_node_at(c, k->next);
        if (v == NULL)
            return spec_fail(c, k->pos, "key without a value");
        if (k->kind != YK_SCALAR) {
            char buf[64];
            return spec_fail(c, k->pos, "%s: expected a scalar key, found %s",
                             path[0] ? path : "top level", spec_found(k, buf, sizeof buf));
        }
        int i = spec_find_field(sec, k);
        if (i < 0)
            return spec_unknown_key(c, k, sec, path);
        const spec_field *f = &sec->fields[i];
        if (seen[i].line != 0)
            return spec_fail(c, k->pos, "duplicate key \"%s\" %s%s (first at line %d, column %d)",
                             f->key, path[0] ? "in " : "at the ", path[0] ? path : "top level",
                             seen[i].line, seen[i].col);
        seen[i] = k->pos;
        char fpath[160];
        snprintf(fpath, sizeof fpath, "%s%s%s", path, path[0] ? "." : "", f->key);
        if (f->handle(c, k, v, f, fpath, obj) != 0)
            return -1;
        if (f->has_pos)
            *(spec_pos *)(void *)((char *)obj + f->pos_off) = v->pos;
        k = spec_node_at(c, v->next);
    }
    for (int i = 0; i < sec->n_fields; i++)
        if (sec->fields[i].required && seen[i].line == 0)
            return spec_fail(c, map->pos, "%s: missing required key \"%s\"",
                             path[0] ? path : "top level", sec->fields[i].key);
    return 0;
}
