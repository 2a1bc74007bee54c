/*
 * test_spec.c — the cluster spec loader (coordinator/spec.h, docs/cluster-spec.md).
 *
 * Expected values come from the spec texts below: positions (LINE:COLUMN, 1-based) are counted
 * by hand from the literal text, and each broken spec breaks exactly one rule. Most specs are
 * built from the line macros below, so the counting is done once:
 *
 *   line 1  cluster: {name: c1}
 *   line 2  coordinator: {listen: "tcp://c:7400", admin: "ipc://c:7401"}
 *   line 3  model: {path: /m}
 *   line 4  nodes:
 *   line 5    - name: n0
 *   line 6      workers:
 *   line 7+       - {name: w0, device: cpu, data: "tcp://h:7500"}
 *
 * In a worker line the mapping '{' is column 9 and the name value column 16; with a 2-letter
 * name the device value is column 28, and with device "cpu" the data value is column 39.
 */
#include "coordinator/spec.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/auth.h"
#include "coordinator/keys.h"
#include "test.h"

#define TFILE "/etc/epmoe/t.yaml"

#define L_CLUSTER          "cluster: {name: c1}\n"
#define L_COORD            "coordinator: {listen: \"tcp://c:7400\", admin: \"ipc://c:7401\"}\n"
#define L_MODEL            "model: {path: /m}\n"
#define L_NODES            "nodes:\n  - name: n0\n    workers:\n"
#define HEAD               L_CLUSTER L_COORD L_MODEL L_NODES /* lines 1-6; workers start on line 7 */
#define W(name, dev, data) "      - {name: " name ", device: " dev ", data: \"" data "\"}\n"
#define W0                 W("w0", "cpu", "tcp://h:7500")

static ep_err err;

static spec_cluster *parse_as(const char *text, const char *file)
{
    ep_err_clear(&err);
    return spec_parse(text, strlen(text), file, &err);
}

/* The error message of a spec that must not parse ("" when it parsed). */
static const char *parse_error(const char *text)
{
    spec_cluster *s = parse_as(text, TFILE);
    if (s != NULL) {
        spec_free(&s);
        return "";
    }
    return err.msg;
}

/* The spec must fail with a message that starts "TFILE:POS: " and contains needle. */
#define EXPECT_ERR(text, pos, needle)                                                              \
    do {                                                                                           \
        const char *msg_ = parse_error(text);                                                      \
        const char *want_ = TFILE ":" pos ": ";                                                    \
        if (strncmp(msg_, want_, strlen(want_)) != 0)                                              \
            TEST_FAIL_AT("expected an error at %s, got \"%s\"", pos, msg_);                        \
        CHECK_STR_HAS(msg_, needle);                                                               \
    } while (0)

/* The schema's own example (docs/cluster-spec.md), with every optional field set away from
 * its default so that defaults cannot pass for parsed values. */
static const char full_spec[] =
    "cluster:\n"                                                              /* 1 */
    "  name: dsv4-flash\n"                                                    /* 2 */
    "coordinator:\n"                                                          /* 3 */
    "  listen: \"tcp://0.0.0.0:7400\"\n"                                      /* 4 */
    "  admin: \"tcp://127.0.0.1:7401\"\n"                                     /* 5 */
    "  heartbeat_ms: 500\n"                                                   /* 6 */
    "  liveness: 5\n"                                                         /* 7 */
    "  step_timeout_ms: 20000\n"                                              /* 8 */
    "model:\n"                                                                /* 9 */
    "  path: /models/DeepSeek-V4-Flash\n"                                     /* 10 */
    "expert_parallel:\n"                                                      /* 11 */
    "  placement: round_robin\n"                                              /* 12 */
    "  redundant_experts: 0\n"                                                /* 13 */
    "  dispatch: bf16\n"                                                      /* 14 */
    "nodes:\n"                                                                /* 15 */
    "  - name: node-a\n"                                                      /* 16 */
    "    workers:\n"                                                          /* 17 */
    "      - {name: a0, device: \"cpu\", data: \"tcp://10.0.0.1:7500\"}\n"    /* 18 */
    "      - {name: a1, device: \"cuda:1\", data: \"tcp://10.0.0.1:7501\"}\n" /* 19 */
    "  - name: node-b\n"                                                      /* 20 */
    "    workers:\n"                                                          /* 21 */
    "      - name: b0\n"                                                      /* 22 */
    "        device: cuda:0\n"                                                /* 23 */
    "        data: ipc:///tmp/b0.sock\n";                                     /* 24 */

TEST(full_example_parses_to_its_values)
{
    spec_cluster *s = parse_as(full_spec, TFILE);
    CHECK(s != NULL);
    if (s == NULL) {
        printf("  %s\n", err.msg);
        return;
    }
    CHECK_STR_EQ(s->file, TFILE);
    CHECK_STR_EQ(s->name, "dsv4-flash");
    CHECK_STR_EQ(s->listen, "tcp://0.0.0.0:7400");
    CHECK_STR_EQ(s->admin, "tcp://127.0.0.1:7401");
    CHECK_EQ(s->heartbeat_ms, 500);
    CHECK_EQ(s->liveness, 5);
    CHECK_EQ(s->step_timeout_ms, 20000);
    CHECK_STR_EQ(s->model_path, "/models/DeepSeek-V4-Flash");
    CHECK_EQ(s->placement, SPEC_PLACE_ROUND_ROBIN);
    CHECK_EQ(s->redundant_experts, 0);
    CHECK_EQ(s->dispatch, SPEC_DISPATCH_BF16);
    CHECK_STR_EQ(spec_placement_name(s->placement), "round_robin");
    CHECK_STR_EQ(spec_dispatch_name(s->dispatch), "bf16");

    CHECK_EQ(s->n_nodes, 2);
    CHECK_EQ(s->n_workers, 3);
    if (s->n_nodes != 2 || s->n_workers != 3) {
        spec_free(&s);
        return;
    }
    CHECK_EQ(s->nodes_pos.line, 15);
    CHECK_EQ(s->nodes_pos.col, 1);
    CHECK_STR_EQ(s->nodes[0].name, "node-a");
    CHECK_EQ(s->nodes[0].first_worker, 0);
    CHECK_EQ(s->nodes[0].n_workers, 2);
    CHECK_STR_EQ(s->nodes[1].name, "node-b");
    CHECK_EQ(s->nodes[1].first_worker, 2);
    CHECK_EQ(s->nodes[1].n_workers, 1);
    CHECK_EQ(s->nodes[1].pos.line, 20);
    CHECK_EQ(s->nodes[1].pos.col, 5);

    const spec_worker *w = s->workers;
    CHECK_STR_EQ(w[0].name, "a0");
    CHECK_STR_EQ(w[0].node, "node-a");
    CHECK_STR_EQ(w[0].device, "cpu");
    CHECK_EQ(w[0].cuda_index, -1);
    CHECK_STR_EQ(w[0].data, "tcp://10.0.0.1:7500");
    CHECK_EQ(w[0].rank, 0);
    CHECK_EQ(w[0].pos.line, 18);
    CHECK_EQ(w[0].pos.col, 9);

    CHECK_STR_EQ(w[1].name, "a1");
    CHECK_STR_EQ(w[1].device, "cuda:1");
    CHECK_EQ(w[1].cuda_index, 1);
    CHECK_EQ(w[1].rank, 1);
    CHECK_EQ(w[1].name_pos.line, 19);
    CHECK_EQ(w[1].name_pos.col, 16);
    CHECK_EQ(w[1].device_pos.col, 28);
    CHECK_EQ(w[1].data_pos.col, 44); /* device "cuda:1" is quoted here */

    CHECK_STR_EQ(w[2].name, "b0");
    CHECK_STR_EQ(w[2].node, "node-b");
    CHECK_STR_EQ(w[2].device, "cuda:0");
    CHECK_EQ(w[2].cuda_index, 0);
    CHECK_STR_EQ(w[2].data, "ipc:///tmp/b0.sock");
    CHECK_EQ(w[2].rank, 2);
    CHECK_EQ(w[2].node_index, 1);
    CHECK_EQ(w[2].pos.line, 22);
    CHECK_EQ(w[2].pos.col, 9);
    CHECK_EQ(w[2].data_pos.line, 24);
    CHECK_EQ(w[2].data_pos.col, 15);

    CHECK_EQ(s->listen_pos.line, 4);
    CHECK_EQ(s->listen_pos.col, 11);
    CHECK_EQ(s->admin_pos.line, 5);
    CHECK_EQ(s->admin_pos.col, 10);

    CHECK(spec_find_worker(s, "a1") == &s->workers[1]);
    CHECK(spec_find_worker(s, "b0") == &s->workers[2]);
    CHECK(spec_find_worker(s, "c0") == NULL);
    spec_free(&s);
    CHECK(s == NULL);
    spec_free(&s); /* tolerates NULL */
    spec_free(NULL);
}

