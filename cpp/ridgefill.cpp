// RidgeFill: fork identity and layer-input capture.  The identity strings are
// fixed at build time by CMakeLists.txt.
#include "ridgefill.h"

#include "llama-ext.h"  // upstream's layer-input extraction (C++ linkage, not installed)

#include <cstring>
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

// architectures whose graph records res->t_layer_inp[il] for every layer
// (gemma3 through ggml-patches/0003); others would abort in the graph build.
static bool arch_exposes_layer_inputs(const llama_model * model) {
    static const char * const archs[] = {"llama", "qwen3", "qwen3moe", "qwen35", "qwen35moe", "gemma3"};
    char arch[64] = {0};
    if (llama_model_meta_val_str(model, "general.architecture", arch, sizeof(arch)) < 0) {
        return false;
    }
    for (const char * a : archs) {
        if (std::strcmp(arch, a) == 0) {
            return true;
        }
    }
    return false;
}

bool llama_ridgefill_capture_layer_input(llama_context * ctx, int32_t il, bool enable) {
    const llama_model * model = llama_get_model(ctx);
    if (il < 0 || il >= llama_model_n_layer(model) || !arch_exposes_layer_inputs(model)) {
        return false;
    }
    llama_set_embeddings_layer_inp(ctx, (uint32_t) il, enable);
    return true;
}

const float * llama_ridgefill_layer_input(llama_context * ctx, int32_t il) {
    if (il < 0 || il >= llama_model_n_layer(llama_get_model(ctx))) {
        return nullptr;
    }
    return llama_get_embeddings_layer_inp(ctx, (uint32_t) il);
}
