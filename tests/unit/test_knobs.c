/*
 * test_knobs.c — the table of environment variables is the one list: docs/operations.md's
 * "Environment" table holds exactly its rows (each line the one knob_doc_row writes), the doc
 * names no EPMOE_ variable the table lacks, EPMOE_DEBUG's subsystems are log.h's, and a bad
 * value is refused naming the variable, the value and what was expected.
 */
#include <stdlib.h>
#include <string.h>

#include "common/knobs.h"
#include "common/log.h"
#include "test.h"

static const char *source_dir; /* EPMOE_SOURCE_DIR, from main */

/* docs/operations.md, whole (NULL when it cannot be read). */
static char *read_operations_md(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/docs/operations.md", source_dir);
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    size_t got = s ? fread(s, 1, (size_t)n, f) : 0;
    fclose(f);
    if (s)
        s[got] = '\0';
    return s;
}

/* The "## Environment" section: from its heading to the next "## " (cut in place). */
static char *environment_section(char *doc)
{
    char *s = strstr(doc, "\n## Environment\n");
    if (s == NULL)
        return NULL;
    s++;
    char *end = strstr(s + 3, "\n## ");
    if (end)
        end[1] = '\0';
    return s;
}

static void print_expected_table(void)
{
    size_t n;
    const knob_def *t = knob_table(&n);
    char line[2048];
    printf("  the section's table should read:\n");
    for (size_t i = 0; i < n; i++) {
        knob_doc_row(&t[i], line, sizeof line);
        printf("%s\n", line);
    }
}

/* Each row's line is in the section, and each "| `NAME` |" line of the section is a row. */
TEST(the_environment_table_is_the_knob_table)
{
    char *doc = read_operations_md();
    CHECK(doc != NULL);
    char *sec = doc ? environment_section(doc) : NULL;
    CHECK(sec != NULL);
    if (sec == NULL) {
        free(doc);
        return;
    }
    size_t n;
    const knob_def *t = knob_table(&n);
    int bad = 0;
    char line[2048];
    for (size_t i = 0; i < n; i++) {
        knob_doc_row(&t[i], line, sizeof line);
        char *at = strstr(sec, line);
        if (at == NULL || (at[strlen(line)] != '\n' && at[strlen(line)] != '\0')) {
            TEST_FAIL_AT("%s is not documented as the table has it", t[i].name);
            bad++;
        }
    }
    for (char *l = strstr(sec, "\n| `"); l; l = strstr(l + 1, "\n| `")) {
        char name[128];
        if (sscanf(l, "\n| `%127[^`]`", name) == 1 && knob_find(name) == NULL) {
            TEST_FAIL_AT("docs/operations.md documents %s, which is no row of common/knobs.c",
                         name);
            bad++;
        }
    }
    if (bad)
        print_expected_table();
    free(doc);
}

/* Names of the form EPMOE_* in docs/operations.md that are no environment variable a program
 * reads: the systemd unit's own (its ExecStart expands them), the demo script's, an error code. */
static bool not_a_knob(const char *name)
{
    static const char *const names[] = {"EPMOE_DEVICE", "EPMOE_WORKER_OPTS", "EPMOE_EREFUSED"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i]) == 0)
            return true;
    return strncmp(name, "EPMOE_DEMO_", 11) == 0;
}

TEST(every_variable_the_doc_names_is_a_row)
{
    char *doc = read_operations_md();
    CHECK(doc != NULL);
    for (char *p = doc ? strstr(doc, "EPMOE_") : NULL; p; p = strstr(p + 1, "EPMOE_")) {
        char name[128];
        size_t len = strspn(p, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_");
        snprintf(name, sizeof name, "%.*s", (int)len, p);
        if (knob_find(name) == NULL && !not_a_knob(name))
            TEST_FAIL_AT("docs/operations.md names %s: no row of common/knobs.c", name);
    }
    free(doc);
}

/* log.h's subsystems, each one bit, together every bit up to the last (LOG_SUB_KERNEL). */
TEST(debug_subsystems_are_log_h_s)
{
    unsigned all = 0, mask = 0;
    int n = 0;
    for (; log_sub_name(n) != NULL; n++) {
        CHECK_EQ(log_sub_parse(log_sub_name(n), &mask), 0);
        CHECK(mask != 0 && (mask & (mask - 1)) == 0);
        CHECK((all & mask) == 0);
        all |= mask;
    }
    CHECK_EQ(n, 6);
    CHECK_EQ(all, ((unsigned)LOG_SUB_KERNEL << 1) - 1);
    CHECK_EQ(log_sub_parse("all", &mask), 0);
    CHECK_EQ(mask, ~0u);
    CHECK_EQ(log_sub_parse("net,step", &mask), 0);
    CHECK_EQ(mask, (unsigned)(LOG_SUB_NET | LOG_SUB_STEP));
    CHECK_EQ(log_sub_parse("net,bogus", &mask), -1);
}

/* Names unique, docs one line that fits a markdown cell, every default valid. */
TEST(every_row_is_well_formed)
{
    size_t n;
    const knob_def *t = knob_table(&n);
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < i; j++)
            CHECK(strcmp(t[i].name, t[j].name) != 0);
        CHECK(t[i].doc != NULL && t[i].doc[0] != '\0' && strchr(t[i].doc, '|') == NULL);
        CHECK(t[i].progs != 0);
        knob_values v;
        ep_err e = {{0}};
        if (t[i].def != NULL && knob_set(&v, &t[i], t[i].def, &e) != 0)
            TEST_FAIL_AT("%s: its default does not parse: %s", t[i].name, e.msg);
    }
}

