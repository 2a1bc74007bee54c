/*
 * test_error.c — the error record, its one formatter, the one Error body and the one clock.
 *
 * Proves: ep_err_set gives the generic code and ep_err_setc the one named; a message may be
 * formatted from the record's own message; prefix keeps the code and classify keeps an inner
 * layer's kind; long messages are cut, never overflowed; ep_vformat through EP_FORMAT_ARGS
 * returns what it wrote; wire_error_body carries code and message, and a generic error goes
 * out as ERR_STEP_FAILED and a code is named by the proto; the clock's units agree with each other
 * and deadlines count down.
 */
#include <string.h>

#include "common/clock.h"
#include "common/error.h"
#include "common/wire.h"
#include "test.h"

static size_t fmt_into(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static size_t fmt_into(char *buf, size_t cap, const char *fmt, ...)
{
    EP_FORMAT_ARGS(buf, cap, fmt);
    return strlen(buf);
}

TEST(set_gives_generic_setc_the_named_code)
{
    ep_err e = {0};
    CHECK_EQ(e.code, EP_ERR_NONE);
    CHECK_EQ(ep_err_set(&e, "shard %d: %s", 3, "missing"), -1);
    CHECK_EQ(e.code, EP_ERR_GENERIC);
    CHECK_STR_EQ(e.msg, "shard 3: missing");
    CHECK_EQ(ep_err_setc(&e, EP_ERR_BUSY, "queue full"), -1);
    CHECK_EQ(e.code, EP_ERR_BUSY);
    CHECK_STR_EQ(e.msg, "queue full");
    CHECK_EQ(ep_err_errno(&e, "open x"), -1);
    CHECK_EQ(e.code, EP_ERR_GENERIC);
    ep_err_clear(&e);
    CHECK_EQ(e.code, EP_ERR_NONE);
    CHECK_STR_EQ(e.msg, "");
    CHECK_EQ(ep_err_setc(NULL, EP_ERR_BUSY, "dropped"), -1);
}

TEST(own_message_as_argument)
{
    ep_err e;
    ep_err_setc(&e, EP_ERR_STEP_FAILED, "inner");
    ep_err_setc(&e, EP_ERR_TIMEOUT, "STEP 7: %s (%s)", e.msg, e.msg);
    CHECK_STR_EQ(e.msg, "STEP 7: inner (inner)");
    CHECK_EQ(e.code, EP_ERR_TIMEOUT);
}

TEST(prefix_keeps_the_inner_kind)
{
    ep_err e;
    ep_err_setc(&e, EP_ERR_MALFORMED, "bad body");
    ep_err_prefix(&e, "LOAD from %s", "w0");
    CHECK_STR_EQ(e.msg, "LOAD from w0: bad body");
    CHECK_EQ(e.code, EP_ERR_MALFORMED);
}

TEST(long_messages_are_cut)
{
    char big[3 * EP_ERR_MSG_MAX];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    ep_err e;
    ep_err_set(&e, "%s", big);
    CHECK_EQ(strlen(e.msg), EP_ERR_MSG_MAX - 1);
    ep_err_prefix(&e, "ctx");
    CHECK_EQ(strlen(e.msg), EP_ERR_MSG_MAX - 1);
    CHECK(strncmp(e.msg, "ctx: xxx", 8) == 0);
    char small[8];
    CHECK_EQ(fmt_into(small, sizeof small, "%s-%d", "abcdef", 42), 7);
    CHECK_STR_EQ(small, "abcdef-");
    CHECK_EQ(fmt_into(small, sizeof small, "%d", 5), 1);
    CHECK_STR_EQ(small, "5");
}

TEST(error_body_carries_code_and_message)
{
    ep_err e;
    ep_err_setc(&e, EP_ERR_NOT_READY, "cluster forming");
    Epmoe__Error b;
    wire_error_body(&b, &e, EPMOE__MSG_TYPE__MSG_STEP);
    CHECK(b.has_code);
    CHECK_EQ(b.code, EPMOE__ERROR_CODE__ERR_NOT_READY);
    CHECK_STR_EQ(b.message, "cluster forming");
    CHECK(b.has_in_reply_to);
    CHECK_EQ(b.in_reply_to, EPMOE__MSG_TYPE__MSG_STEP);
    wire_error_body(&b, &e, 0);
    CHECK(!b.has_in_reply_to);
    ep_err_set(&e, "unclassified");
    wire_error_body(&b, &e, 0);
    CHECK_EQ(b.code, EPMOE__ERROR_CODE__ERR_STEP_FAILED);
    CHECK_EQ(wire_code(&e), EPMOE__ERROR_CODE__ERR_STEP_FAILED);
    CHECK_STR_EQ(wire_code_name(EP_ERR_BUSY, NULL), "ERR_BUSY");
    CHECK(wire_code_name(999, NULL) == NULL);
    CHECK_STR_EQ(wire_code_name(999, "ERR_?"), "ERR_?");
}

TEST(clock_units_agree_and_deadlines_count_down)
{
    int64_t ns = clk_mono_ns();
    int64_t ms = clk_mono_ms();
    double s = clk_mono_s();
    CHECK(ms >= ns / CLK_NS_PER_MS);
    CHECK(ms - ns / CLK_NS_PER_MS < 1000);
    CHECK(s * 1e3 >= (double)ms - 1 && s * 1e3 - (double)ms < 1000);
    int64_t d = clk_deadline_ms(60000);
    int64_t left = clk_left_ms(d);
    CHECK(left > 59000 && left <= 60000);
    CHECK_EQ(clk_left_ms(clk_mono_ms() - 5), 0);
    struct timespec t =
        clk_timespec_add_ms((struct timespec){.tv_sec = 1, .tv_nsec = 999000000}, 1500);
    CHECK_EQ(t.tv_sec, 3);
    CHECK_EQ(t.tv_nsec, 499000000);
}

int main(void)
{
    RUN(set_gives_generic_setc_the_named_code);
    RUN(own_message_as_argument);
    RUN(prefix_keeps_the_inner_kind);
    RUN(long_messages_are_cut);
    RUN(error_body_carries_code_and_message);
    RUN(clock_units_agree_and_deadlines_count_down);
    return test_report();
}
