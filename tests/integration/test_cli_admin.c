/*
 * test_cli_admin.c — epmoectl's admin verbs and `forward` (cluster path) against the real
 * coordinator with fake workers.
 *
 * Proves: `-o json` of status, workers, shards and config is the documented schema-1 object and
 * its values are those the test computes from its own spec and config.json (names, ranks,
 * nodes, contiguous experts and their ranges, expert dtype given or defaulted, the config hash);
 * the tables name every worker; status --wait-ready exits 1 naming the missing worker, 0 once
 * the cluster is ready; a refused request exits 1 with the error name; a dead endpoint exits 69
 * within the retries' time; shutdown stops the daemon (exit 0); `forward` without --local
 * sends the tokens of a safetensors input through the cluster and writes the reassembled
 * output file (checked against the fake workers' function); -o yaml is -o json's tree (read
 * back by PyYAML), -o wide adds columns, --output=FORMAT and -oFORMAT work before the verb and
 * an option missing its value says so.
 *
 * Usage: test_cli_admin PATH/epmoe-coordinator PATH/epmoectl
 */
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/safetensors_writer.h"
#include "itest.h"
#include "test.h"

static const char *coord_bin, *ctl_bin;

#define FINISH(t) CHECK_EQ(it_finish(&(t), test_cur_failed), 0)

static char out[1 << 20], err[1 << 16];

static void slurp(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
}

/* Run epmoectl --coordinator ADMIN args... while pumping the fake workers; its exit code
 * (-1 when it ran for more than 20 s); stdout in out, stderr in err. */
