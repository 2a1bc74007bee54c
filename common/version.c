/* version.c — see version.h. The EPMOE_BUILD_* values come from common/CMakeLists.txt. */
#include "common/version.h"

#include <stdio.h>

#ifndef EPMOE_VERSION_STRING
#define EPMOE_VERSION_STRING "unknown"
#endif

const char *ep_version(void)
{
    return EPMOE_VERSION_STRING;
}

void ep_version_print(const char *prog)
{
    printf("%s %s (cpu%s%s)\n", prog, ep_version(), EPMOE_BUILD_CUDA ? ", cuda module" : "",
           EPMOE_BUILD_NCCL ? ", nccl" : "");
}
