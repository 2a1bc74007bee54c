/*
 * epmoe-coordinator — the cluster's coordinator daemon.
 *
 * Usage: epmoe-coordinator --cluster FILE [--check]
 *        epmoe-coordinator --version
 *
 * Reads the cluster spec and the model's config.json, checks the worker count against the
 * model, builds the placement (epoch 1), then serves workers and operators until SIGTERM,
 * SIGINT or an admin SHUTDOWN (exit 0). --check stops after the checks and prints a summary.
 *
 * Exit codes (sysexits): 0 ok; 64 bad command line; 69 a socket cannot be bound or the loop
 * failed; 78 bad cluster spec or config.json (the message names file:line:column or field).
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/auth.h"
#include "common/checkpoint.h"
#include "common/knobs.h"
#include "common/log.h"
#include "common/model_config.h"
#include "common/placement.h"
#include "common/safetensors_model.h"
#include "common/sdnotify.h"
#include "common/version.h"
#include "coordinator/coord.h"
#include "coordinator/keys.h"
#include "coordinator/planner.h"
#include "coordinator/spec.h"

enum { EXIT_USAGE = 64, EXIT_UNAVAILABLE = 69, EXIT_CONFIG = 78 };

static void usage(FILE *out)
{
    fprintf(out,
            "usage: epmoe-coordinator --cluster FILE [--check]\n"
            "       epmoe-coordinator --version\n\n"
            "  --cluster FILE  the cluster spec (docs/cluster-spec.md)\n"
            "  --check         validate the spec, the model's config.json and the MoE tensor\n"
            "                  headers of its checkpoint, print the placement and exit\n"
            "  --version       print the version and build, exit 0\n\n"
            "Signals: SIGTERM or SIGINT stop the daemon in order (workers get SHUTDOWN);\n"
            "SIGHUP re-reads the cluster spec (a spec that fails keeps the old one serving).\n"
            "Exit codes: 0 ok, 64 usage, 69 cannot bind or serve, 78 bad spec, config.json or\n"
            "checkpoint\n");
    knob_usage(out, KNOB_COORDINATOR);
}

/* The environment, read once (common/knobs.h), into the log and sd_notify; -1 for a bad value
 * (a usage error). */
static int load_knobs(void)
{
    knob_values kv;
    ep_err err = {0};
    if (knob_load(&kv, KNOB_COORDINATOR, &err) < 0) {
        fprintf(stderr, "epmoe-coordinator: %s\n", err.msg);
        return -1;
    }
    log_init("epmoe-coordinator", kv.debug, kv.journal_stream != NULL);
    sdn_init(&(sdn_env){kv.notify_socket, kv.watchdog_usec, kv.watchdog_pid});
    return 0;
}

static void print_summary(const spec_cluster *s, const mc_config *c, const plan_table *p)
{
    printf("cluster %s (spec %s)\n", s->name, s->file);
    printf("  listen %s, admin %s\n", s->listen, s->admin);
    printf("  heartbeat %d ms, liveness %d, step timeout %d ms\n", s->heartbeat_ms, s->liveness,
           s->step_timeout_ms);
    printf("model %s\n", s->model_path);
    printf("  hidden_size %d, moe_intermediate_size %d, experts %d (top-%d), layers %d + %d MTP, "
           "hash layers %d, vocab %d\n",
           c->hidden_size, c->moe_intermediate_size, c->n_routed_experts, c->num_experts_per_tok,
           c->num_hidden_layers, c->num_nextn_predict_layers, c->num_hash_layers, c->vocab_size);
    printf("  expert_dtype %s (%s), scale_e8m0 %s, act_ue8m0 %s\n", mc_dtype_name(c->expert_dtype),
           c->expert_dtype_given ? "given"
                                 : "defaulted: config.json has no expert_dtype, top level or in "
                                   "quantization_config",
           c->scale_e8m0 ? "yes" : "no", c->act_ue8m0 ? "yes" : "no");
    printf("  config hash 0x%016" PRIx64 "\n", mc_hash(c));
    printf("placement %s, epoch %" PRIu64 ", dispatch %s, %d redundant experts (%s; layer 0 "
           "shown)\n",
           spec_placement_name(p->placement), p->epoch, spec_dispatch_name(s->dispatch),
           s->redundant_experts,
           pl_stored(p->pl) == 1 ? "the same for every layer" : "layers differ");
    printf("  data plane %s\n", spec_data_plane_name(s->data_plane));
    printf("  %-4s  %-16s  %-16s  %-8s  %-28s  %s\n", "RANK", "WORKER", "NODE", "DEVICE", "DATA",
           "EXPERTS");
    int *e = malloc((size_t)p->n_experts * sizeof *e);
    uint32_t *u = malloc((size_t)p->n_experts * sizeof *u);
    char buf[4096];
    for (int r = 0; r < s->n_workers && e != NULL && u != NULL; r++) {
        const spec_worker *w = &s->workers[r];
        int n = plan_rank_experts(p, 0, r, e, p->n_experts);
        for (int i = 0; i < n; i++)
            u[i] = (uint32_t)e[i];
        pl_ranges_text(u, (size_t)n, buf, sizeof buf);
        printf("  %-4d  %-16s  %-16s  %-8s  %-28s  %s\n", r, w->name, w->node, w->device, w->data,
               buf);
    }
    free(e);
    free(u);
}

/* A device this build's workers cannot serve (cuda:N without CUDA): an error for --check, a
 * warning at start (the workers may come from another build than the coordinator). */