static int run_ctl(itest *t, const char *endpoint, const char *first, ...)
{
    const char *argv[32] = {ctl_bin, "--coordinator", endpoint ? endpoint : t->admin};
    int n = 3;
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a != NULL && n < 31; a = va_arg(ap, const char *))
        argv[n++] = a;
    va_end(ap);
    argv[n] = NULL;
    char opath[160], epath[160];
    snprintf(opath, sizeof opath, "%s/out.txt", t->dir);
    snprintf(epath, sizeof epath, "%s/err.txt", t->dir);
    fflush(stdout); /* or the child would write our buffered lines again */
    pid_t pid = fork();
    if (pid == 0) {
        int ofd = open(opath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int efd = open(epath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (ofd < 0 || efd < 0 || dup2(ofd, 1) < 0 || dup2(efd, 2) < 0)
            _exit(127);
        execv(ctl_bin, (char *const *)argv);
        _exit(127);
    }
    int st = 0, rc = -1;
    int64_t end = it_now_ms() + 20000;
    while (it_now_ms() < end) {
        if (waitpid(pid, &st, WNOHANG) == pid) {
            rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            break;
        }
        if (t->pid > 0)
            it_pump(t, 5);
        else
            usleep(5000);
    }
    if (rc < 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    slurp(opath, out, sizeof out);
    slurp(epath, err, sizeof err);
    if (rc != 0 && rc != 1)
        printf("  epmoectl exit %d; stderr: %s\n", rc, err);
    return rc;
}

static json_t *parse(void)
{
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    if (j == NULL)
        printf("  not JSON (%s): %s\n", je.text, out);
    return j;
}

static const char *jget_s(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "(absent)";
}

static long long jget_i(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? json_integer_value(v) : -999;
}

static itest *start_plane(const char *expert_dtype, bool register_all, bool nccl)
{
    it_opts o;
    it_default_opts(&o);
    o.expert_dtype = expert_dtype;
    o.nccl = nccl;
    itest *t = it_start(coord_bin, &o);
    if (t && register_all && it_register_all(t) != 0)
        it_finish(&t, true);
    return t;
}

static itest *start(const char *expert_dtype, bool register_all)
{
    return start_plane(expert_dtype, register_all, false);
}

TEST(status_and_workers_json)
{
    itest *t = start("fp8", true);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    CHECK_EQ(run_ctl(t, NULL, "-o", "json", "status", NULL), 0);
    json_t *j = parse();
    CHECK(j != NULL);
    char hash[24];
    snprintf(hash, sizeof hash, "%016" PRIx64, mc_hash(&t->cfg));
    static const char *nodes[] = {"n0", "n0", "n1", "n1"};
    if (j) {
        CHECK_EQ(jget_i(j, "schema"), 1);
        CHECK_STR_EQ(jget_s(j, "cluster"), "itest");
        CHECK_STR_EQ(jget_s(j, "state"), "ready");
        CHECK_EQ(jget_i(j, "epoch"), (long long)it_epoch(t, 1));
        CHECK_STR_EQ(jget_s(j, "config_hash"), hash);
        CHECK_EQ(jget_i(j, "steps_done"), 0);
        CHECK_EQ(jget_i(j, "steps_failed"), 0);
        CHECK(strstr(jget_s(j, "model_path"), t->dir) != NULL);
        json_t *ws = json_object_get(j, "workers");
        CHECK_EQ(json_array_size(ws), 4);
        for (size_t k = 0; k < json_array_size(ws); k++) {
            json_t *w = json_array_get(ws, k);
            CHECK_STR_EQ(jget_s(w, "name"), it_worker_name(t, (int)k));
            CHECK_EQ(jget_i(w, "rank"), k);
            CHECK_STR_EQ(jget_s(w, "node"), nodes[k]);
            CHECK_STR_EQ(jget_s(w, "device"), "cpu");
            CHECK_STR_EQ(jget_s(w, "state"), "ready");
            CHECK(json_real_value(json_object_get(w, "load_progress")) == 1.0);
            CHECK(json_real_value(json_object_get(w, "load_gbps")) == 3.0);
            CHECK(jget_i(w, "last_seen_ms") >= 0 && jget_i(w, "last_seen_ms") < 2000);
            CHECK_EQ(jget_i(w, "n_experts"), IT_E / 4);
            CHECK(json_is_null(json_object_get(w, "error")));
        }
        json_decref(j);
    }
    CHECK_EQ(run_ctl(t, NULL, "workers", "-o", "json", NULL), 0); /* -o after the verb */
    j = parse();
    CHECK(j != NULL);
    if (j) {
        CHECK_EQ(jget_i(j, "schema"), 1);
        json_t *ws = json_object_get(j, "workers");
        CHECK_EQ(json_array_size(ws), 4);
        json_t *w = json_array_get(ws, 3);
        CHECK(strncmp(jget_s(w, "data_endpoint"), "tcp://127.0.0.1:", 16) == 0);
        CHECK_STR_EQ(jget_s(w, "backend"), "fake");
        CHECK_STR_EQ(jget_s(w, "hostname"), "itest");
        CHECK_EQ(jget_i(w, "pid"), getpid());
        json_decref(j);
    }
    /* tables: every worker on its own line */
    CHECK_EQ(run_ctl(t, NULL, "status", NULL), 0);
    CHECK_STR_HAS(out, "state        ready (4/4 workers ready)");
    CHECK_STR_HAS(out, "WORKER");
    CHECK_STR_HAS(out, "b1      3     n1    cpu     ready");
    CHECK_STR_HAS(out, "100% 3.00 GB/s"); /* load progress and the load's checkpoint rate */
    CHECK_EQ(run_ctl(t, NULL, "workers", NULL), 0);
    CHECK_STR_HAS(out, "BACKEND");
    CHECK_STR_HAS(out, "fake");
    FINISH(t);
}

TEST(shards_and_config_json)
{
    itest *t = start(NULL, true); /* config.json without expert_dtype: fp4 assumed */
    CHECK(t != NULL);
    if (t == NULL)
        return;
    CHECK_EQ(run_ctl(t, NULL, "-o", "json", "shards", "--layer", "1", NULL), 0);
    json_t *j = parse();
    CHECK(j != NULL);
    if (j) {
        CHECK_EQ(jget_i(j, "schema"), 1);
        CHECK_STR_EQ(jget_s(j, "placement"), "contiguous");
        CHECK_STR_EQ(jget_s(j, "layer"), "layers.1");
        json_t *sh = json_object_get(j, "shards");
        CHECK_EQ(json_array_size(sh), 4);
        for (size_t r = 0; r < json_array_size(sh); r++) {
            json_t *s = json_array_get(sh, r);
            int per = IT_E / 4;
            char ranges[32];
            snprintf(ranges, sizeof ranges, "%d-%d", (int)r * per, (int)r * per + per - 1);
            CHECK_EQ(jget_i(s, "rank"), r);
            CHECK_STR_EQ(jget_s(s, "worker"), it_worker_name(t, (int)r));
            CHECK_STR_EQ(jget_s(s, "ranges"), ranges);
            json_t *ex = json_object_get(s, "experts");
            CHECK_EQ(json_array_size(ex), per);
            for (int e = 0; e < per && json_array_size(ex) == (size_t)per; e++)
                CHECK_EQ(json_integer_value(json_array_get(ex, (size_t)e)), (int)r * per + e);
        }
        json_decref(j);
    }
    CHECK_EQ(run_ctl(t, NULL, "shards", NULL), 0);
    char want[96];
    snprintf(want, sizeof want, "placement contiguous, epoch %llu; the same for every layer",
             (unsigned long long)it_epoch(t, 1));
    CHECK_STR_HAS(out, want);
    CHECK_STR_HAS(out, "3     b1      2      6-7");
    CHECK_EQ(run_ctl(t, NULL, "-o", "json", "config", NULL), 0);
    j = parse();
    CHECK(j != NULL);
    char hash[24];
    snprintf(hash, sizeof hash, "%016" PRIx64, mc_hash(&t->cfg));
    if (j) {
        CHECK_EQ(jget_i(j, "schema"), 1);
        CHECK_STR_EQ(jget_s(j, "expert_dtype"), "fp4");
        CHECK(json_is_false(json_object_get(j, "expert_dtype_given")));
        CHECK(json_is_true(json_object_get(j, "scale_e8m0")));
        CHECK(json_is_false(json_object_get(j, "act_ue8m0")));
        CHECK_STR_EQ(jget_s(j, "config_hash"), hash);
        json_t *c = json_object_get(j, "config");
        CHECK_EQ(jget_i(c, "hidden_size"), IT_H);
        CHECK_EQ(jget_i(c, "n_routed_experts"), IT_E);
        CHECK_EQ(jget_i(c, "num_experts_per_tok"), IT_K);
        CHECK_EQ(jget_i(c, "num_hash_layers"), IT_HASH);
        CHECK_EQ(jget_i(c, "vocab_size"), IT_VOCAB);
        CHECK(json_real_value(json_object_get(c, "routed_scaling_factor")) == 1.5);
        CHECK(json_real_value(json_object_get(c, "rms_norm_eps")) == 1e-6);
        CHECK_STR_EQ(jget_s(c, "hash"), hash);
        json_decref(j);
    }
    CHECK_STR_HAS(out, "\"rms_norm_eps\": 1e-6"); /* the shortest decimal of the float */
    CHECK_EQ(run_ctl(t, NULL, "config", NULL), 0);
    CHECK_STR_HAS(out,
                  "expert_dtype  fp4 (defaulted: config.json has no expert_dtype, top level or "
                  "in quantization_config)");
    CHECK_STR_HAS(out, hash);
    /* a refused request: exit 1 with the error's name */
    CHECK_EQ(run_ctl(t, NULL, "shards", "--layer", "layers.9", NULL), 1);
    CHECK_STR_HAS(err, "epmoectl shards: ERR_BAD_REQUEST: ");
    CHECK_STR_HAS(err, "layers.9");
    CHECK_EQ(run_ctl(t, NULL, "shards", "--bogus", NULL), 64);
    FINISH(t);
}

TEST(wait_ready_and_dead_endpoint)
{
    itest *t = start("fp8", false);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    for (int r = 0; r < 3; r++)
        CHECK_EQ(it_worker_register(t, it_worker_new(t, it_worker_name(t, r))), 0);
    int64_t t0 = it_now_ms();
    CHECK_EQ(run_ctl(t, NULL, "status", "--wait-ready", "--wait-timeout", "1", NULL), 1);
    CHECK(it_now_ms() - t0 < 5000);
    CHECK_STR_HAS(err, "cluster itest is still forming after 1 s; not ready: b1 (absent)");
    CHECK_EQ(it_worker_register(t, it_worker_new(t, it_worker_name(t, 3))), 0);
    CHECK_EQ(run_ctl(t, NULL, "-o", "json", "status", "--wait-ready", "--wait-timeout", "5", NULL),
             0);
    json_t *j = parse();
    CHECK(j && strcmp(jget_s(j, "state"), "ready") == 0);
    json_decref(j);
    /* nobody at this endpoint: 3 tries within 200 ms in all (one deadline), then 69 */
    char dead[64];
    snprintf(dead, sizeof dead, "tcp://127.0.0.1:%d", it_free_port());
    t0 = it_now_ms();
    CHECK_EQ(run_ctl(t, dead, "--timeout", "200", "status", NULL), 69);
    int64_t took = it_now_ms() - t0;
    CHECK(took >= 180 && took < 1500);
    char want[128];
    snprintf(want, sizeof want, "coordinator at %s did not answer within 200 ms (3 tries)", dead);
    CHECK_STR_HAS(err, want);
    /* shutdown through the CLI: the daemon exits 0 */
    CHECK_EQ(run_ctl(t, NULL, "shutdown", NULL), 0);
    CHECK_STR_HAS(out, "cluster itest: stopping");
    CHECK_EQ(it_wait_exit(t, 5000), 0);
    FINISH(t);
}

/* The current stdout (out) into DIR/NAME; the path in path. */
static void save_out(const itest *t, const char *name, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s", t->dir, name);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(out, f);
        fclose(f);
    }
}

/* 0 when the YAML file and the JSON file hold the same tree (an independent reader: PyYAML,
 * YAML 1.1, so a string that reads back as a number or a bool would differ), with the keys
 * that change between two calls (last_seen_ms) dropped; 77 without python3-yaml. */
static int same_tree(const char *yaml_path, const char *json_path)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "python3 -c 'import json, sys\n"
             "try:\n    import yaml\nexcept ImportError:\n    sys.exit(77)\n"
             "def drop(v):\n"
             "    if isinstance(v, dict):\n"
             "        return {k: drop(x) for k, x in v.items() if k != \"last_seen_ms\"}\n"
             "    return [drop(x) for x in v] if isinstance(v, list) else v\n"
             "y = drop(yaml.safe_load(open(sys.argv[1])))\n"
             "j = drop(json.load(open(sys.argv[2])))\n"
             "sys.exit(0 if y == j else print(\"yaml\", y, \"json\", j) or 1)' %s %s",
             yaml_path, json_path);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* -o yaml: the JSON's tree; -o wide: every column; --output=F and -oF before the verb; an
 * option given last without its value is said to need one (it read "unexpected argument"). */
