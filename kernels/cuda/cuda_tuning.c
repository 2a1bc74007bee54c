/*
 * cuda_tuning.c — the EPMOE_CUDA_* knobs' text into mb_cuda_tuning (kernels/moe_backend.h):
 * the parsing, ranges and defaults the CUDA backend has always had, now applied to text a
 * program's main hands over, so nothing under kernels/ reads the environment.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/moe_backend.h"

const char *const mb_cuda_knobs[] = {
    "EPMOE_CUDA_WAIT_S",        "EPMOE_CUDA_STAGE_BYTES", "EPMOE_CUDA_CUBLASLT",
    "EPMOE_CUDA_CUBLASLT_ROWS", "EPMOE_CUDA_FAST_ROWS",   "EPMOE_CUDA_EXACT",
    "EPMOE_CUDA_SPLIT",         "EPMOE_CUDA_MODULE",      NULL,
};

/* A number as strtod reads the whole text; false when it is not one (NaN included). */
static bool cut_number(const char *text, double *x)
{
    char *end;
    *x = text ? strtod(text, &end) : 0;
    return text && end != text && *end == '\0' && *x == *x;
}

/* A number knob: 0 (the default) when text is not a number, else clamped to [lo, hi]. */
static double cut_clamped(const char *text, double lo, double hi)
{
    double x;
    if (!cut_number(text, &x))
        return 0;
    return x < lo ? lo : x > hi ? hi : x;
}

/* An integer knob as atoi read it ("" is unset); n <= 0 behaves as "none" for every one of
 * them (no threshold, never the few-row kernels, no split), which a negative field says. */
static int cut_count(const char *text)
{
    int n = atoi(text);
    return n > 0 ? n : -1;
}

static mb_cublaslt cut_lt(const char *text)
{
    if (strcmp(text, "require") == 0)
        return MB_LT_REQUIRE;
    return atoi(text) != 0 ? MB_LT_ALWAYS : MB_LT_NEVER;
}

int mb_cuda_tuning_parse(mb_cuda_tuning *t, const char *name, const char *text)
{
    bool set = text && text[0]; /* an empty value is an unset one */
    if (strcmp(name, "EPMOE_CUDA_WAIT_S") == 0) {
        t->wait_s = cut_clamped(text, 0.01, 3600);
    } else if (strcmp(name, "EPMOE_CUDA_STAGE_BYTES") == 0) {
        t->stage_bytes = (size_t)cut_clamped(text, 4096, (double)(1u << 30));
    } else if (strcmp(name, "EPMOE_CUDA_CUBLASLT") == 0) {
        t->cublaslt = set ? cut_lt(text) : MB_LT_AUTO;
    } else if (strcmp(name, "EPMOE_CUDA_CUBLASLT_ROWS") == 0) {
        t->cublaslt_rows = set ? cut_count(text) : 0;
    } else if (strcmp(name, "EPMOE_CUDA_FAST_ROWS") == 0) {
        t->fast_rows = set ? cut_count(text) : 0;
    } else if (strcmp(name, "EPMOE_CUDA_EXACT") == 0) {
        t->exact_ref = text && strcmp(text, "ref") == 0;
    } else if (strcmp(name, "EPMOE_CUDA_SPLIT") == 0) {
        t->split = set ? cut_count(text) : 0;
    } else if (strcmp(name, "EPMOE_CUDA_MODULE") == 0) {
        t->module = set ? text : NULL;
    } else {
        return -1;
    }
    return 0;
}