TEST(omitted_fields_take_their_defaults)
{
    spec_cluster *s = parse_as(HEAD W0, TFILE);
    CHECK(s != NULL);
    if (s == NULL) {
        printf("  %s\n", err.msg);
        return;
    }
    CHECK_EQ(s->heartbeat_ms, 1000);
    CHECK_EQ(s->liveness, 3);
    CHECK_EQ(s->step_timeout_ms, 30000);
    CHECK_EQ(s->placement, SPEC_PLACE_CONTIGUOUS);
    CHECK_EQ(s->redundant_experts, 0);
    CHECK_EQ(s->dispatch, SPEC_DISPATCH_FP8);
    CHECK_EQ(s->rejoin, SPEC_REJOIN_RESTORE);
    CHECK_EQ(s->max_experts_per_worker, 0);
    CHECK_STR_EQ(spec_placement_name(s->placement), "contiguous");
    CHECK_STR_EQ(spec_dispatch_name(s->dispatch), "fp8");
    CHECK_EQ(s->data_plane, SPEC_PLANE_ZMQ);
    CHECK_STR_EQ(spec_data_plane_name(s->data_plane), "zmq");
    CHECK_STR_EQ(s->listen, "tcp://c:7400");
    CHECK_EQ(s->n_workers, 1);
    spec_free(&s);
}

TEST(integer_bounds_are_inclusive)
{
    spec_cluster *s =
        parse_as(L_CLUSTER
                 "coordinator: {listen: \"tcp://*:1\", admin: \"tcp://127.0.0.1:65535\", "
                 "heartbeat_ms: 60000, liveness: 1, step_timeout_ms: 3600000}\n" L_MODEL L_NODES W0,
                 TFILE);
    CHECK(s != NULL);
    if (s != NULL) {
        CHECK_STR_EQ(s->listen, "tcp://*:1"); /* the coordinator may bind all interfaces */
        CHECK_STR_EQ(s->admin, "tcp://127.0.0.1:65535");
        CHECK_EQ(s->heartbeat_ms, 60000);
        CHECK_EQ(s->liveness, 1);
        CHECK_EQ(s->step_timeout_ms, 3600000);
    }
    spec_free(&s);
}

static void check_model_path(const char *path_in_spec, const char *file, const char *want)
{
    char text[512];
    snprintf(text, sizeof text, L_CLUSTER L_COORD "model: {path: \"%s\"}\n" L_NODES W0,
             path_in_spec);
    spec_cluster *s = parse_as(text, file);
    CHECK(s != NULL);
    if (s != NULL)
        CHECK_STR_EQ(s->model_path, want);
    else
        printf("  %s\n", err.msg);
    spec_free(&s);
}

TEST(relative_model_paths_resolve_against_the_spec_directory)
{
    check_model_path("models/m", "/etc/epmoe/c.yaml", "/etc/epmoe/models/m");
    check_model_path("../m", "/etc/epmoe/c.yaml", "/etc/epmoe/../m");
    check_model_path("models/m", "/c.yaml", "/models/m");
    check_model_path("models/m", "conf/c.yaml", "conf/models/m");
    check_model_path("models/m", "c.yaml", "models/m"); /* no directory part: stays relative */
    check_model_path("/abs/m", "/etc/epmoe/c.yaml", "/abs/m");
}

TEST(spec_load_resolves_against_the_real_directory)
{
    char dir[] = "/tmp/epmoe-spec-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[256], real[PATH_MAX], want[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/c.yaml", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f == NULL)
        return;
    fputs(L_CLUSTER L_COORD "model: {path: models/m}\n" L_NODES W0, f);
    fclose(f);
    CHECK(realpath(dir, real) != NULL);
    snprintf(want, sizeof want, "%s/models/m", real);

    ep_err_clear(&err);
    spec_cluster *s = spec_load(path, &err);
    CHECK(s != NULL);
    if (s != NULL) {
        CHECK_STR_EQ(s->file, path);
        CHECK_STR_EQ(s->model_path, want);
    }
    spec_free(&s);
    unlink(path);

    s = spec_load(path, &err);
    CHECK(s == NULL);
    CHECK_STR_HAS(err.msg, path);
    CHECK_STR_HAS(err.msg, "cannot open cluster spec");
    rmdir(dir);
}

TEST(example_specs_parse)
{
    const char *src = getenv("EPMOE_SOURCE_DIR");
    if (src == NULL)
        SKIP("EPMOE_SOURCE_DIR is not set (run through ctest)");
    char path[1024];
    snprintf(path, sizeof path, "%s/deploy/examples/local.yaml", src);
    spec_cluster *s = spec_load(path, &err);
    CHECK(s != NULL);
    if (s != NULL) {
        CHECK_EQ(s->n_workers, 4);
        CHECK_STR_EQ(s->listen, "tcp://127.0.0.1:7400");
        CHECK_STR_EQ(s->admin, "tcp://127.0.0.1:7401");
        for (int i = 0; i < s->n_workers; i++) {
            char data[64];
            snprintf(data, sizeof data, "tcp://127.0.0.1:%d", 7500 + i);
            CHECK_STR_EQ(s->workers[i].data, data);
            CHECK_STR_EQ(s->workers[i].device, "cpu");
        }
        CHECK_STR_HAS(s->model_path, "/out/demo-model");
        CHECK(s->model_path[0] == '/');
    } else {
        printf("  %s\n", err.msg);
    }
    spec_free(&s);

    snprintf(path, sizeof path, "%s/deploy/examples/two-nodes.yaml", src);
    s = spec_load(path, &err);
    CHECK(s != NULL);
    if (s != NULL) {
        CHECK_EQ(s->n_nodes, 2);
        CHECK_EQ(s->n_workers, 8);
        for (int i = 0; i < s->n_workers; i++) {
            CHECK_EQ(s->workers[i].rank, i);
            CHECK_EQ(s->workers[i].cuda_index, i % 4);
            CHECK_EQ(s->workers[i].node_index, i / 4);
        }
        CHECK_EQ(spec_check_experts(s, 256, &err), 0); /* V4 Flash: 256 experts / 8 workers */
    } else {
        printf("  %s\n", err.msg);
    }
    spec_free(&s);
}