TEST(yaml_wide_and_output_forms)
{
    itest *t = start("fp8", true);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    static const char *const verbs[][3] = {
        {"config", NULL}, {"shards", "--layer", "1"}, {"status", NULL}, {"workers", NULL}};
    enum { N_VERBS = sizeof verbs / sizeof verbs[0] };
    char yp[N_VERBS][200], jp[N_VERBS][200], name[32];
    for (size_t v = 0; v < N_VERBS; v++) {
        CHECK_EQ(run_ctl(t, NULL, "-o", "yaml", verbs[v][0], verbs[v][1], verbs[v][2], NULL), 0);
        CHECK(strncmp(out, "---\n", 4) == 0);
        snprintf(name, sizeof name, "out%zu.yaml", v);
        save_out(t, name, yp[v], sizeof yp[v]);
        /* --output=json before the verb, as -o json is */
        CHECK_EQ(run_ctl(t, NULL, "--output=json", verbs[v][0], verbs[v][1], verbs[v][2], NULL), 0);
        snprintf(name, sizeof name, "out%zu.json", v);
        save_out(t, name, jp[v], sizeof jp[v]);
    }
    CHECK_EQ(run_ctl(t, NULL, "-ojson", "status", NULL), 0);
    json_t *j = parse();
    CHECK(j && jget_i(j, "schema") == 1);
    json_decref(j);
    CHECK_EQ(run_ctl(t, NULL, "status", "--output=yaml", NULL), 0); /* after the verb too */
    CHECK_STR_HAS(out, "schema: 1\n");
    CHECK_STR_HAS(out, "state: \"ready\"\n");
    /* wide: the worker table gets the host, pid and backend columns */
    CHECK_EQ(run_ctl(t, NULL, "status", NULL), 0);
    CHECK(strstr(out, "BACKEND") == NULL);
    CHECK_EQ(run_ctl(t, NULL, "-o", "wide", "status", NULL), 0);
    CHECK_STR_HAS(out, "state        ready (4/4 workers ready)");
    CHECK_STR_HAS(out, "BACKEND");
    CHECK_STR_HAS(out, "HOST");
    CHECK_EQ(run_ctl(t, NULL, "--output", "wide", "workers", NULL), 0);
    CHECK_STR_HAS(out, "BACKEND");
    CHECK_EQ(run_ctl(t, NULL, "-o", "xml", "status", NULL), 64);
    CHECK_STR_HAS(err, "-o \"xml\": expected table, wide, json or yaml");
    /* a value missing at the end */
    CHECK_EQ(run_ctl(t, NULL, "shards", "--layer", NULL), 64);
    CHECK_STR_HAS(err, "epmoectl shards: --layer needs a value");
    CHECK_EQ(run_ctl(t, NULL, "status", "--wait-ready", "--wait-timeout", NULL), 64);
    CHECK_STR_HAS(err, "epmoectl status: --wait-timeout needs a value");
    /* last: Python takes longer than the fake workers' heartbeats may wait */
    for (size_t v = 0; v < N_VERBS; v++) {
        int same = same_tree(yp[v], jp[v]);
        if (same == 77)
            printf("  (python3-yaml missing: YAML not compared)\n");
        else
            CHECK_EQ(same, 0);
    }
    FINISH(t);
}

