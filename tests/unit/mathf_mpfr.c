/*
 * mathf_mpfr.c — mathf_mpfr.h: MPFR at 24 bits with binary32's exponent range (emin -148,
 * emax 128 in MPFR's 0.m * 2^e convention) and mpfr_subnormalize, the documented way to get
 * IEEE binary32 rounding, subnormals included.
 */
#include "mathf_mpfr.h"

#include <mpfr.h>

typedef int (*mpfr_fn)(mpfr_ptr, mpfr_srcptr, mpfr_rnd_t);

static float ref(mpfr_fn fn, float x)
{
    mpfr_exp_t emin = mpfr_get_emin(), emax = mpfr_get_emax();
    mpfr_set_emin(-148);
    mpfr_set_emax(128);
    mpfr_t a, y;
    mpfr_init2(a, 24);
    mpfr_init2(y, 24);
    mpfr_set_flt(a, x, MPFR_RNDN); /* exact */
    int inex = fn(y, a, MPFR_RNDN);
    inex = mpfr_check_range(y, inex, MPFR_RNDN);
    mpfr_subnormalize(y, inex, MPFR_RNDN);
    float r = mpfr_get_flt(y, MPFR_RNDN);
    mpfr_clear(a);
    mpfr_clear(y);
    mpfr_set_emin(emin);
    mpfr_set_emax(emax);
    return r;
}

float mpfr_ref_expf(float x)
{
    return ref(mpfr_exp, x);
}

float mpfr_ref_log1pf(float x)
{
    return ref(mpfr_log1p, x);
}