/* ---- error classes ---------------------------------------------------------------------- */

TEST(unknown_keys_are_named_with_the_allowed_set)
{
    const char *msg = parse_error(L_CLUSTER "coordinator:\n"              /* 2 */
                                            "  listn: \"tcp://*:7400\"\n" /* 3 */
                                            "  admin: \"tcp://*:7401\"\n" /* 4 */
                                  L_MODEL L_NODES W0);
    CHECK_STR_EQ(msg, TFILE ":3:3: unknown key \"listn\" in coordinator (expected one of listen, "
                            "admin, heartbeat_ms, liveness, step_timeout_ms, metrics)");
    EXPECT_ERR(HEAD W0 "extra: 1\n", "8:1",
               "unknown key \"extra\" at the top level (expected one of cluster, coordinator, "
               "model, expert_parallel, nodes, security)");
    EXPECT_ERR(HEAD "      - {name: w0, device: cpu, data: \"tcp://h:7500\", gpu: 1}\n", "7:55",
               "unknown key \"gpu\" in nodes[0].workers[0] (expected one of name, device, data, "
               "metrics, client)");
    EXPECT_ERR(L_CLUSTER L_COORD L_MODEL "expert_parallel: {placment: contiguous}\n" L_NODES W0,
               "4:19", "unknown key \"placment\" in expert_parallel");
}

TEST(wrong_node_types_are_explained)
{
    EXPECT_ERR("cluster:\n"  /* 1: the value is empty, at the end of the key */
               "name: c1\n", /* 2: meant to be indented */
               "1:9", "cluster: expected a mapping (check indentation), found an empty value");
    EXPECT_ERR(L_CLUSTER "coordinator: \"tcp://*:7400\"\n", "2:14",
               "coordinator: expected a mapping (check indentation), found \"tcp://*:7400\"");
    EXPECT_ERR(L_CLUSTER L_COORD L_MODEL "nodes: {name: n0}\n", "4:8",
               "nodes: expected a sequence of nodes (check indentation), found a mapping");
    EXPECT_ERR(HEAD "      - w0\n", "7:9",
               "nodes[0].workers[0]: expected a mapping (check indentation), found \"w0\"");
    EXPECT_ERR("cluster: {name: [c1]}\n", "1:17",
               "cluster.name: expected a name, found a sequence");
    EXPECT_ERR("cluster: {name: ~}\n", "1:17",
               "cluster.name: expected a name, found an empty value");
    EXPECT_ERR("cluster: {name: \"a\\0b\"}\n", "1:17",
               "cluster.name: the value contains a NUL byte");
    EXPECT_ERR("{[a, b]: 1}\n", "1:2", "top level: expected a scalar key, found a sequence");
}

TEST(integers_are_checked_for_form_and_range)
{
#define COORD_WITH(extra)                                                                          \
    L_CLUSTER "coordinator: {listen: \"tcp://c:7400\", admin: \"ipc://c:7401\", " extra            \
              "}\n" L_MODEL L_NODES W0
    /* everything before extra takes 61 columns, so its value starts at 62 + strlen(key: ) */
    EXPECT_ERR(COORD_WITH("heartbeat_ms: abc"), "2:76",
               "coordinator.heartbeat_ms: expected an integer, found \"abc\"");
    EXPECT_ERR(COORD_WITH("heartbeat_ms: 5"), "2:76",
               "coordinator.heartbeat_ms: 5 is out of range (expected 10..60000)");
    EXPECT_ERR(COORD_WITH("liveness: 101"), "2:72",
               "coordinator.liveness: 101 is out of range (expected 1..100)");
    EXPECT_ERR(COORD_WITH("liveness: 0"), "2:72", "out of range (expected 1..100)");
    EXPECT_ERR(COORD_WITH("liveness: -3"), "2:72", "-3 is out of range");
    EXPECT_ERR(COORD_WITH("liveness: 99999999999999999999"), "2:72",
               "99999999999999999999 is out of range");
    EXPECT_ERR(COORD_WITH("step_timeout_ms: 99"), "2:79", "(expected 100..3600000)");
    EXPECT_ERR(COORD_WITH("liveness: 3.0"), "2:72", "expected an integer, found \"3.0\"");
    EXPECT_ERR(COORD_WITH("liveness: +3"), "2:72", "expected an integer, found \"+3\"");
    EXPECT_ERR(COORD_WITH("liveness: 0x3"), "2:72", "expected an integer, found \"0x3\"");
    EXPECT_ERR(COORD_WITH("liveness: \" 3\""), "2:72", "expected an integer, found \" 3\"");
    EXPECT_ERR(COORD_WITH("liveness: {}"), "2:72", "expected an integer, found a mapping");
#undef COORD_WITH
}

TEST(missing_required_keys_point_at_the_enclosing_mapping)
{
    EXPECT_ERR(L_CLUSTER "coordinator:\n"               /* 2 */
                         "  listen: \"tcp://*:7400\"\n" /* 3: the mapping starts here */
               L_MODEL L_NODES W0,
               "3:3", "coordinator: missing required key \"admin\"");
    EXPECT_ERR(L_CLUSTER L_COORD L_MODEL, "1:1", "top level: missing required key \"nodes\"");
    EXPECT_ERR("cluster: {}\n", "1:10", "cluster: missing required key \"name\"");
    EXPECT_ERR(HEAD "      - {name: w0, data: \"tcp://h:7500\"}\n", "7:9",
               "nodes[0].workers[0]: missing required key \"device\"");
    EXPECT_ERR(L_CLUSTER L_COORD L_MODEL "nodes:\n  - name: n0\n", "5:5",
               "nodes[0]: missing required key \"workers\"");
}

TEST(duplicate_keys_are_rejected)
{
    EXPECT_ERR("cluster: {name: a, name: b}\n", "1:20",
               "duplicate key \"name\" in cluster (first at line 1, column 11)");
    EXPECT_ERR(HEAD W0 L_MODEL, "8:1",
               "duplicate key \"model\" at the top level (first at line 3, "
               "column 1)");
}

TEST(duplicate_worker_names_name_the_first)
{
    EXPECT_ERR(L_CLUSTER L_COORD L_MODEL "nodes:\n"       /* 4 */
                                         "  - name: n0\n" /* 5 */
                                         "    workers:\n" /* 6 */
               W("w0", "cpu", "tcp://h:7500")             /* 7 */
               "  - name: n1\n"                           /* 8 */
               "    workers:\n"                           /* 9 */
               W("w0", "cpu", "tcp://h:7501"),            /* 10 */
               "10:16",
               "nodes[1].workers[0].name: duplicate worker name \"w0\" (first defined at line 7, "
               "column 16)");
    EXPECT_ERR(L_CLUSTER L_COORD L_MODEL
               "nodes:\n"                                                                   /* 4 */
               "  - {name: n0, workers: [{name: w0, device: cpu, data: \"tcp://h:1\"}]}\n"  /* 5 */
               "  - {name: n0, workers: [{name: w1, device: cpu, data: \"tcp://h:2\"}]}\n", /* 6 */
               "6:12",
               "nodes[1].name: duplicate node name \"n0\" (first defined at line 5, column 12)");
}

