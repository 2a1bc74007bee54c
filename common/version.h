/*
 * version.h — the version and build every epmoe binary reports with --version (prefix ep_).
 *
 * One place for it, so epmoectl, epmoe-coordinator and epmoe-worker cannot disagree on what
 * they are. The version is CMake's PROJECT_VERSION; the build line says whether this build
 * has the CUDA module (libepmoe_cuda.so, opened at run time) and the NCCL data plane.
 */
#ifndef EPMOE_VERSION_H
#define EPMOE_VERSION_H

/* "0.1.0" */
const char *ep_version(void);

/* "PROG VERSION (BUILD)\n" on stdout, e.g. "epmoectl 0.1.0 (cpu, cuda module, nccl)". */
void ep_version_print(const char *prog);

#endif
