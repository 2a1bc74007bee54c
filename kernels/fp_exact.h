/*
 * fp_exact.h — include it last in a numeric source file: it switches floating-point contraction
 * off for every function after it, whatever the command line says. The layer's definition
 * (docs/numerics.md §0) rounds after every multiply and every add; the build already passes
 * -ffp-contract=off, but a build with -ffp-contract=fast (GCC's default outside ISO C mode)
 * would fuse a multiply and an add, intrinsics included, and change bits. GCC ignores the C
 * pragma, so it gets its own; clang honours STDC FP_CONTRACT unless given -ffp-contract=fast
 * explicitly. test_mathf_flags checks the layer compiled with -ffp-contract=fast -march=native.
 * No include guard: every file that includes it wants the pragma.
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