TEST(duplicate_data_endpoints_are_rejected)
{
    EXPECT_ERR(
        HEAD W0 W("w1", "cpu", "tcp://h:7500"), "8:39",
        "nodes[0].workers[1].data: duplicate data endpoint \"tcp://h:7500\" (already used by "
        "worker w0 at line 7, column 39)");
    EXPECT_ERR(HEAD W("w0", "cpu", "tcp://*:7400"), "7:39", "peers connect to it");
    EXPECT_ERR(
        L_CLUSTER
        "coordinator: {listen: \"tcp://h:7400\", admin: \"tcp://*:7401\"}\n" L_MODEL L_NODES W(
            "w0", "cpu", "tcp://h:7400"),
        "7:39",
        "nodes[0].workers[0].data: duplicate data endpoint \"tcp://h:7400\" (already used by "
        "coordinator.listen at line 2, column 23)");
    EXPECT_ERR(
        L_CLUSTER
        "coordinator: {listen: \"tcp://*:7400\", admin: \"tcp://*:7400\"}\n" L_MODEL L_NODES W0,
        "2:46", "coordinator.admin: endpoint \"tcp://*:7400\" is also coordinator.listen");
}

TEST(bad_devices_list_the_accepted_forms)
{
    const char *bad[] = {"gpu0", "cuda:256", "cuda:01", "cuda:", "cuda:-1", "cuda:1a", "CPU"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[512];
        snprintf(text, sizeof text,
                 HEAD "      - {name: w0, device: \"%s\", data: \"tcp://h:1\"}\n", bad[i]);
        EXPECT_ERR(text, "7:28", "nodes[0].workers[0].device: bad device \"");
        EXPECT_ERR(text, "7:28", "(expected \"cpu\" or \"cuda:N\" with N 0..255)");
    }
    spec_cluster *s = parse_as(HEAD W("w0", "cuda:255", "tcp://h:1"), TFILE);
    CHECK(s != NULL);
    if (s != NULL)
        CHECK_EQ(s->workers[0].cuda_index, 255);
    spec_free(&s);
}

TEST(workers_may_share_a_gpu_and_gpu_gemm_is_a_choice)
{
    /* two workers on one GPU (several small workers per device; the ZeroMQ plane allows it) */
    spec_cluster *s =
        parse_as(HEAD W("w0", "cuda:1", "tcp://h:1") W("w1", "cuda:1", "tcp://h:2"), TFILE);
    CHECK(s != NULL);
    if (s != NULL)
        CHECK_EQ((int)s->gpu_gemm, (int)SPEC_GPU_GEMM_EXACT);
    spec_free(&s);
    const char *ep = "cluster: {name: t}\n"
                     "coordinator: {listen: \"tcp://127.0.0.1:1\", admin: \"tcp://127.0.0.1:2\"}\n"
                     "model: {path: /m}\n"
                     "expert_parallel: {gpu_gemm: %s}\n"
                     "nodes:\n"
                     "  - name: n0\n"
                     "    workers:\n"
                     "      - {name: w0, device: \"cuda:0\", data: \"tcp://h:1\"}\n";
    char text[1024];
    snprintf(text, sizeof text, ep, "fast");
    s = parse_as(text, TFILE);
    CHECK(s != NULL);
    if (s != NULL)
        CHECK_EQ((int)s->gpu_gemm, (int)SPEC_GPU_GEMM_FAST);
    spec_free(&s);
    snprintf(text, sizeof text, ep, "tensor");
    EXPECT_ERR(text, "4:29", "expert_parallel.gpu_gemm: ");
    EXPECT_ERR(text, "4:29", "\"tensor\"");
}