/* Write the forward input file: hidden_states BF16 [T, H] (and input_ids I64 [T]). */
static int write_input(const char *path, int T, const uint16_t *hidden, const int64_t *ids)
{
    ep_err e;
    st_writer *w = st_writer_create();
    int64_t sh[2] = {T, IT_H}, si[1] = {T};
    int rc = st_writer_add(w, "hidden_states", ST_BF16, 2, sh, hidden, &e);
    if (rc == 0 && ids)
        rc = st_writer_add(w, "input_ids", ST_I64, 1, si, ids, &e);
    if (rc == 0)
        rc = st_writer_write(w, path, &e);
    st_writer_destroy(&w);
    return rc;
}

/* epmoectl forward runs on libepmoe: on a data_plane nccl cluster (the collective plane's
 * steps have no entry workers yet) it says so and exits 1; the input is not read first. The
 * forward itself is test_cluster.sh's and test_serve.sh's (real workers). */
TEST(forward_on_the_nccl_plane_is_refused_clearly)
{
    itest *t = start_plane("fp8", true, true);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    char in_path[160], out_path[160];
    snprintf(in_path, sizeof in_path, "%s/in.safetensors", t->dir);
    snprintf(out_path, sizeof out_path, "%s/out.safetensors", t->dir);
    enum { T = 5 };
    static uint16_t hidden[T * IT_H];
    static int64_t ids[T];
    it_make_input(T, 21, hidden, ids);
    CHECK_EQ(write_input(in_path, T, hidden, ids), 0);
    CHECK_EQ(run_ctl(t, NULL, "forward", "--layer", "layers.2", "--input", in_path, "--output",
                     out_path, NULL),
             1);
    CHECK_STR_HAS(err, "nccl");
    CHECK(access(out_path, F_OK) != 0);
    unlink(in_path);
    FINISH(t);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s PATH/epmoe-coordinator PATH/epmoectl\n", argv[0]);
        return 2;
    }
    coord_bin = argv[1];
    ctl_bin = argv[2];
    RUN(status_and_workers_json);
    RUN(shards_and_config_json);
    RUN(wait_ready_and_dead_endpoint);
    RUN(forward_on_the_nccl_plane_is_refused_clearly);
    RUN(yaml_wide_and_output_forms);
    return test_report();
}
