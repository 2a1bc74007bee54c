/*
 * spec.c — cluster spec loader (see spec.h; the schema is docs/cluster-spec.md).
 *
 * Two phases:
 *   1. libyaml's event API builds a small tree of our own (ynode). libyaml 0.2.5 has no
 *      nesting limit, and its document API (yaml_parser_load) builds the whole tree before we
 *      could look at it, so depth could only be checked after the fact. Events let us enforce
 *      SPEC_MAX_DEPTH and SPEC_MAX_NODES while loading, refuse aliases, anchors and tags at
 *      the event that carries them, and still report every YAML syntax error (anywhere in the
 *      file) before any schema error.
 *   2. A walker checks the tree against tables of key handlers (netplan's parse.c is the
 *      model): each mapping is one spec_section, each key one spec_field naming its handler,
 *      its destination (offsetof) and its range. Unknown keys, duplicate keys, wrong node
 *      types and missing required keys are handled once, in spec_walk.
 * Cross-field rules (unique names and endpoints, one worker per GPU with NCCL) run last, over
 * the filled struct. The first error wins; nothing partial is returned.
 */
#include "coordinator/spec.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <yaml.h>

#include "common/rfile.h"

/* ---- the document tree -------------------------------------------------------------------- */

typedef enum ykind { YK_SCALAR, YK_MAP, YK_SEQ } ykind;

/* One YAML node. Children are linked by index (the array grows while loading); a mapping's
 * children alternate key, value. Scalars own a NUL-terminated copy of their text, which may
 * contain embedded NULs ("\0" escapes), hence len. */
typedef struct ynode {
    ykind kind;
    spec_pos pos;
    bool plain; /* scalar written without quotes: "~", "null" and "" then mean null */
    char *str;
    size_t len;
    int count;             /* children (a mapping has 2 per entry) */
    int first, last, next; /* child and sibling indices, -1 for none */
} ynode;

typedef struct spec_ctx {
    const char *file; /* for messages */
    const char *text;
    size_t len;
    const char *basedir; /* for relative model paths; "" keeps them relative */
    ep_err *err;
    ynode *nodes;
    int n_nodes, cap_nodes;
    int root; /* -1: the stream held no document */
    spec_cluster *s;
    int cap_workers;
    int cur_node; /* index of the node whose workers are being read */
} spec_ctx;