TEST(bad_endpoints_say_what_is_wrong)
{
    const struct {
        const char *ep, *why;
    } bad[] = {
        {"tcp://10.0.0.1", "no :PORT"},
        {"tcp://h:0", "the port is out of range"},
        {"tcp://h:65536", "the port is out of range"},
        {"tcp://h:*", "the port is not a number"},
        {"tcp://h:", "the port is not a number"},
        {"tcp://:7500", "bad host"},
        {"tcp://h h:7500", "bad host"},
        {"tcp://[::1:7500", "bad host"},
        {"tcp://*:7500", "peers connect to it, so the host cannot be *"},
        {"http://h:80", "unsupported transport"},
        {"ipc://", "empty ipc path"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[512], want[128];
        snprintf(text, sizeof text, HEAD "      - {name: w0, device: cpu, data: \"%s\"}\n",
                 bad[i].ep);
        snprintf(want, sizeof want, "nodes[0].workers[0].data: bad endpoint \"%s\": %s", bad[i].ep,
                 bad[i].why);
        EXPECT_ERR(text, "7:39", want);
        EXPECT_ERR(text, "7:39", "(expected tcp://HOST:PORT with PORT 1..65535, or ipc://PATH)");
    }
    char longipc[256] = "ipc:///";
    memset(longipc + 7, 'x', 107); /* path "/xxx..." of 108 bytes: sun_path holds 107 */
    char text[512];
    snprintf(text, sizeof text, HEAD "      - {name: w0, device: cpu, data: \"%s\"}\n", longipc);
    EXPECT_ERR(text, "7:39", "ipc path longer than 107 bytes");
    longipc[7 + 106] = '\0'; /* 107 bytes: fits */
    snprintf(text, sizeof text, HEAD "      - {name: w0, device: cpu, data: \"%s\"}\n", longipc);
    CHECK_STR_EQ(parse_error(text), "");

    EXPECT_ERR(L_CLUSTER
               "coordinator: {listen: \"tcp://*:7400\", admin: \"udp://h:1\"}\n" L_MODEL L_NODES W0,
               "2:46", "coordinator.admin: bad endpoint \"udp://h:1\": unsupported transport");
    const char *good[] = {"tcp://[::1]:7500", "tcp://host-1.example.com:1", "ipc://@abstract"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        snprintf(text, sizeof text, HEAD "      - {name: w0, device: cpu, data: \"%s\"}\n",
                 good[i]);
        CHECK_STR_EQ(parse_error(text), "");
    }
}

TEST(bad_names_are_rejected)
{
    EXPECT_ERR("cluster: {name: \"a b\"}\n", "1:17",
               "cluster.name: bad name \"a b\" (expected 1..63 characters from A-Z a-z 0-9 . _ -)");
    char text[256];
    char name[65];
    memset(name, 'n', 64);
    name[64] = '\0';
    snprintf(text, sizeof text, "cluster: {name: %s}\n", name);
    EXPECT_ERR(text, "1:17", "cluster.name: bad name");
    name[63] = '\0'; /* 63 characters: fits */
    snprintf(text, sizeof text, "cluster: {name: %s}\n" L_COORD L_MODEL L_NODES W0, name);
    CHECK_STR_EQ(parse_error(text), "");
    EXPECT_ERR(L_CLUSTER L_COORD L_MODEL "nodes:\n  - name: n/0\n", "5:11",
               "nodes[0].name: bad name \"n/0\"");
}

TEST(bad_choices_list_the_allowed_values)
{
    EXPECT_ERR(L_CLUSTER L_COORD L_MODEL "expert_parallel: {placement: spread}\n" L_NODES W0,
               "4:30",
               "expert_parallel.placement: unknown placement \"spread\" (expected one of "
               "contiguous, round_robin, eplb)");
    EXPECT_ERR(L_CLUSTER L_COORD L_MODEL "expert_parallel: {dispatch: fp16}\n" L_NODES W0, "4:29",
               "expert_parallel.dispatch: unknown dispatch format \"fp16\" (expected one of fp8, "
               "bf16)");
    EXPECT_ERR(L_CLUSTER L_COORD L_MODEL "expert_parallel: {redundant_experts: -2}\n" L_NODES W0,
               "4:38", "expert_parallel.redundant_experts: -2 is out of range (expected 0..");
    EXPECT_ERR(L_CLUSTER L_COORD L_MODEL "expert_parallel: {window_steps: 0}\n" L_NODES W0, "4:33",
               "expert_parallel.window_steps: 0 is out of range (expected 1..100000)");
    EXPECT_ERR(L_CLUSTER L_COORD L_MODEL "expert_parallel: {rejoin: back}\n" L_NODES W0, "4:27",
               "expert_parallel.rejoin: unknown rejoin policy \"back\" (expected one of restore, "
               "stay)");
    EXPECT_ERR(L_CLUSTER L_COORD L_MODEL
               "expert_parallel: {max_experts_per_worker: -1}\n" L_NODES W0,
               "4:43",
               "expert_parallel.max_experts_per_worker: -1 is out of range (expected "
               "0..4096)");
}

/* rejoin and max_experts_per_worker: parsed, and the limit checked against the placement. */
TEST(failover_rules_parse_and_the_limit_must_hold_the_placement)
{
    const char *text = L_CLUSTER L_COORD L_MODEL
        "expert_parallel: {rejoin: stay, max_experts_per_worker: 3}\n" /* 4 */
        "nodes:\n"
        "  - name: n0\n"
        "    workers:\n" W("w0", "cpu", "tcp://h:1") W("w1", "cpu", "tcp://h:2")
            W("w2", "cpu", "tcp://h:3");
    spec_cluster *s = parse_as(text, TFILE);
    CHECK(s != NULL);
    if (s == NULL)
        return;
    CHECK_EQ(s->rejoin, SPEC_REJOIN_STAY);
    CHECK_STR_EQ(spec_rejoin_name(s->rejoin), "stay");
    CHECK_EQ(s->max_experts_per_worker, 3);
    CHECK_EQ(spec_check_experts(s, 9, &err), 0); /* 3 each */
    CHECK_EQ(spec_check_experts(s, 12, &err), -1);
    CHECK_STR_HAS(err.msg, TFILE ":4:57: expert_parallel.max_experts_per_worker: 3 is less than "
                                 "the 4 experts the placement gives a worker (12 experts over 3 "
                                 "workers)");
    spec_free(&s);
}

/* Issue 9: eplb with redundant experts, groups, the load window, metrics addresses. */
TEST(eplb_and_metrics_settings)
{
    const char *text =
        L_CLUSTER "coordinator: {listen: \"tcp://*:7400\", admin: \"tcp://127.0.0.1:7401\", "
                  "metrics: \"127.0.0.1:9400\"}\n" /* 2 */
        L_MODEL "expert_parallel: {placement: eplb, redundant_experts: 6, expert_groups: 2, "
                  "window_steps: 50, rebalance_every_steps: 100}\n" /* 4 */
                  "nodes:\n"
                  "  - name: n0\n"
                  "    workers:\n" W("w0", "cpu", "tcp://h:1") /* 8 */
        "      - {name: w1, device: cpu, data: \"tcp://h:2\", metrics: \"127.0.0.1:9401\"}\n" W(
            "w2", "cpu", "tcp://h:3");
    spec_cluster *s = parse_as(text, TFILE);
    CHECK(s != NULL);
    if (s == NULL)
        return;
    CHECK_EQ(s->placement, SPEC_PLACE_EPLB);
    CHECK_STR_EQ(spec_placement_name(s->placement), "eplb");
    CHECK_EQ(s->redundant_experts, 6);
    CHECK_EQ(s->expert_groups, 2);
    CHECK_EQ(s->window_steps, 50);
    CHECK_EQ(s->rebalance_every_steps, 100);
    CHECK_STR_EQ(s->metrics, "127.0.0.1:9400");
    CHECK_STR_EQ(s->workers[0].metrics, "");
    CHECK_STR_EQ(s->workers[1].metrics, "127.0.0.1:9401");
    CHECK_EQ(spec_check_experts(s, 8, &err), 0); /* 14 slots on 3 workers */
    CHECK_EQ(spec_check_experts(s, 7, &err), -1);
    CHECK_STR_HAS(err.msg, "expert_parallel.expert_groups: 2 groups do not divide the model's 7");
    CHECK_EQ(spec_check_experts(s, 2, &err), -1); /* 8 slots, at most 2 x 3 */
    CHECK_STR_HAS(err.msg, TFILE ":4:55: expert_parallel.redundant_experts: 2 experts + 6 "
                                 "redundant need more than one replica");
    s->placement = SPEC_PLACE_CONTIGUOUS;
    CHECK_EQ(spec_check_experts(s, 12, &err), -1);
    CHECK_STR_HAS(err.msg, "redundant_experts: 6 needs placement eplb");
    spec_free(&s);
    /* defaults */
    s = parse_as(HEAD W0, TFILE);
    CHECK(s && s->window_steps == 1000 && s->expert_groups == 1 && s->redundant_experts == 0 &&
          s->rebalance_every_steps == 0 && s->metrics[0] == '\0');
    spec_free(&s);
    /* bad addresses, duplicates */
    EXPECT_ERR(L_CLUSTER "coordinator: {listen: \"tcp://*:1\", admin: \"tcp://h:2\", metrics: "
                         "\"tcp://h:3\"}\n" L_MODEL L_NODES W0,
               "2:65", "coordinator.metrics: bad metrics address \"tcp://h:3\": no scheme");
    EXPECT_ERR(HEAD "      - {name: w0, device: cpu, data: \"tcp://h:1\", metrics: \"h:99999\"}\n",
               "7:61",
               "nodes[0].workers[0].metrics: bad metrics address \"h:99999\": the port is "
               "out of range");
    EXPECT_ERR(HEAD "      - {name: w0, device: cpu, data: \"tcp://h:1\", metrics: \"h:9\"}\n"
                    "      - {name: w1, device: cpu, data: \"tcp://h:2\", metrics: \"h:9\"}\n",
               "8:61", "nodes[0].workers[1].metrics: duplicate metrics address \"h:9\"");
}

/* data_plane sits on line 4 ("expert_parallel: {data_plane: nccl}": the value at column 31),
 * so the workers start on line 8. */
#define L_NCCL "expert_parallel: {data_plane: nccl}\n"

TEST(nccl_data_plane_needs_gpu_workers_and_fp8)
{
    const char *ok = L_CLUSTER L_COORD L_MODEL L_NCCL L_NODES W("w0", "cuda:0", "tcp://h:7500")
        W("w1", "cuda:1", "tcp://h:7501");
    spec_cluster *s = parse_as(ok, TFILE);
    CHECK(s != NULL);
    if (s != NULL) {
        CHECK_EQ(s->data_plane, SPEC_PLANE_NCCL);
        CHECK_STR_EQ(spec_data_plane_name(s->data_plane), "nccl");
        CHECK_EQ(s->data_plane_pos.line, 4);
        CHECK_EQ(s->data_plane_pos.col, 31);
        spec_free(&s);
    }
    /* the second worker's device value: line 9, column 28 */
    EXPECT_ERR(L_CLUSTER L_COORD L_MODEL L_NCCL L_NODES W("w0", "cuda:0", "tcp://h:7500")
                   W("w1", "cpu", "tcp://h:7501"),
               "9:28",
               "nodes[0].workers[1].device: data_plane nccl (line 4, column 31) requires every "
               "worker on a cuda:N device, worker w1 is on \"cpu\"");
    EXPECT_ERR(L_CLUSTER L_COORD L_MODEL
               "expert_parallel: {dispatch: bf16, data_plane: nccl}\n" L_NODES W("w0", "cuda:0",
                                                                                 "tcp://h:7500"),
               "4:29",
               "expert_parallel.dispatch: data_plane nccl (line 4, column 47) sends fp8 dispatch "
               "only, found bf16");
    EXPECT_ERR(L_CLUSTER L_COORD L_MODEL "expert_parallel: {data_plane: mpi}\n" L_NODES W0, "4:31",
               "expert_parallel.data_plane: unknown data plane \"mpi\" (expected one of zmq, "
               "nccl)");
    /* NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so the spec does: the
     * second worker's device value, line 9, column 28 */
    EXPECT_ERR(L_CLUSTER L_COORD L_MODEL L_NCCL L_NODES W("w0", "cuda:0", "tcp://h:7500")
                   W("w1", "cuda:0", "tcp://h:7501"),
               "9:28",
               "nodes[0].workers[1].device: device \"cuda:0\" is already used by worker w0 on "
               "this node (line 8, column 28); data_plane nccl (line 4, column 31) needs one "
               "worker per GPU");
    /* the same ordinal on two nodes is two GPUs */
    CHECK_STR_EQ(parse_error(L_CLUSTER L_COORD L_MODEL L_NCCL
                             "nodes:\n"
                             "  - name: n0\n"
                             "    workers:\n" W("w0", "cuda:0",
                                                "tcp://h:7500") "  - name: n1\n"
                                                                "    workers:\n" W("w1", "cuda:0",
                                                                                   "tcp://g:7500")),
                 "");
    /* the NCCL step driver routes by one owner per expert: no eplb, no replicas */
    EXPECT_ERR(L_CLUSTER L_COORD L_MODEL
               "expert_parallel: {placement: eplb, data_plane: nccl}\n" L_NODES W("w0", "cuda:0",
                                                                                  "tcp://h:7500"),
               "4:30", "routes by one owner per expert in every layer");
    /* zmq takes any device mix */
    CHECK_STR_EQ(parse_error(L_CLUSTER L_COORD L_MODEL
                             "expert_parallel: {data_plane: zmq}\n" L_NODES W0 W("w1", "cuda:0",
                                                                                 "tcp://h:7501")),
                 "");
}

TEST(empty_sequences_are_rejected)
{
    EXPECT_ERR(L_CLUSTER L_COORD L_MODEL "nodes: []\n", "4:8", "nodes: expected at least one node");
    EXPECT_ERR(L_CLUSTER L_COORD L_MODEL "nodes:\n  - name: n0\n    workers: []\n", "6:14",
               "nodes[0].workers: expected at least one worker");
}

TEST(anchors_aliases_and_tags_are_rejected)
{
    EXPECT_ERR(L_CLUSTER "coordinator: &co {listen: \"tcp://*:7400\", admin: \"tcp://*:7401\"}\n",
               "2:14", "anchors (&co) are not allowed in a cluster spec");
    EXPECT_ERR("cluster: {name: c1}\nother: *c\n", "2:8", "aliases (*c) are not allowed");
    EXPECT_ERR("cluster: {name: !!str c1}\n", "1:17",
               "tags (tag:yaml.org,2002:str) are not allowed");
    EXPECT_ERR("cluster: !custom {name: c1}\n", "1:10", "tags (!custom) are not allowed");
}

TEST(deep_nesting_is_rejected_while_loading)
{
    /* "a: " then 40 '[': the root mapping is level 1, so the 32nd '[' (column 3 + 32) would be
     * level 33. The document is otherwise valid YAML. */
    char text[128] = "a: ";
    for (int i = 0; i < 40; i++)
        strcat(text, "[");
    for (int i = 0; i < 40; i++)
        strcat(text, "]");
    strcat(text, "\n");
    EXPECT_ERR(text, "1:35", "nesting deeper than 32 levels");
    /* an unclosed deep document fails on depth too, before libyaml reaches its end */
    char *deep = malloc(100001);
    memset(deep, '[', 100000);
    deep[100000] = '\0';
    EXPECT_ERR(deep, "1:33", "nesting deeper than 32 levels"); /* the root is level 1 here */
    free(deep);
}

TEST(node_count_is_bounded)
{
    size_t n = 70000;
    char *text = malloc(2 * n + 16), *p = text;
    p += sprintf(p, "a: [1");
    for (size_t i = 1; i < n; i++)
        p += sprintf(p, ",1");
    strcpy(p, "]\n");
    const char *msg = parse_error(text);
    CHECK_STR_HAS(msg, "more than 65536 YAML nodes (SPEC_MAX_NODES)");
    free(text);
}

TEST(yaml_syntax_errors_carry_libyaml_problem_and_mark)
{
    EXPECT_ERR("cluster:\n"
               "\tname: c1\n", /* 2: a tab at column 1 */
               "2:1", "YAML syntax error: ");
    EXPECT_ERR("cluster: {name: \"c1}\n", "2:1",
               "YAML syntax error: found unexpected end of stream "
               "(while scanning a quoted scalar at line 1, column 17)");
    EXPECT_ERR("cluster: {name: \xff}\n", "1:17",
               "invalid input: invalid leading UTF-8 octet (byte 0xff)");
    EXPECT_ERR("cluster: {name: c1}\n---\nb: 1\n", "2:1",
               "a cluster spec is a single YAML document");
}

TEST(empty_and_non_mapping_documents)
{
    EXPECT_ERR("", "1:1",
               "empty cluster spec (expected a mapping with keys cluster, coordinator, "
               "model, expert_parallel, nodes)");
    EXPECT_ERR("# only a comment\n\n", "1:1", "empty cluster spec");
    EXPECT_ERR("- cluster\n- nodes\n", "1:1",
               "top level: expected a mapping (check indentation), found "
               "a sequence");
    EXPECT_ERR("just text\n", "1:1",
               "top level: expected a mapping (check indentation), found "
               "\"just text\"");
    spec_cluster *s = parse_as("", NULL);
    CHECK(s == NULL);
    CHECK_STR_HAS(err.msg, "<spec>:1:1: empty cluster spec");
}

TEST(oversized_specs_are_refused_before_parsing)
{
    size_t n = (size_t)SPEC_MAX_BYTES + 1;
    char *text = malloc(n);
    memset(text, ' ', n);
    ep_err_clear(&err);
    spec_cluster *s = spec_parse(text, n, TFILE, &err);
    CHECK(s == NULL);
    CHECK_STR_HAS(err.msg, TFILE ": 4194305 bytes is larger than a cluster spec may be");
    free(text);
}

TEST(worker_count_is_bounded)
{
    int n = EP_MAX_WORKERS + 1;
    size_t cap = (size_t)n * 80 + 512;
    char *text = malloc(cap);
    size_t o = (size_t)snprintf(text, cap, HEAD);
    for (int i = 0; i < n; i++)
        o += (size_t)snprintf(text + o, cap - o,
                              "      - {name: w%d, device: cpu, data: \"tcp://h:%d\"}\n", i, i + 1);
    const char *msg = parse_error(text);
    /* worker 1024 is on line 7 + 1024 */
    CHECK_STR_HAS(msg, TFILE ":1031:9: nodes[0].workers[1024]: more than 1024 workers");
    /* exactly EP_MAX_WORKERS parse */
    char *last = strstr(text, "      - {name: w1024,");
    CHECK(last != NULL);
    if (last != NULL) {
        *last = '\0';
        spec_cluster *s = parse_as(text, TFILE);
        CHECK(s != NULL);
        if (s != NULL) {
            CHECK_EQ(s->n_workers, EP_MAX_WORKERS);
            CHECK_EQ(s->workers[1023].rank, 1023);
            CHECK_STR_EQ(s->workers[1023].name, "w1023");
        }
        spec_free(&s);
    }
    free(text);
}

/* ---- spec_check_experts --------------------------------------------------------------- */

static spec_cluster *three_workers(const char *placement)
{
    char text[1024];
    snprintf(text, sizeof text,
             L_CLUSTER L_COORD L_MODEL "expert_parallel: {placement: %s}\n" /* 4 */
                                       "nodes:\n"                           /* 5 */
                                       "  - name: n0\n"
                                       "    workers:\n" W("w0", "cpu", "tcp://h:1")
                                           W("w1", "cpu", "tcp://h:2") W("w2", "cpu", "tcp://h:3"),
             placement);
    return parse_as(text, TFILE);
}

TEST(check_experts_contiguous_needs_an_even_split)
{
    spec_cluster *s = three_workers("contiguous");
    CHECK(s != NULL);
    if (s == NULL)
        return;
    CHECK_EQ(spec_check_experts(s, 16, &err), -1);
    CHECK_STR_HAS(err.msg,
                  TFILE ":5:1: nodes: 3 workers do not divide the model's 16 experts "
                        "evenly (placement contiguous needs n_routed_experts % workers == 0");
    CHECK_EQ(spec_check_experts(s, 15, &err), 0);
    CHECK_EQ(spec_check_experts(s, 3, &err), 0);
    CHECK_EQ(spec_check_experts(s, 2, &err), -1);
    CHECK_STR_HAS(err.msg, TFILE ":5:1: nodes: 3 workers are more than the model's 2 experts");
    CHECK_EQ(spec_check_experts(s, 0, &err), -1);
    CHECK_STR_HAS(err.msg, "the model has 0 routed experts");
    CHECK_EQ(spec_check_experts(s, MC_MAX_EXPERTS + 1, &err), -1);
    spec_free(&s);
}

TEST(check_experts_round_robin_needs_only_enough_experts)
{
    spec_cluster *s = three_workers("round_robin");
    CHECK(s != NULL);
    if (s == NULL)
        return;
    CHECK_EQ(spec_check_experts(s, 16, &err), 0);
    CHECK_EQ(spec_check_experts(s, 3, &err), 0);
    CHECK_EQ(spec_check_experts(s, 2, &err), -1);
    CHECK_STR_HAS(err.msg, "nodes: 3 workers are more than the model's 2 experts");
    spec_free(&s);
}

#define L_COORD_ADMIN(ep) "coordinator: {listen: \"tcp://*:7400\", admin: \"" ep "\"}\n"

TEST(an_unauthenticated_admin_endpoint_must_be_local)
{
    /* line 2, column 46: the admin value */
    EXPECT_ERR(L_CLUSTER L_COORD_ADMIN("tcp://*:7401") L_MODEL L_NODES W0, "2:46",
               "coordinator.admin: \"tcp://*:7401\" can be reached from other hosts, and without "
               "a security: section anyone who connects may stop the cluster");
    EXPECT_ERR(L_CLUSTER L_COORD_ADMIN("tcp://10.1.2.3:7401") L_MODEL L_NODES W0, "2:46",
               "bind it to 127.0.0.1, [::1], localhost or ipc://PATH, or add security:");
    EXPECT_ERR(L_CLUSTER L_COORD_ADMIN("tcp://127.evil.com:7401") L_MODEL L_NODES W0, "2:46",
               "can be reached from other hosts");
    static const char *const local[] = {"tcp://127.0.0.1:7401", "tcp://127.3.2.1:9",
                                        "tcp://localhost:7401", "tcp://[::1]:7401",
                                        "ipc:///run/epmoe/admin"};
    for (int i = 0; i < 5; i++) {
        char text[512];
        snprintf(text, sizeof text,
                 L_CLUSTER
                 "coordinator: {listen: \"tcp://*:7400\", admin: \"%s\"}\n" L_MODEL L_NODES W0,
                 local[i]);
        CHECK_STR_EQ(parse_error(text), "");
    }
}

TEST(security_names_three_paths_and_opens_the_admin_endpoint)
{
    spec_cluster *s = parse_as(L_CLUSTER L_COORD_ADMIN("tcp://*:7401") L_MODEL L_NODES W0
                               "security:\n  coordinator_key: keys/coordinator.key\n"
                               "  worker_keys: /etc/epmoe/workers\n  operator_keys: ops\n",
                               TFILE);
    CHECK(s != NULL);
    if (s == NULL) {
        printf("  %s\n", err.msg);
        return;
    }
    CHECK(s->secure);
    CHECK_STR_EQ(s->coordinator_key, "/etc/epmoe/keys/coordinator.key"); /* like model.path */
    CHECK_STR_EQ(s->worker_keys, "/etc/epmoe/workers");
    CHECK_STR_EQ(s->operator_keys, "/etc/epmoe/ops");
    CHECK_EQ(s->security_pos.line, 9); /* the mapping under "security:" (line 8) */
    spec_free(&s);
    s = parse_as(HEAD W0, TFILE);
    CHECK(s && !s->secure);
    spec_free(&s);
    EXPECT_ERR(HEAD W0 "security:\n  coordinator_key: k\n  worker_keys: w\n", "9:3",
               "security: missing required key \"operator_keys\"");
    EXPECT_ERR(HEAD W0 "security:\n  coordinator_key: k\n  worker_keys: w\n  operator_keys: o\n"
                       "  workers: x\n",
               "12:3",
               "unknown key \"workers\" in security (expected one of coordinator_key, "
               "worker_keys, operator_keys, client_keys)");
}

/* Issue 15: security.client_keys is optional and resolved like the other key paths. */
TEST(client_keys_are_an_optional_path)
{
    spec_cluster *s = parse_as(HEAD W0 "security:\n  coordinator_key: k\n  worker_keys: w\n"
                                       "  operator_keys: o\n  client_keys: clients\n",
                               TFILE);
    CHECK(s != NULL);
    if (s == NULL)
        return;
    CHECK_STR_EQ(s->client_keys, "/etc/epmoe/clients");
    CHECK_EQ(s->client_keys_pos.line, 12);
    CHECK_EQ(s->client_keys_pos.col, 16);
    spec_free(&s);
    s = parse_as(HEAD W0 "security:\n  coordinator_key: k\n  worker_keys: w\n  operator_keys: o\n",
                 TFILE);
    CHECK(s && s->client_keys[0] == '\0');
    spec_free(&s);
    EXPECT_ERR(HEAD W0 "security:\n  coordinator_key: k\n  worker_keys: w\n  operator_keys: o\n"
                       "  client_keys: [a]\n",
               "12:16", "security.client_keys");
}

/* Issue 15: a worker's client endpoint (client:) is optional, checked like data, and distinct
 * from every other endpoint of the spec. The worker line with a client is
 *   - {name: w0, device: cpu, data: "tcp://h:7500", client: "..."}
 * with the client value at column 63. */
#define WC(name, data, client)                                                                     \
    "      - {name: " name ", device: cpu, data: \"" data "\", client: \"" client "\"}\n"
TEST(client_endpoints_are_checked_like_data_endpoints)
{
    spec_cluster *s = parse_as(HEAD WC("w0", "tcp://h:7500", "ipc:///run/w0.client")
                                   W("w1", "cpu", "tcp://h:7501"),
                               TFILE);
    CHECK(s != NULL);
    if (s == NULL) {
        printf("  %s\n", err.msg);
        return;
    }
    CHECK_STR_EQ(s->workers[0].client, "ipc:///run/w0.client");
    CHECK_EQ(s->workers[0].client_pos.line, 7);
    CHECK_EQ(s->workers[0].client_pos.col, 63);
    CHECK_STR_EQ(s->workers[1].client, ""); /* absent: the worker picks a port */
    spec_free(&s);
    /* the endpoint checks of data (clients connect to it: no "*" host) */
    EXPECT_ERR(HEAD WC("w0", "tcp://h:7500", "tcp://*:7600"), "7:63",
               "nodes[0].workers[0].client: bad endpoint \"tcp://*:7600\": peers connect to it, "
               "so the host cannot be *");
    EXPECT_ERR(HEAD WC("w0", "tcp://h:7500", "tcp://h:99999"), "7:63",
               "nodes[0].workers[0].client: bad endpoint \"tcp://h:99999\": the port is out of "
               "range");
    EXPECT_ERR(HEAD WC("w0", "tcp://h:7500", "udp://h:1"), "7:63", "unsupported transport");
    /* distinct from every other endpoint */
    EXPECT_ERR(HEAD WC("w0", "tcp://h:7500", "tcp://h:7500"), "7:63",
               "nodes[0].workers[0].client: duplicate endpoint \"tcp://h:7500\" (already used by "
               "nodes[0].workers[0].data (worker w0) at line 7, column 39)");
    EXPECT_ERR(HEAD W0 WC("w1", "tcp://h:7501", "tcp://h:7500"), "8:63",
               "already used by nodes[0].workers[0].data (worker w0) at line 7, column 39");
    EXPECT_ERR(HEAD WC("w0", "tcp://h:7500", "ipc://c") WC("w1", "tcp://h:7501", "ipc://c"), "8:63",
               "nodes[0].workers[1].client: duplicate endpoint \"ipc://c\" (already used by "
               "nodes[0].workers[0].client (worker w0) at line 7, column 63)");
    EXPECT_ERR(HEAD WC("w0", "tcp://h:7500", "tcp://c:7400"), "7:63",
               "already used by coordinator.listen at line 2, column 23");
    EXPECT_ERR(HEAD WC("w0", "tcp://h:7500", "ipc://c:7401"), "7:63",
               "already used by coordinator.admin at line 2, column 46");
}

/* Issue 15: client keys load beside the others and may be no worker's or operator's key. */
TEST(client_keys_must_be_keys_of_their_own)
{
    if (!auth_available())
        SKIP("this libzmq has no CURVE");
    char dir[] = "/tmp/epmoe_test_spec_keys_XXXXXX", sub[300], text[2048], cmd[700];
    CHECK(mkdtemp(dir) != NULL);
    const char *subs[] = {"workers", "ops", "clients"};
    for (int i = 0; i < 3; i++) {
        snprintf(sub, sizeof sub, "%s/%s", dir, subs[i]);
        CHECK(mkdir(sub, 0700) == 0);
    }
    ep_err e;
    snprintf(sub, sizeof sub, "%s/workers", dir);
    CHECK(auth_keygen(dir, "coordinator", &e) == 0 && auth_keygen(sub, "w0", &e) == 0);
    snprintf(sub, sizeof sub, "%s/ops", dir);
    CHECK(auth_keygen(sub, "op", &e) == 0);
    snprintf(sub, sizeof sub, "%s/clients", dir);
    CHECK(auth_keygen(sub, "eng", &e) == 0);
    snprintf(text, sizeof text,
             HEAD W0 "security:\n  coordinator_key: %s/coordinator.key\n  worker_keys: %s/workers\n"
                     "  operator_keys: %s/ops\n  client_keys: %s/clients\n",
             dir, dir, dir, dir);
    spec_cluster *s = parse_as(text, TFILE);
    CHECK(s != NULL);
    if (s == NULL)
        return;
    keys_cluster k;
    CHECK_EQ(keys_load(s, &k, &e), 0);
    CHECK_EQ(auth_list_count(k.clients), 1);
    CHECK_EQ(k.n_serving, 1); /* WELCOME.client_keys: the client's; an operator is no client */
    keys_free(&k);
    /* a worker's key among the clients' */
    snprintf(cmd, sizeof cmd, "cp %s/workers/w0.pub %s/clients/dup.pub", dir, dir);
    CHECK_EQ(system(cmd), 0);
    CHECK_EQ(keys_load(s, &k, &e), -1);
    CHECK_STR_HAS(e.msg,
                  TFILE ":12:16: security.client_keys: client key dup.pub is worker w0's key");
    /* an operator's key among the clients' */
    snprintf(cmd, sizeof cmd,
             "mv %s/ops/op.pub %s/clients/dup.pub && cp %s/clients/dup.pub %s/ops/op.pub", dir, dir,
             dir, dir);
    CHECK_EQ(system(cmd), 0);
    CHECK_EQ(keys_load(s, &k, &e), -1);
    CHECK_STR_HAS(e.msg,
                  "security.client_keys: the same public key is given for op and client/dup");
    spec_free(&s);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK_EQ(system(cmd), 0);
}

int main(void)
{
    RUN(full_example_parses_to_its_values);
    RUN(omitted_fields_take_their_defaults);
    RUN(integer_bounds_are_inclusive);
    RUN(relative_model_paths_resolve_against_the_spec_directory);
    RUN(spec_load_resolves_against_the_real_directory);
    RUN(example_specs_parse);
    RUN(unknown_keys_are_named_with_the_allowed_set);
    RUN(wrong_node_types_are_explained);
    RUN(integers_are_checked_for_form_and_range);
    RUN(missing_required_keys_point_at_the_enclosing_mapping);
    RUN(duplicate_keys_are_rejected);
    RUN(duplicate_worker_names_name_the_first);
    RUN(duplicate_data_endpoints_are_rejected);
    RUN(bad_devices_list_the_accepted_forms);
    RUN(workers_may_share_a_gpu_and_gpu_gemm_is_a_choice);
    RUN(bad_endpoints_say_what_is_wrong);
    RUN(bad_names_are_rejected);
    RUN(bad_choices_list_the_allowed_values);
    RUN(failover_rules_parse_and_the_limit_must_hold_the_placement);
    RUN(eplb_and_metrics_settings);
    RUN(empty_sequences_are_rejected);
    RUN(anchors_aliases_and_tags_are_rejected);
    RUN(deep_nesting_is_rejected_while_loading);
    RUN(node_count_is_bounded);
    RUN(yaml_syntax_errors_carry_libyaml_problem_and_mark);
    RUN(empty_and_non_mapping_documents);
    RUN(oversized_specs_are_refused_before_parsing);
    RUN(worker_count_is_bounded);
    RUN(nccl_data_plane_needs_gpu_workers_and_fp8);
    RUN(check_experts_contiguous_needs_an_even_split);
    RUN(check_experts_round_robin_needs_only_enough_experts);
    RUN(an_unauthenticated_admin_endpoint_must_be_local);
    RUN(security_names_three_paths_and_opens_the_admin_endpoint);
    RUN(client_keys_are_an_optional_path);
    RUN(client_endpoints_are_checked_like_data_endpoints);
    RUN(client_keys_must_be_keys_of_their_own);
    return test_report();
}
