/*
 * test_metrics.c — the Prometheus registry and its text exposition (common/metrics.h).
 *
 * Expected texts are written out by hand from the format's rules (prometheus.io/docs/
 * instrumenting/exposition_formats): # HELP and # TYPE per family, label values escaped (\\,
 * \", \n), histogram buckets cumulative with le="+Inf" equal to _count, _sum and _count.
 * test_metrics.sh validates a real daemon's output with the Prometheus client's parser.
 */
#include "common/metrics.h"

#include "test.h"

static ep_err err;

TEST(counters_gauges_and_escaping)
{
    mx_registry *r = mx_create(&err);
    mx_family *c =
        mx_family_new(r, MX_COUNTER, "epmoe_x_total", "Things\nseen \\ here", "a,b", NULL, 0);
    mx_family *g = mx_family_new(r, MX_GAUGE, "epmoe_g", "A gauge", NULL, NULL, 0);
    CHECK(c && g);
    mx_series *s = mx_series2(c, "q\"1", "x\\y\nz");
    mx_add(s, 2);
    mx_add(mx_series2(c, "q\"1", "x\\y\nz"), 3); /* the same series */
    mx_set(mx_series0(g), 0.5);
    CHECK(mx_value(s) == 5);
    size_t len;
    char *text = mx_render(r, &len);
    const char *want = "# HELP epmoe_x_total Things\\nseen \\\\ here\n"
                       "# TYPE epmoe_x_total counter\n"
                       "epmoe_x_total{a=\"q\\\"1\",b=\"x\\\\y\\nz\"} 5\n"
                       "# HELP epmoe_g A gauge\n"
                       "# TYPE epmoe_g gauge\n"
                       "epmoe_g 0.5\n";
    CHECK_STR_EQ(text, want);
    CHECK_EQ(len, strlen(want));
    free(text);
    mx_clear(c);
    text = mx_render(r, NULL);
    CHECK(strstr(text, "epmoe_x_total{") == NULL && strstr(text, "# TYPE epmoe_x_total") != NULL);
    free(text);
    /* bad names are refused */
    CHECK(mx_family_new(r, MX_GAUGE, "9bad", "x", NULL, NULL, 0) == NULL);
    CHECK(mx_family_new(r, MX_GAUGE, "ok", "x", "__reserved", NULL, 0) == NULL);
    CHECK(mx_family_new(r, MX_HISTOGRAM, "h", "x", "le", NULL, 0) == NULL);
    mx_add(NULL, 1); /* no-ops */
    mx_observe(NULL, 1);
    mx_destroy(&r);
    CHECK(r == NULL);
}

TEST(histogram_buckets_are_cumulative)
{
    mx_registry *r = mx_create(&err);
    const double b[3] = {0.1, 1, 10};
    mx_family *h = mx_family_new(r, MX_HISTOGRAM, "epmoe_h_seconds", "H", "layer", b, 3);
    mx_series *s = mx_series1(h, "3");
    mx_observe(s, 0.05);
    mx_observe(s, 0.1); /* le is inclusive */
    mx_observe(s, 5);
    mx_observe(s, 100);
    char *text = mx_render(r, NULL);
    const char *want = "# HELP epmoe_h_seconds H\n"
                       "# TYPE epmoe_h_seconds histogram\n"
                       "epmoe_h_seconds_bucket{layer=\"3\",le=\"0.1\"} 2\n"
                       "epmoe_h_seconds_bucket{layer=\"3\",le=\"1\"} 2\n"
                       "epmoe_h_seconds_bucket{layer=\"3\",le=\"10\"} 3\n"
                       "epmoe_h_seconds_bucket{layer=\"3\",le=\"+Inf\"} 4\n"
                       "epmoe_h_seconds_sum{layer=\"3\"} 105.15\n"
                       "epmoe_h_seconds_count{layer=\"3\"} 4\n";
    CHECK_STR_EQ(text, want);
    free(text);
    mx_destroy(&r);
}

/* Observations counted in another process (a worker's LOAD_REPORT) merge into the same
 * buckets as mx_observe would put them; counts of another bucket layout are refused whole. */
TEST(histogram_merge)
{
    mx_registry *r = mx_create(&err), *o = mx_create(&err);
    mx_series *f = mx_series0(mx_family_s(r, MX_HISTOGRAM, "epmoe_m_seconds", "M", NULL));
    mx_series *g = mx_series0(mx_family_s(o, MX_HISTOGRAM, "epmoe_m_seconds", "M", NULL));
    double v[] = {0.00005, 0.0001, 0.0003, 0.0003, 0.07, 61, 2.5};
    uint32_t counts[MX_MAX_BUCKETS + 1] = {0};
    double sum = 0;
    for (int i = 0; i < 7; i++) {
        counts[mx_seconds_bucket(v[i])]++;
        sum += v[i];
        mx_observe(g, v[i]);
    }
    CHECK_EQ(mx_seconds_bucket(0.0001), 0); /* le: a bound is in its own bucket */
    CHECK_EQ(mx_seconds_bucket(61), mx_n_seconds_buckets);
    CHECK_EQ(mx_observe_many(f, counts, mx_n_seconds_buckets, sum), -1);
    CHECK(mx_value(f) == 0);
    CHECK_EQ(mx_observe_many(f, counts, mx_n_seconds_buckets + 1, sum), 0);
    CHECK(mx_value(f) == 7);
    char *merged = mx_render(r, NULL), *observed = mx_render(o, NULL);
    CHECK_STR_EQ(merged, observed);
    free(merged);
    free(observed);
    mx_destroy(&r);
    mx_destroy(&o);
}

/* Many series (a layer x expert family at V4-Pro size) are found again, not duplicated. */
TEST(many_series)
{
    mx_registry *r = mx_create(&err);
    mx_family *f = mx_family_new(r, MX_COUNTER, "epmoe_e_total", "E", "layer,expert", NULL, 0);
    char l[16], e[16];
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < 61 * 384; i++) {
            snprintf(l, sizeof l, "%d", i / 384);
            snprintf(e, sizeof e, "%d", i % 384);
            mx_add(mx_series2(f, l, e), 1);
        }
    CHECK(mx_value(mx_series2(f, "60", "383")) == 2);
    char *text = mx_render(r, NULL);
    int lines = 0;
    for (char *p = text; *p; p++)
        lines += *p == '\n';
    CHECK_EQ(lines, 61 * 384 + 2);
    free(text);
    mx_destroy(&r);
}

int main(void)
{
    RUN(counters_gauges_and_escaping);
    RUN(histogram_buckets_are_cumulative);
    RUN(histogram_merge);
    RUN(many_series);
    return test_report();
}
