/*
 * test.h — the unit-test harness: one executable per test file, one ctest entry per file.
 *
 *   TEST(name) { CHECK(...); CHECK_EQ(a, b); CHECK_STR_HAS(msg, "needle"); }
 *   int main(void) { RUN(name); ...; return test_report(); }
 *
 * A failed check prints file:line, the expression and both values, and the test goes on so
 * one run shows every failure; test_report() returns non-zero when anything failed. Tests
 * that cannot run here (no GPU, no CUDA headers) call SKIP("why"), and a file whose every test
 * skipped exits 77, which ctest reports as skipped (SKIP_RETURN_CODE).
 */
#ifndef EPMOE_TEST_H
#define EPMOE_TEST_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_failures;
static int test_ran;
static int test_skipped;
static int test_cur_failed;
static int test_cur_skipped;

#define TEST(name) static void name(void)

#define RUN(name)                                                                                  \
    do {                                                                                           \
        test_cur_failed = 0;                                                                       \
        test_cur_skipped = 0;                                                                      \
        name();                                                                                    \
        test_ran++;                                                                                \
        if (test_cur_skipped)                                                                      \
            test_skipped++;                                                                        \
        printf("%s %s\n", test_cur_failed ? "FAIL" : test_cur_skipped ? "SKIP" : "ok  ", #name);   \
        fflush(stdout);                                                                            \
    } while (0)

#define SKIP(why)                                                                                  \
    do {                                                                                           \
        printf("  skip: %s\n", why);                                                               \
        test_cur_skipped = 1;                                                                      \
        return;                                                                                    \
    } while (0)

#define TEST_FAIL_AT(...)                                                                          \
    do {                                                                                           \
        printf("  %s:%d: ", __FILE__, __LINE__);                                                   \
        printf(__VA_ARGS__);                                                                       \
        printf("\n");                                                                              \
        test_failures++;                                                                           \
        test_cur_failed = 1;                                                                       \
    } while (0)

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            TEST_FAIL_AT("CHECK(%s) failed", #cond);                                               \
    } while (0)

/* Integer equality (any integer type, compared as long long). */
#define CHECK_EQ(a, b)                                                                             \
    do {                                                                                           \
        long long test_a_ = (long long)(a), test_b_ = (long long)(b);                              \
        if (test_a_ != test_b_)                                                                    \
            TEST_FAIL_AT("CHECK_EQ(%s, %s): %lld != %lld", #a, #b, test_a_, test_b_);              \
    } while (0)

/* |a - b| <= tol, with NaN never close. */
#define CHECK_NEAR(a, b, tol)                                                                      \
    do {                                                                                           \
        double test_a_ = (double)(a), test_b_ = (double)(b);                                       \
        if (!(fabs(test_a_ - test_b_) <= (double)(tol)))                                           \
            TEST_FAIL_AT("CHECK_NEAR(%s, %s, %s): %.17g vs %.17g", #a, #b, #tol, test_a_,          \
                         test_b_);                                                                 \
    } while (0)

#define CHECK_STR_EQ(a, b)                                                                         \
    do {                                                                                           \
        const char *test_a_ = (a), *test_b_ = (b);                                                 \
        if (strcmp(test_a_, test_b_) != 0)                                                         \
            TEST_FAIL_AT("CHECK_STR_EQ(%s, %s): \"%s\" != \"%s\"", #a, #b, test_a_, test_b_);      \
    } while (0)

/* The string hay contains needle: how tests pin the content of error messages. */
#define CHECK_STR_HAS(hay, needle)                                                                 \
    do {                                                                                           \
        const char *test_h_ = (hay), *test_n_ = (needle);                                          \
        if (strstr(test_h_, test_n_) == NULL)                                                      \
            TEST_FAIL_AT("CHECK_STR_HAS(%s, \"%s\"): got \"%s\"", #hay, test_n_, test_h_);         \
    } while (0)

static inline int test_report(void)
{
    printf("%d tests, %d failed checks, %d skipped\n", test_ran, test_failures, test_skipped);
    if (test_failures)
        return 1;
    if (test_ran > 0 && test_skipped == test_ran)
        return 77;
    return 0;
}

#endif
