/*
 * epmoe-coordinator — the cluster's coordinator daemon.
 *
 * Usage: epmoe-coordinator --cluster FILE [--check]
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

#include "common/log.h"
#include "common/model_config.h"
#include "coordinator/coord.h"
#include "coordinator/planner.h"
#include "coordinator/spec.h"

enum { EXIT_USAGE = 64, EXIT_UNAVAILABLE = 69, EXIT_CONFIG = 78 };

static void usage(FILE *out)
{
    fprintf(out,
            "usage: epmoe-coordinator --cluster FILE [--check]\n\n"
            "  --cluster FILE  the cluster spec (docs/cluster-spec.md)\n"
            "  --check         validate the spec and the model's config.json, print the\n"
            "                  placement and exit\n\n"
            "Signals: SIGTERM or SIGINT stop the daemon in order (workers get SHUTDOWN);\n"
            "SIGHUP re-reads the cluster spec (a spec that fails keeps the old one serving).\n"
            "Debug output: EPMOE_DEBUG=net,plan,step (or all).\n"
            "Exit codes: 0 ok, 64 usage, 69 cannot bind or serve, 78 bad spec or config.json\n");
}

/* "0-3,8,10-11" */
static void ranges_text(const int *e, int n, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && len + 24 < cap;) {
        int j = i;
        while (j + 1 < n && e[j + 1] == e[j] + 1)
            j++;
        len += (size_t)(j > i ? snprintf(buf + len, cap - len, "%s%d-%d", i ? "," : "", e[i], e[j])
                              : snprintf(buf + len, cap - len, "%s%d", i ? "," : "", e[i]));
        i = j + 1;
    }
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
           c->expert_dtype_given ? "given" : "assumed: config.json has no expert_dtype",
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
    char buf[4096];
    for (int r = 0; r < s->n_workers && e != NULL; r++) {
        const spec_worker *w = &s->workers[r];
        int n = plan_rank_experts(p, 0, r, e, p->n_experts);
        ranges_text(e, n, buf, sizeof buf);
        printf("  %-4d  %-16s  %-16s  %-8s  %-28s  %s\n", r, w->name, w->node, w->device, w->data,
               buf);
    }
    free(e);
}

int main(int argc, char **argv)
{
    const char *cluster = NULL;
    bool check = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--cluster") == 0 && i + 1 < argc) {
            cluster = argv[++i];
        } else if (strcmp(argv[i], "--check") == 0) {
            check = true;
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
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
    log_init("epmoe-coordinator");

    int rc = EXIT_CONFIG;
    ep_err err;
    mc_config cfg;
    spec_cluster *spec = NULL;
    plan_table *plan = NULL;
    coord *c = NULL;
    char path[EP_MAX_PATH + 16];
    spec = spec_load(cluster, &err);
    if (spec == NULL)
        goto fail;
    snprintf(path, sizeof path, "%s/config.json", spec->model_path);
    if (mc_load(path, &cfg, &err) != 0 || spec_check_experts(spec, cfg.n_routed_experts, &err) != 0)
        goto fail;
    plan = plan_for_spec(spec, &cfg, 1, &err);
    if (plan == NULL)
        goto fail;
    if (check) {
        print_summary(spec, &cfg, plan);
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