static int spec_fail(const spec_ctx *c, spec_pos pos, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int spec_fail(const spec_ctx *c, spec_pos pos, const char *fmt, ...)
{
    EP_ERR_FROM_ARGS(c->err, EP_ERR_GENERIC, fmt);
    return ep_err_prefix(c->err, "%s:%d:%d", c->file, pos.line, pos.col);
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

static int spec_tree_build(spec_ctx *c)
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

static const ynode *spec_node_at(const spec_ctx *c, int idx)
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
static const char *spec_quote(const char *s, size_t len, char *buf, size_t cap)
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
static const char *spec_found(const ynode *v, char *buf, size_t cap)
{
    if (v->kind == YK_MAP)
        return "a mapping";
    if (v->kind == YK_SEQ)
        return "a sequence";
    if (spec_is_null(v))
        return "an empty value";
    return spec_quote(v->str, v->len, buf, cap);
}

static int spec_type_error(const spec_ctx *c, const ynode *v, const char *path,
                           const char *expected)
{
    char buf[64];
    return spec_fail(c, v->pos, "%s: expected %s, found %s", path[0] ? path : "top level", expected,
                     spec_found(v, buf, sizeof buf));
}

/* The text of a non-empty string scalar without embedded NULs. what: "a name", "a path"... */
static const char *spec_str(const spec_ctx *c, const ynode *v, const char *path, const char *what)
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

static int spec_int(const spec_ctx *c, const ynode *v, const char *path, long long lo, long long hi,
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

/* ---- value checks ------------------------------------------------------------------------- */

/* ASCII only: isalnum() would follow the locale. */
#define SPEC_NAME_CHARS "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_"

static bool spec_name_ok(const char *s)
{
    size_t n = strlen(s);
    return n >= 1 && n <= SPEC_NAME_MAX && strspn(s, SPEC_NAME_CHARS) == n;
}

static bool spec_host_ok(const char *h, size_t n)
{
    const char *allowed = SPEC_NAME_CHARS; /* host names and IPv4 addresses */
    if (n > 0 && h[0] == '[') {            /* IPv6 literal */
        if (n < 3 || h[n - 1] != ']')
            return false;
        h++;
        n -= 2;
        allowed = "0123456789abcdefABCDEF:.";
    }
    if (n == 0)
        return false;
    for (size_t i = 0; i < n; i++)
        if (strchr(allowed, h[i]) == NULL)
            return false;
    return true;
}

/* sockaddr_un.sun_path on Linux, NUL included: the longest ipc:// path libzmq can bind. */
#define SPEC_SUN_PATH sizeof(((struct sockaddr_un *)0)->sun_path)
_Static_assert(SPEC_SUN_PATH == 108, "the ipc path message says 107 bytes");

/* NULL when port (what follows HOST:) is a number 1..65535, else what is wrong with it. */
static const char *spec_port_problem(const char *port)
{
    size_t pn = strlen(port);
    if (pn == 0 || pn > 5 || strspn(port, "0123456789") != pn)
        return "the port is not a number";
    long p = strtol(port, NULL, 10);
    if (p < 1 || p > 65535)
        return "the port is out of range";
    return NULL;
}

/* NULL when s is a valid endpoint, else what is wrong with it. bind: the coordinator binds it
 * (listen, admin) and may use the "*" host (all interfaces); peers connect to data endpoints,
 * so those need a real host. */
static const char *spec_endpoint_problem(const char *s, bool bind)
{
    if (strncmp(s, "ipc://", 6) == 0) {
        size_t n = strlen(s + 6);
        if (n == 0)
            return "empty ipc path";
        if (n >= SPEC_SUN_PATH)
            return "ipc path longer than 107 bytes (the Unix socket limit)";
        return NULL;
    }
    if (strncmp(s, "tcp://", 6) != 0)
        return "unsupported transport";
    const char *hp = s + 6, *colon = strrchr(hp, ':');
    if (colon == NULL)
        return "no :PORT";
    size_t hn = (size_t)(colon - hp);
    if (hn == 1 && hp[0] == '*') {
        if (!bind)
            return "peers connect to it, so the host cannot be *";
    } else if (!spec_host_ok(hp, hn)) {
        return bind ? "bad host (expected a name, an IPv4 address, [IPv6] or *)"
                    : "bad host (expected a name, an IPv4 address or [IPv6])";
    }
    return spec_port_problem(colon + 1);
}

/* "cpu" -> -1, "cuda:N" (N 0..255, no leading zeros) -> N, anything else -> -2. */
static int spec_device_index(const char *s)
{
    if (strcmp(s, "cpu") == 0)
        return -1;
    if (strncmp(s, "cuda:", 5) != 0)
        return -2;
    const char *d = s + 5;
    size_t n = strlen(d);
    if (n < 1 || n > 3 || strspn(d, "0123456789") != n || (n > 1 && d[0] == '0'))
        return -2;
    int v = atoi(d);
    return v <= 255 ? v : -2;
}

/* ---- the schema tables -------------------------------------------------------------------- */

typedef struct spec_field spec_field;
typedef int (*spec_handler)(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                            const char *path, void *obj);

typedef struct spec_section {
    const spec_field *fields;
    int n_fields;
} spec_section;

struct spec_field {
    const char *key;
    spec_handler handle;
    bool required;
    size_t off;       /* destination in obj */
    size_t cap;       /* string destinations: their size */
    long long lo, hi; /* integers: the allowed range */
    bool has_pos;     /* record the value's position at pos_off in obj */
    size_t pos_off;
    const spec_section *sub; /* nested mappings */
};

/* The most keys one section has; spec_walk tracks them in a fixed array. */
#define SPEC_MAX_FIELDS 12

#define SPEC_POS(type, member) .has_pos = true, .pos_off = offsetof(type, member)
#define SPEC_STR(type, member) .off = offsetof(type, member), .cap = sizeof(((type *)0)->member)

static int spec_walk(spec_ctx *c, const ynode *map, const spec_section *sec, const char *path,
                     void *obj);

/* A section over a field table, checked against spec_walk's fixed array. */
#define SPEC_SECTION(name, fields)                                                                 \
    _Static_assert(sizeof fields / sizeof fields[0] <= SPEC_MAX_FIELDS, #fields);                  \
    static const spec_section name = {fields, (int)(sizeof fields / sizeof fields[0])}

static int spec_put_str(spec_ctx *c, const ynode *val, const spec_field *f, const char *path,
                        void *obj, const char *s)
{
    if (strlen(s) >= f->cap)
        return spec_fail(c, val->pos, "%s: longer than %zu bytes", path, f->cap - 1);
    memcpy((char *)obj + f->off, s, strlen(s) + 1);
    return 0;
}

static int spec_h_section(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                          const char *path, void *obj)
{
    return spec_walk(c, val, f->sub, path, obj);
}

static int spec_h_int(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                      const char *path, void *obj)
{
    long long v = 0;
    if (spec_int(c, val, path, f->lo, f->hi, &v) != 0)
        return -1;
    *(int *)(void *)((char *)obj + f->off) = (int)v;
    return 0;
}

static int spec_h_name(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                       const char *path, void *obj)
{
    char buf[64];
    const char *s = spec_str(c, val, path, "a name");
    if (s == NULL)
        return -1;
    if (!spec_name_ok(s))
        return spec_fail(c, val->pos,
                         "%s: bad name %s (expected 1..%d characters from A-Z a-z 0-9 . _ -)", path,
                         spec_quote(s, val->len, buf, sizeof buf), SPEC_NAME_MAX);
    return spec_put_str(c, val, f, path, obj, s);
}

static int spec_endpoint(spec_ctx *c, const ynode *val, const spec_field *f, const char *path,
                         void *obj, bool bind)
{
    char buf[64];
    const char *s = spec_str(c, val, path, "an endpoint");
    if (s == NULL)
        return -1;
    const char *problem = spec_endpoint_problem(s, bind);
    if (problem != NULL)
        return spec_fail(c, val->pos,
                         "%s: bad endpoint %s: %s (expected tcp://HOST:PORT with PORT "
                         "1..65535, or ipc://PATH)",
                         path, spec_quote(s, val->len, buf, sizeof buf), problem);
    return spec_put_str(c, val, f, path, obj, s);
}

static int spec_h_bind_endpoint(spec_ctx *c, const ynode *key, const ynode *val,
                                const spec_field *f, const char *path, void *obj)
{
    return spec_endpoint(c, val, f, path, obj, true);
}

static int spec_h_peer_endpoint(spec_ctx *c, const ynode *key, const ynode *val,
                                const spec_field *f, const char *path, void *obj)
{
    return spec_endpoint(c, val, f, path, obj, false);
}

static int spec_h_path(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                       const char *path, void *obj)
{
    const char *s = spec_str(c, val, path, "a path");
    return s == NULL ? -1 : spec_put_str(c, val, f, path, obj, s);
}

/* Index of val in names[0..n), or -1 with "unknown WHAT "x" (expected one of ...)". */
static int spec_choice(spec_ctx *c, const ynode *val, const char *path, const char *what,
                       const char *const *names, int n)
{
    char buf[64], list[256] = "";
    const char *s = spec_str(c, val, path, what);
    if (s == NULL)
        return -1;
    for (int i = 0; i < n; i++) {
        if (strcmp(s, names[i]) == 0)
            return i;
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", names[i]);
    }
    spec_fail(c, val->pos, "%s: unknown %s %s (expected one of %s)", path, what,
              spec_quote(s, val->len, buf, sizeof buf), list);
    return -1;
}

static const char *const spec_placement_names[] = {"contiguous", "round_robin", "eplb"};
static const char *const spec_dispatch_names[] = {"fp8", "bf16"};
static const char *const spec_data_plane_names[] = {"zmq", "nccl"};
static const char *const spec_rejoin_names[] = {"restore", "stay"};
static const char *const spec_gpu_gemm_names[] = {"exact", "fast"};

static int spec_h_placement(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                            const char *path, void *obj)
{
    int i = spec_choice(c, val, path, "placement", spec_placement_names, 3);
    if (i < 0)
        return -1;
    ((spec_cluster *)obj)->placement = (spec_placement)i;
    return 0;
}

static int spec_h_dispatch(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                           const char *path, void *obj)
{
    int i = spec_choice(c, val, path, "dispatch format", spec_dispatch_names, 2);
    if (i < 0)
        return -1;
    ((spec_cluster *)obj)->dispatch = (spec_dispatch)i;
    return 0;
}

static int spec_h_data_plane(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                             const char *path, void *obj)
{
    int i = spec_choice(c, val, path, "data plane", spec_data_plane_names, 2);
    if (i < 0)
        return -1;
    ((spec_cluster *)obj)->data_plane = (spec_data_plane)i;
    return 0;
}

static int spec_h_rejoin(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                         const char *path, void *obj)
{
    int i = spec_choice(c, val, path, "rejoin policy", spec_rejoin_names, 2);
    if (i < 0)
        return -1;
    ((spec_cluster *)obj)->rejoin = (spec_rejoin)i;
    return 0;
}

static int spec_h_gpu_gemm(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                           const char *path, void *obj)
{
    int i = spec_choice(c, val, path, "GPU GEMM path", spec_gpu_gemm_names, 2);
    if (i < 0)
        return -1;
    ((spec_cluster *)obj)->gpu_gemm = (spec_gpu_gemm)i;
    return 0;
}

/* NULL when s is a valid metrics address HOST:PORT (an IPv4 address or a name; PORT
 * 1..65535), else what is wrong with it. libmicrohttpd binds it, so no ZeroMQ scheme. */
static const char *spec_metrics_problem(const char *s)
{
    const char *colon = strrchr(s, ':');
    if (strstr(s, "://") != NULL)
        return "no scheme: HOST:PORT, served over HTTP";
    if (colon == NULL || colon == s)
        return "expected HOST:PORT";
    if (!spec_host_ok(s, (size_t)(colon - s)) || s[0] == '[')
        return "bad host (expected an IPv4 address or a name)";
    return spec_port_problem(colon + 1);
}

static int spec_h_metrics(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                          const char *path, void *obj)
{
    char buf[64];
    const char *s = spec_str(c, val, path, "a metrics address");
    if (s == NULL)
        return -1;
    const char *problem = spec_metrics_problem(s);
    if (problem != NULL)
        return spec_fail(c, val->pos, "%s: bad metrics address %s: %s (e.g. \"127.0.0.1:9400\")",
                         path, spec_quote(s, val->len, buf, sizeof buf), problem);
    return spec_put_str(c, val, f, path, obj, s);
}

static int spec_h_device(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                         const char *path, void *obj)
{
    char buf[64];
    spec_worker *w = obj;
    const char *s = spec_str(c, val, path, "a device");
    if (s == NULL)
        return -1;
    int idx = spec_device_index(s);
    if (idx == -2)
        return spec_fail(c, val->pos,
                         "%s: bad device %s (expected \"cpu\" or \"cuda:N\" with N 0..255)", path,
                         spec_quote(s, val->len, buf, sizeof buf));
    w->cuda_index = idx;
    return spec_put_str(c, val, f, path, obj, s);
}

static int spec_grow_workers(spec_ctx *c)
{
    spec_cluster *s = c->s;
    if (s->n_workers < c->cap_workers)
        return 0;
    int cap = c->cap_workers ? 2 * c->cap_workers : 16;
    if (cap > EP_MAX_WORKERS)
        cap = EP_MAX_WORKERS;
    spec_worker *grown = realloc(s->workers, (size_t)cap * sizeof *grown);
    if (grown == NULL)
        return ep_err_set(c->err, "%s: out of memory", c->file);
    s->workers = grown;
    c->cap_workers = cap;
    return 0;
}

static const spec_field spec_worker_fields[] = {
    {.key = "name",
     .handle = spec_h_name,
     .required = true,
     SPEC_STR(spec_worker, name),
     SPEC_POS(spec_worker, name_pos)},
    {.key = "device",
     .handle = spec_h_device,
     .required = true,
     SPEC_STR(spec_worker, device),
     SPEC_POS(spec_worker, device_pos)},
    {.key = "data",
     .handle = spec_h_peer_endpoint,
     .required = true,
     SPEC_STR(spec_worker, data),
     SPEC_POS(spec_worker, data_pos)},
    {.key = "metrics",
     .handle = spec_h_metrics,
     SPEC_STR(spec_worker, metrics),
     SPEC_POS(spec_worker, metrics_pos)},
    {.key = "client",
     .handle = spec_h_peer_endpoint,
     SPEC_STR(spec_worker, client),
     SPEC_POS(spec_worker, client_pos)},
};
SPEC_SECTION(spec_worker_section, spec_worker_fields);

static int spec_h_workers(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                          const char *path, void *obj)
{
    spec_cluster *s = c->s;
    if (val->kind != YK_SEQ)
        return spec_type_error(c, val, path, "a sequence of workers (check indentation)");
    if (val->count == 0)
        return spec_fail(c, val->pos, "%s: expected at least one worker", path);
    int i = 0;
    for (const ynode *item = spec_node_at(c, val->first); item;
         item = spec_node_at(c, item->next)) {
        char ipath[128];
        snprintf(ipath, sizeof ipath, "%s[%d]", path, i++);
        if (s->n_workers == EP_MAX_WORKERS)
            return spec_fail(c, item->pos, "%s: more than %d workers (EP_MAX_WORKERS)", ipath,
                             EP_MAX_WORKERS);
        if (spec_grow_workers(c) != 0)
            return -1;
        spec_worker *w = &s->workers[s->n_workers];
        *w = (spec_worker){.rank = s->n_workers, .node_index = c->cur_node, .pos = item->pos};
        if (spec_walk(c, item, &spec_worker_section, ipath, w) != 0)
            return -1;
        s->n_workers++;
    }
    return 0;
}

static const spec_field spec_node_fields[] = {
    {.key = "name",
     .handle = spec_h_name,
     .required = true,
     SPEC_STR(spec_node, name),
     SPEC_POS(spec_node, name_pos)},
    {.key = "workers", .handle = spec_h_workers, .required = true},
};
SPEC_SECTION(spec_node_section, spec_node_fields);

static int spec_h_nodes(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                        const char *path, void *obj)
{
    spec_cluster *s = c->s;
    s->nodes_pos = key->pos;
    if (val->kind != YK_SEQ)
        return spec_type_error(c, val, path, "a sequence of nodes (check indentation)");
    if (val->count == 0)
        return spec_fail(c, val->pos, "%s: expected at least one node", path);
    /* every node has a worker, so more nodes than EP_MAX_WORKERS cannot be valid */
    if (val->count > EP_MAX_WORKERS)
        return spec_fail(c, val->pos, "%s: more than %d nodes (EP_MAX_WORKERS)", path,
                         EP_MAX_WORKERS);
    s->nodes = calloc((size_t)val->count, sizeof *s->nodes);
    if (s->nodes == NULL)
        return ep_err_set(c->err, "%s: out of memory", c->file);
    int i = 0;
    for (const ynode *item = spec_node_at(c, val->first); item;
         item = spec_node_at(c, item->next)) {
        char ipath[64];
        snprintf(ipath, sizeof ipath, "%s[%d]", path, i);
        spec_node *n = &s->nodes[i];
        n->pos = item->pos;
        n->first_worker = s->n_workers;
        c->cur_node = i;
        if (spec_walk(c, item, &spec_node_section, ipath, n) != 0)
            return -1;
        n->n_workers = s->n_workers - n->first_worker;
        s->n_nodes = ++i;
    }
    return 0;
}

static const spec_field spec_cluster_fields[] = {
    {.key = "name", .handle = spec_h_name, .required = true, SPEC_STR(spec_cluster, name)},
};
SPEC_SECTION(spec_cluster_section, spec_cluster_fields);

#define SPEC_INT(type, member, min, max) .off = offsetof(type, member), .lo = (min), .hi = (max)

static const spec_field spec_coordinator_fields[] = {
    {.key = "listen",
     .handle = spec_h_bind_endpoint,
     .required = true,
     SPEC_STR(spec_cluster, listen),
     SPEC_POS(spec_cluster, listen_pos)},
    {.key = "admin",
     .handle = spec_h_bind_endpoint,
     .required = true,
     SPEC_STR(spec_cluster, admin),
     SPEC_POS(spec_cluster, admin_pos)},
    {.key = "heartbeat_ms", .handle = spec_h_int, SPEC_INT(spec_cluster, heartbeat_ms, 10, 60000)},
    {.key = "liveness", .handle = spec_h_int, SPEC_INT(spec_cluster, liveness, 1, 100)},
    {.key = "step_timeout_ms",
     .handle = spec_h_int,
     SPEC_INT(spec_cluster, step_timeout_ms, 100, 3600000)},
    {.key = "metrics",
     .handle = spec_h_metrics,
     SPEC_STR(spec_cluster, metrics),
     SPEC_POS(spec_cluster, metrics_pos)},
};
SPEC_SECTION(spec_coordinator_section, spec_coordinator_fields);

static const spec_field spec_model_fields[] = {
    {.key = "path",
     .handle = spec_h_path,
     .required = true,
     SPEC_STR(spec_cluster, model_path),
     SPEC_POS(spec_cluster, model_pos)},
};
SPEC_SECTION(spec_model_section, spec_model_fields);

static const spec_field spec_ep_fields[] = {
    {.key = "placement", .handle = spec_h_placement, SPEC_POS(spec_cluster, placement_pos)},
    {.key = "redundant_experts",
     .handle = spec_h_int,
     SPEC_INT(spec_cluster, redundant_experts, 0, SPEC_MAX_REDUNDANT),
     SPEC_POS(spec_cluster, redundant_pos)},
    {.key = "expert_groups",
     .handle = spec_h_int,
     SPEC_INT(spec_cluster, expert_groups, 1, MC_MAX_EXPERTS),
     SPEC_POS(spec_cluster, groups_pos)},
    {.key = "window_steps",
     .handle = spec_h_int,
     SPEC_INT(spec_cluster, window_steps, 1, SPEC_MAX_WINDOW_STEPS)},
    {.key = "rebalance_every_steps",
     .handle = spec_h_int,
     SPEC_INT(spec_cluster, rebalance_every_steps, 0, 1000000000)},
    {.key = "dispatch", .handle = spec_h_dispatch, SPEC_POS(spec_cluster, dispatch_pos)},
    {.key = "data_plane", .handle = spec_h_data_plane, SPEC_POS(spec_cluster, data_plane_pos)},
    {.key = "rejoin", .handle = spec_h_rejoin},
    {.key = "max_experts_per_worker",
     .handle = spec_h_int,
     SPEC_INT(spec_cluster, max_experts_per_worker, 0, MC_MAX_EXPERTS),
     SPEC_POS(spec_cluster, max_experts_pos)},
    {.key = "gpu_gemm", .handle = spec_h_gpu_gemm},
};
SPEC_SECTION(spec_ep_section, spec_ep_fields);

static int spec_h_security(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                           const char *path, void *obj)
{
    spec_cluster *s = obj;
    s->secure = true;
    s->security_pos = val->pos;
    return spec_walk(c, val, f->sub, path, obj);
}

static const spec_field spec_security_fields[] = {
    {.key = "coordinator_key",
     .handle = spec_h_path,
     .required = true,
     SPEC_STR(spec_cluster, coordinator_key),
     SPEC_POS(spec_cluster, coordinator_key_pos)},
    {.key = "worker_keys",
     .handle = spec_h_path,
     .required = true,
     SPEC_STR(spec_cluster, worker_keys),
     SPEC_POS(spec_cluster, worker_keys_pos)},
    {.key = "operator_keys",
     .handle = spec_h_path,
     .required = true,
     SPEC_STR(spec_cluster, operator_keys),
     SPEC_POS(spec_cluster, operator_keys_pos)},
    {.key = "client_keys",
     .handle = spec_h_path,
     SPEC_STR(spec_cluster, client_keys),
     SPEC_POS(spec_cluster, client_keys_pos)},
};
SPEC_SECTION(spec_security_section, spec_security_fields);

static const spec_field spec_top_fields[] = {
    {.key = "cluster", .handle = spec_h_section, .required = true, .sub = &spec_cluster_section},
    {.key = "coordinator",
     .handle = spec_h_section,
     .required = true,
     .sub = &spec_coordinator_section},
    {.key = "model", .handle = spec_h_section, .required = true, .sub = &spec_model_section},
    {.key = "expert_parallel", .handle = spec_h_section, .sub = &spec_ep_section},
    {.key = "nodes", .handle = spec_h_nodes, .required = true},
    {.key = "security", .handle = spec_h_security, .sub = &spec_security_section},
};
SPEC_SECTION(spec_top_section, spec_top_fields);

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
static int spec_walk(spec_ctx *c, const ynode *map, const spec_section *sec, const char *path,
                     void *obj)
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

/* ---- cross-field rules -------------------------------------------------------------------- */

static void spec_worker_path(const spec_cluster *s, int i, char *buf, size_t cap)
{
    const spec_worker *w = &s->workers[i];
    snprintf(buf, cap, "nodes[%d].workers[%d]", w->node_index,
             i - s->nodes[w->node_index].first_worker);
}

/* Rules between two workers: i is checked against every earlier worker j. */
static int spec_check_pair(const spec_ctx *c, int i, int j)
{
    const spec_worker *w = &c->s->workers[i], *o = &c->s->workers[j];
    char path[96];
    spec_worker_path(c->s, i, path, sizeof path);
    if (strcmp(w->name, o->name) == 0)
        return spec_fail(c, w->name_pos,
                         "%s.name: duplicate worker name \"%s\" (first defined at line %d, "
                         "column %d)",
                         path, w->name, o->name_pos.line, o->name_pos.col);
    if (strcmp(w->data, o->data) == 0)
        return spec_fail(c, w->data_pos,
                         "%s.data: duplicate data endpoint \"%s\" (already used by worker %s at "
                         "line %d, column %d)",
                         path, w->data, o->name, o->data_pos.line, o->data_pos.col);
    if (w->metrics[0] && strcmp(w->metrics, o->metrics) == 0)
        return spec_fail(c, w->metrics_pos,
                         "%s.metrics: duplicate metrics address \"%s\" (already used by worker "
                         "%s at line %d, column %d)",
                         path, w->metrics, o->name, o->metrics_pos.line, o->metrics_pos.col);
    /* Several workers may share one GPU (each has its own stream and arena; tests and small
     * models do this), but NCCL refuses two ranks of a communicator on one device. */
    if (c->s->data_plane == SPEC_PLANE_NCCL && w->node_index == o->node_index &&
        w->cuda_index >= 0 && w->cuda_index == o->cuda_index)
        return spec_fail(c, w->device_pos,
                         "%s.device: device \"%s\" is already used by worker %s on this node "
                         "(line %d, column %d); data_plane nccl (line %d, column %d) needs one "
                         "worker per GPU",
                         path, w->device, o->name, o->device_pos.line, o->device_pos.col,
                         c->s->data_plane_pos.line, c->s->data_plane_pos.col);
    return 0;
}

/* NCCL moves device memory between GPUs: every worker must be on one, and the NCCL step
 * driver sends what the GPU quantized (fp8); bf16 dispatch is a ZeroMQ-plane option. */
static int spec_check_nccl(const spec_ctx *c)
{
    const spec_cluster *s = c->s;
    if (s->data_plane != SPEC_PLANE_NCCL)
        return 0;
    if (s->dispatch != SPEC_DISPATCH_FP8)
        return spec_fail(c, s->dispatch_pos,
                         "expert_parallel.dispatch: data_plane nccl (line %d, column %d) sends "
                         "fp8 dispatch only, found %s",
                         s->data_plane_pos.line, s->data_plane_pos.col,
                         spec_dispatch_name(s->dispatch));
    /* its step driver routes by one owner per expert, the same in every layer */
    if (s->placement == SPEC_PLACE_EPLB || s->redundant_experts > 0 || s->rebalance_every_steps > 0)
        return spec_fail(c, s->placement_pos.line ? s->placement_pos : s->data_plane_pos,
                         "expert_parallel: data_plane nccl (line %d, column %d) routes by one "
                         "owner per expert in every layer: placement eplb, redundant_experts and "
                         "rebalance_every_steps need data_plane zmq",
                         s->data_plane_pos.line, s->data_plane_pos.col);
    for (int i = 0; i < s->n_workers; i++) {
        const spec_worker *w = &s->workers[i];
        if (w->cuda_index >= 0)
            continue;
        char path[96];
        spec_worker_path(s, i, path, sizeof path);
        return spec_fail(c, w->device_pos,
                         "%s.device: data_plane nccl (line %d, column %d) requires every worker "
                         "on a cuda:N device, worker %s is on \"%s\"",
                         path, s->data_plane_pos.line, s->data_plane_pos.col, w->name, w->device);
    }
    return 0;
}

/* Whether the admin endpoint can only be reached from this host: ipc://, or tcp on a loopback
 * address (127.0.0.0/8, [::1], localhost). */
static bool spec_admin_local(const char *ep)
{
    if (strncmp(ep, "ipc://", 6) == 0)
        return true;
    const char *hp = ep + 6, *colon = strrchr(hp, ':');
    if (strncmp(ep, "tcp://", 6) != 0 || colon == NULL)
        return false;
    size_t hn = (size_t)(colon - hp);
    if ((hn == 9 && strncmp(hp, "localhost", 9) == 0) || (hn == 5 && strncmp(hp, "[::1]", 5) == 0))
        return true;
    char host[64];
    if (hn >= sizeof host || hn < 4 || strncmp(hp, "127.", 4) != 0)
        return false;
    memcpy(host, hp, hn);
    host[hn] = '\0';
    struct in_addr a;
    return inet_pton(AF_INET, host, &a) == 1;
}

/* The spec endpoint other than worker i's client endpoint that equals it: its key ("listen",
 * "workers[j].data", ...) in what and its position, or false when there is none. Every other
 * endpoint is checked, since two sockets cannot bind one endpoint. */
static bool spec_client_clash(const spec_cluster *s, int i, char *what, size_t cap, spec_pos *at)
{
    const char *ep = s->workers[i].client;
    if (strcmp(ep, s->listen) == 0 || strcmp(ep, s->admin) == 0) {
        bool l = strcmp(ep, s->listen) == 0;
        snprintf(what, cap, "coordinator.%s", l ? "listen" : "admin");
        *at = l ? s->listen_pos : s->admin_pos;
        return true;
    }
    for (int j = 0; j < s->n_workers; j++) {
        const spec_worker *o = &s->workers[j];
        bool data = strcmp(ep, o->data) == 0, client = j < i && strcmp(ep, o->client) == 0;
        if (!data && !client)
            continue;
        char opath[96];
        spec_worker_path(s, j, opath, sizeof opath);
        snprintf(what, cap, "%s.%s (worker %s)", opath, data ? "data" : "client", o->name);
        *at = data ? o->data_pos : o->client_pos;
        return true;
    }
    return false;
}

static int spec_check_clients(const spec_ctx *c)
{
    const spec_cluster *s = c->s;
    for (int i = 0; i < s->n_workers; i++) {
        const spec_worker *w = &s->workers[i];
        char what[160], path[96];
        spec_pos at;
        if (!w->client[0] || !spec_client_clash(s, i, what, sizeof what, &at))
            continue;
        spec_worker_path(s, i, path, sizeof path);
        return spec_fail(c, w->client_pos,
                         "%s.client: duplicate endpoint \"%s\" (already used by %s at line %d, "
                         "column %d); every socket needs an endpoint of its own",
                         path, w->client, what, at.line, at.col);
    }
    return 0;
}

static int spec_cross_check(const spec_ctx *c)
{
    const spec_cluster *s = c->s;
    if (spec_check_nccl(c) != 0)
        return -1;
    if (strcmp(s->listen, s->admin) == 0)
        return spec_fail(c, s->admin_pos,
                         "coordinator.admin: endpoint \"%s\" is also coordinator.listen (line %d, "
                         "column %d); the two sockets need different endpoints",
                         s->admin, s->listen_pos.line, s->listen_pos.col);
    for (int i = 0; i < s->n_nodes; i++)
        for (int j = 0; j < i; j++)
            if (strcmp(s->nodes[i].name, s->nodes[j].name) == 0)
                return spec_fail(c, s->nodes[i].name_pos,
                                 "nodes[%d].name: duplicate node name \"%s\" (first defined at "
                                 "line %d, column %d)",
                                 i, s->nodes[i].name, s->nodes[j].name_pos.line,
                                 s->nodes[j].name_pos.col);
    for (int i = 0; i < s->n_workers; i++) {
        const spec_worker *w = &s->workers[i];
        if (strcmp(w->data, s->listen) == 0 || strcmp(w->data, s->admin) == 0) {
            char path[96];
            spec_worker_path(s, i, path, sizeof path);
            bool l = strcmp(w->data, s->listen) == 0;
            spec_pos at = l ? s->listen_pos : s->admin_pos;
            return spec_fail(c, w->data_pos,
                             "%s.data: duplicate data endpoint \"%s\" (already used by "
                             "coordinator.%s at line %d, column %d)",
                             path, w->data, l ? "listen" : "admin", at.line, at.col);
        }
        if (w->metrics[0] && strcmp(w->metrics, s->metrics) == 0) {
            char path[96];
            spec_worker_path(s, i, path, sizeof path);
            return spec_fail(c, w->metrics_pos,
                             "%s.metrics: duplicate metrics address \"%s\" (already used by "
                             "coordinator.metrics at line %d, column %d)",
                             path, w->metrics, s->metrics_pos.line, s->metrics_pos.col);
        }
        for (int j = 0; j < i; j++)
            if (spec_check_pair(c, i, j) != 0)
                return -1;
    }
    if (spec_check_clients(c) != 0)
        return -1;
    /* Without authentication one SHUTDOWN from anyone who can connect stops the cluster. */
    if (!s->secure && !spec_admin_local(s->admin))
        return spec_fail(c, s->admin_pos,
                         "coordinator.admin: \"%s\" can be reached from other hosts, and without a "
                         "security: section anyone who connects may stop the cluster; bind it to "
                         "127.0.0.1, [::1], localhost or ipc://PATH, or add security: "
                         "(docs/operations.md, \"Security\")",
                         s->admin);
    return 0;
}

/* A path of the spec (cap EP_MAX_PATH) made relative to the spec file's directory. */
static int spec_resolve_path(const spec_ctx *c, char *p, spec_pos pos, const char *key)
{
    if (p[0] == '/' || p[0] == '\0' || c->basedir[0] == '\0')
        return 0;
    char joined[EP_MAX_PATH];
    size_t dl = strlen(c->basedir);
    const char *sep = c->basedir[dl - 1] == '/' ? "" : "/";
    int n = snprintf(joined, sizeof joined, "%s%s%s", c->basedir, sep, p);
    if (n < 0 || (size_t)n >= sizeof joined)
        return spec_fail(c, pos, "%s: relative to %s it is longer than %d bytes", key, c->basedir,
                         EP_MAX_PATH - 1);
    memcpy(p, joined, (size_t)n + 1);
    return 0;
}

static int spec_resolve_model(const spec_ctx *c)
{
    spec_cluster *s = c->s;
    if (spec_resolve_path(c, s->model_path, s->model_pos, "model.path") != 0)
        return -1;
    if (!s->secure)
        return 0;
    if (spec_resolve_path(c, s->coordinator_key, s->coordinator_key_pos,
                          "security.coordinator_key") != 0 ||
        spec_resolve_path(c, s->worker_keys, s->worker_keys_pos, "security.worker_keys") != 0 ||
        spec_resolve_path(c, s->operator_keys, s->operator_keys_pos, "security.operator_keys") !=
            0 ||
        spec_resolve_path(c, s->client_keys, s->client_keys_pos, "security.client_keys") != 0)
        return -1;
    return 0;
}

/* ---- public API --------------------------------------------------------------------------- */

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
    if (spec_walk(c, &c->nodes[c->root], &spec_top_section, "", s) != 0)
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

void spec_free(spec_cluster **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    spec_cluster *s = *self_p;
    free(s->workers);
    free(s->nodes);
    free(s);
    *self_p = NULL;
}

const spec_worker *spec_find_worker(const spec_cluster *s, const char *name)
{
    for (int i = 0; s && name && i < s->n_workers; i++)
        if (strcmp(s->workers[i].name, name) == 0)
            return &s->workers[i];
    return NULL;
}

int spec_check_experts(const spec_cluster *s, int n_experts, ep_err *err)
{
    int p = s->n_workers, red = s->redundant_experts;
    spec_pos at = s->nodes_pos, rp = s->redundant_pos, gp = s->groups_pos;
    if (n_experts < 1 || n_experts > MC_MAX_EXPERTS)
        return ep_err_set(err, "%s: the model has %d routed experts (expected 1..%d)", s->file,
                          n_experts, MC_MAX_EXPERTS);
    if (red > 0 && s->placement != SPEC_PLACE_EPLB)
        return ep_err_set(err,
                          "%s:%d:%d: expert_parallel.redundant_experts: %d needs placement eplb "
                          "(replicas are placed by EPLB; placement is %s)",
                          s->file, rp.line, rp.col, red, spec_placement_name(s->placement));
    if ((int64_t)n_experts + red > (int64_t)n_experts * p)
        return ep_err_set(err,
                          "%s:%d:%d: expert_parallel.redundant_experts: %d experts + %d redundant "
                          "need more than one replica of an expert on some of the %d workers",
                          s->file, rp.line, rp.col, n_experts, red, p);
    if (p > n_experts + red)
        return ep_err_set(err,
                          "%s:%d:%d: nodes: %d workers are more than the model's %d experts%s "
                          "(every worker must own at least one expert)",
                          s->file, at.line, at.col, p, n_experts + red,
                          red ? " and redundant slots" : "");
    if (s->placement == SPEC_PLACE_CONTIGUOUS && n_experts % p != 0)
        return ep_err_set(err,
                          "%s:%d:%d: nodes: %d workers do not divide the model's %d experts "
                          "evenly (placement contiguous needs n_routed_experts %% workers == 0; "
                          "round_robin and eplb do not)",
                          s->file, at.line, at.col, p, n_experts);
    if (n_experts % s->expert_groups != 0)
        return ep_err_set(err,
                          "%s:%d:%d: expert_parallel.expert_groups: %d groups do not divide the "
                          "model's %d experts",
                          s->file, gp.line, gp.col, s->expert_groups, n_experts);
    /* what the spec's placement gives its busiest worker */
    int most = (n_experts + red + p - 1) / p;
    spec_pos mp = s->max_experts_pos;
    if (s->max_experts_per_worker > 0 && s->max_experts_per_worker < most)
        return ep_err_set(err,
                          "%s:%d:%d: expert_parallel.max_experts_per_worker: %d is less than the "
                          "%d experts the placement gives a worker (%d experts over %d workers)",
                          s->file, mp.line, mp.col, s->max_experts_per_worker, most,
                          n_experts + red, p);
    return 0;
}

const char *spec_placement_name(spec_placement p)
{
    return (unsigned)p < 3 ? spec_placement_names[p] : "unknown";
}

const char *spec_gpu_gemm_name(spec_gpu_gemm g)
{
    return (unsigned)g < 2 ? spec_gpu_gemm_names[g] : "unknown";
}

const char *spec_dispatch_name(spec_dispatch d)
{
    return (unsigned)d < 2 ? spec_dispatch_names[d] : "unknown";
}

const char *spec_data_plane_name(spec_data_plane p)
{
    return (unsigned)p < 2 ? spec_data_plane_names[p] : "unknown";
}

const char *spec_rejoin_name(spec_rejoin r)
{
    return (unsigned)r < 2 ? spec_rejoin_names[r] : "unknown";
}