TEST(unset_is_the_default_and_empty_is_unset)
{
    unsetenv("EPMOE_CUDA_WAIT_S");
    setenv("EPMOE_ISA", "", 1);
    setenv("EPMOE_KEY", "", 1);
    knob_values v;
    ep_err e = {{0}};
    CHECK_EQ(knob_load(&v, KNOB_WORKER | KNOB_CTL, &e), 0);
    CHECK(v.cuda_wait_s == 120.0);
    CHECK_EQ(v.cuda_split, 4);
    CHECK_EQ(v.cuda_stage_bytes, 32 << 20);
    CHECK(v.isa == NULL && v.key == NULL && !v.metrics_per_layer);
    CHECK_STR_EQ(v.nccl_library, "libnccl.so.2");
    CHECK_STR_EQ(v.coordinator, "tcp://127.0.0.1:7401");
    setenv("EPMOE_ISA", "avx2", 1);
    setenv("EPMOE_DEBUG", "step", 1);
    setenv("EPMOE_CUDA_WAIT_S", "0.2", 1);
    CHECK_EQ(knob_load(&v, KNOB_WORKER, &e), 0);
    CHECK_STR_EQ(v.isa, "avx2");
    CHECK_EQ(v.debug, (unsigned)LOG_SUB_STEP);
    CHECK(v.cuda_wait_s == 0.2);
    unsetenv("EPMOE_ISA");
    unsetenv("EPMOE_KEY");
    unsetenv("EPMOE_DEBUG");
    unsetenv("EPMOE_CUDA_WAIT_S");
}

/* One bad value: knob_load fails with "NAME=VALUE: expected ...". */
static void check_refused(const char *name, const char *value, const char *expected)
{
    setenv(name, value, 1);
    knob_values v;
    ep_err e = {{0}};
    char want[256];
    snprintf(want, sizeof want, "%s=%s: expected %s", name, value, expected);
    CHECK_EQ(knob_load(&v, KNOB_WORKER | KNOB_CTL, &e), -1);
    CHECK_STR_EQ(e.msg, want);
    unsetenv(name);
}

TEST(a_bad_value_is_refused_naming_it)
{
    check_refused("EPMOE_ISA", "sse9", "ref, avx2 or avx512");
    check_refused("EPMOE_METRICS_PER_LAYER", "2", "0 or 1");
    check_refused("EPMOE_CUDA_WAIT_S", "abc", "a number in 0.01..3600");
    check_refused("EPMOE_CUDA_WAIT_S", "0", "a number in 0.01..3600");
    check_refused("EPMOE_CUDA_SPLIT", "2.5", "an integer in 1..16");
    check_refused("EPMOE_CUDA_CUBLASLT", "yes", "0, 1 or require");
    check_refused("EPMOE_DEBUG", "net,bogus",
                  "a comma list of net, plan, load, step, data, kernel or all");
    /* a row the program does not read is not checked: the coordinator runs no kernels */
    setenv("EPMOE_CUDA_WAIT_S", "abc", 1);
    knob_values v;
    ep_err e = {{0}};
    CHECK_EQ(knob_load(&v, KNOB_COORDINATOR, &e), 0);
    unsetenv("EPMOE_CUDA_WAIT_S");
}

int main(void)
{
    source_dir = getenv("EPMOE_SOURCE_DIR");
    if (source_dir == NULL)
        source_dir = ".";
    RUN(the_environment_table_is_the_knob_table);
    RUN(every_variable_the_doc_names_is_a_row);
    RUN(debug_subsystems_are_log_h_s);
    RUN(every_row_is_well_formed);
    RUN(unset_is_the_default_and_empty_is_unset);
    RUN(a_bad_value_is_refused_naming_it);
    return test_report();
}
