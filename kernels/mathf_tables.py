#!/usr/bin/env python3
"""Prints the constant tables of kernels/mathf.c (prefix mf_), computed with Python's decimal
module at 60 digits and split into double-double pairs hi + lo with exact rational rounding.
Run it and compare with the tables in mathf.c; it is not part of the build.

  python3 kernels/mathf_tables.py
"""
from decimal import Decimal, getcontext
from fractions import Fraction

getcontext().prec = 60


def dd(v):
    """(hi, lo): hi = the double nearest v, lo = the double nearest v - hi."""
    f = Fraction(v)
    hi = float(f)
    lo = float(f - Fraction(hi))
    return hi, lo


def trunc_bits(v, bits):
    """v rounded to `bits` significant bits (a double that many bits wide)."""
    f = Fraction(v)
    e = 0
    while abs(f) >= 2:
        f /= 2
        e += 1
    while abs(f) < 1:
        f *= 2
        e -= 1
    m = round(f * 2 ** (bits - 1))
    return float(Fraction(m, 2 ** (bits - 1)) * Fraction(2) ** e)


def hx(x):
    return x.hex() if x != 0 else "0x0p+0"


LN2 = Decimal(2).ln()

# exp: 2^(j/64), j = 0..63
print("/* 2^(j/64) = hi + lo */")
for j in range(64):
    hi, lo = dd(Decimal(2) ** (Decimal(j) / 64))
    print(f"    {{{hx(hi)}, {hx(lo)}}},")

# ln2/64 = C1 + C2 + C3, C1 and C2 32 bits wide so that k * C1, k * C2 are exact for |k| < 2^21
c = LN2 / 64
c1 = trunc_bits(c, 32)
r = Fraction(c) - Fraction(c1)
c2 = trunc_bits(Decimal(r.numerator) / Decimal(r.denominator), 32)
r -= Fraction(c2)
c3 = float(r)
print("/* ln2/64 */", hx(c1), hx(c2), hx(c3))
print("/* 64/ln2 */", hx(float(Fraction(64 / LN2))))

# log: c_i = 1 + (i + 1/2)/128; L_i = ln(c_i) for i <= 52, ln(c_i / 2) above (c_i > sqrt 2)
print("/* log(c_i) or log(c_i / 2) = hi + lo */")
for i in range(128):
    ci = 1 + (Decimal(i) + Decimal("0.5")) / 128
    if i > 52:
        ci = ci / 2
    hi, lo = dd(ci.ln())
    print(f"    {{{hx(hi)}, {hx(lo)}}},")
# ln2 = L1 + L2, L1 40 bits wide so that e * L1 is exact for |e| < 2^13
l1 = trunc_bits(LN2, 40)
l2 = float(Fraction(LN2) - Fraction(l1))
l3 = float(Fraction(LN2) - Fraction(l1) - Fraction(l2))
print("/* ln2 */", hx(l1), hx(l2), hx(l3))

# Taylor coefficients 1/n! (exp) and 1/(2n+1) (atanh) as double-double pairs
print("/* 1/n!, n = 0..10 */")
f = Decimal(1)
for n in range(11):
    if n:
        f /= n
    hi, lo = dd(f)
    print(f"    {{{hx(hi)}, {hx(lo)}}},")
print("/* 1/(2n+1), n = 0..8 */")
for n in range(9):
    hi, lo = dd(Decimal(1) / (2 * n + 1))
    print(f"    {{{hx(hi)}, {hx(lo)}}},")
