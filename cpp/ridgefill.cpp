// RidgeFill fork identity.  The strings are fixed at build time by CMakeLists.txt.
#include "ridgefill.h"

#include <string>

#ifndef RIDGEFILL_VERSION
#error "RIDGEFILL_VERSION must be defined by the build"
#endif

const char * llama_ridgefill_version(void) { return RIDGEFILL_VERSION; }
const char * llama_ridgefill_upstream(void) { return RIDGEFILL_UPSTREAM; }
const char * llama_ridgefill_patch_series(void) { return RIDGEFILL_PATCH_SERIES; }

const char * llama_ridgefill_fork_info(void) {
    static const std::string info = std::string("ridgefill ") + RIDGEFILL_VERSION +
                                    " on " + RIDGEFILL_UPSTREAM + ", patches " + RIDGEFILL_PATCH_SERIES;
    return info.c_str();
}