static int check_devices(const spec_cluster *s, bool check, ep_err *err)
{
    if (EPMOE_BUILD_HAS_CUDA)
        return 0;
    for (int r = 0; r < s->n_workers; r++) {
        const spec_worker *w = &s->workers[r];
        if (w->cuda_index < 0)
            continue;
        if (check)
            return ep_err_set(err,
                              "%s:%d:%d: worker %s: device \"%s\": this build of epmoe has no CUDA "
                              "backend (it was built without nvcc), so its workers cannot serve it",
                              s->file, w->device_pos.line, w->device_pos.col, w->name, w->device);
        log_warn("%s:%d:%d: worker %s: device \"%s\": this coordinator was built without CUDA; "
                 "the worker needs a CUDA build",
                 s->file, w->device_pos.line, w->device_pos.col, w->name, w->device);
    }
    return 0;
}

/* Every key security: names can be read (and the secret one is not readable by others). */
static int check_keys(const spec_cluster *s, ep_err *err)
{
    if (!s->secure)
        return 0;
    keys_cluster k;
    if (keys_load(s, &k, err) != 0)
        return -1;
    keys_free(&k);
    return 0;
}

/* The checkpoint the fingerprint is taken of can be read (a config-only directory has none),
 * and its tensor headers hold every MoE tensor of the resolved config with the dtype and shape
 * the workers' loader checks (ck_check_model_shapes): a checkpoint of the other expert dtype is
 * refused here, once, instead of leaving every worker load-failed. */
static int check_checkpoint(const spec_cluster *s, const mc_config *c, int *n_files, ep_err *err)
{
    *n_files = 0;
    if (!st_model_has_files(s->model_path))
        return 0;
    st_model *m = st_model_open(s->model_path, err);
    if (m == NULL)
        return ep_err_prefix(err, "%s:%d:%d: model.path: the checkpoint cannot be read", s->file,
                             s->model_pos.line, s->model_pos.col);
    *n_files = st_model_nfiles(m);
    int rc = ck_check_model_shapes(m, c, err);
    st_model_close(&m);
    if (rc != 0)
        return ep_err_prefix(err,
                             "%s:%d:%d: model.path: no worker could load this checkpoint with its "
                             "config.json",
                             s->file, s->model_pos.line, s->model_pos.col);
    return 0;
}

static void print_trust(const spec_cluster *s, int n_files)
{
    if (n_files > 0)
        printf("checkpoint: %d safetensors files; their fingerprint goes to every worker\n",
               n_files);
    else
        printf("checkpoint: no safetensors files in %s; workers' files are not checked\n",
               s->model_path);
    if (!s->secure) {
        printf("security: none: every socket is unauthenticated (the admin endpoint %s is local "
               "to this host)\n",
               s->admin);
        return;
    }
    keys_cluster k;
    ep_err err;
    char z85[AUTH_Z85_LEN + 1] = "";
    int n_ops = 0, n_clients = 0;
    if (keys_load(s, &k, &err) == 0) {
        auth_z85(k.coordinator.pub, z85);
        n_ops = auth_list_count(k.operators);
        n_clients = auth_list_count(k.clients);
        keys_free(&k);
    }
    printf("security: CURVE on every socket; coordinator key %s, %d worker keys (%s), %d operator "
           "keys (%s), %d client keys (%s)\n",
           z85, s->n_workers, s->worker_keys, n_ops, s->operator_keys, n_clients,
           s->client_keys[0] ? s->client_keys : "none");
}

int main(int argc, char **argv)
{
    const char *cluster = NULL;
    bool check = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--cluster") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "epmoe-coordinator: --cluster needs a value (see --help)\n");
                return EXIT_USAGE;
            }
            cluster = argv[++i];
        } else if (strcmp(argv[i], "--check") == 0) {
            check = true;
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--version") == 0) {
            ep_version_print("epmoe-coordinator");
            return 0;
        } else {
            fprintf(stderr, "epmoe-coordinator: unexpected argument \"%s\"\n", argv[i]);
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (cluster == NULL) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if (load_knobs() < 0)
        return EXIT_USAGE;

    int rc = EXIT_CONFIG;
    ep_err err;
    mc_config cfg;
    spec_cluster *spec = NULL;
    plan_table *plan = NULL;
    coord *c = NULL;
    char path[EP_MAX_PATH + 16];
    int n_files = 0;
    spec = spec_load(cluster, &err);
    if (spec == NULL)
        goto fail;
    snprintf(path, sizeof path, "%s/config.json", spec->model_path);
    if (mc_load(path, &cfg, &err) != 0 || spec_check_experts(spec, cfg.n_routed_experts, &err) != 0)
        goto fail;
    plan = plan_for_spec(spec, &cfg, 1, &err);
    if (plan == NULL || check_devices(spec, check, &err) != 0 || check_keys(spec, &err) != 0 ||
        check_checkpoint(spec, &cfg, &n_files, &err) != 0)
        goto fail;
    if (check) {
        print_summary(spec, &cfg, plan);
        print_trust(spec, n_files);
        rc = 0;
        goto done;
    }
    rc = EXIT_UNAVAILABLE;
    c = coord_create(&spec, &cfg, &err);
    if (c == NULL || coord_run(c, &err) != 0)
        goto fail;
    rc = 0;
    goto done;
fail:
    log_error("%s", err.msg);
done:
    coord_destroy(&c);
    plan_free(&plan);
    spec_free(&spec);
    return rc;
}
