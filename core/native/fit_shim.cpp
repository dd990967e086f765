// n_gpu_layers="auto": llama.cpp's own fitting (common/fit.cpp) behind one C function,
// without the rest of common/. Its log calls go to llama.cpp's current logger, so
// they reach Python's "llamaplug.native" logger like every other native message.
#include "fit.h"
#include "log.h"

#include <cstdarg>
#include <cstdio>
#include <stdexcept>

// One message to llama.cpp's current logger (llamaplug's, once installed).
static void to_llama_log(ggml_log_level level, const char * text) {
    ggml_log_callback cb = nullptr;
    void * ud = nullptr;
    llama_log_get(&cb, &ud);
    if (cb) {
        cb(level, text, ud);
    }
}

extern "C" {

// The cffi layer declares this; 0 success, 1 could not fit, 2 error (e.g. unreadable model).
__attribute__((visibility("default"))) int llamaplug_fit_params(
        const char * path_model, llama_model_params * mparams, llama_context_params * cparams,
        float * tensor_split, llama_model_tensor_buft_override * overrides, size_t * margins,
        uint32_t n_ctx_min) {
    try {
        return common_fit_params(path_model, mparams, cparams, tensor_split, overrides, margins, n_ctx_min,
                                 nullptr, GGML_LOG_LEVEL_ERROR);
    } catch (const std::exception & e) {
        to_llama_log(GGML_LOG_LEVEL_ERROR, e.what());
        return COMMON_PARAMS_FIT_STATUS_ERROR;
    }
}

}  // extern "C"

// -- the part of common/log.h that fit.cpp calls ---------------------------------

struct common_log {};

static common_log g_log;

int common_log_get_verbosity_thold(void) { return LOG_LEVEL_TRACE; }

bool common_log_get_jsonl(void) { return false; }

common_log * common_log_main() { return &g_log; }

void common_log_add(common_log *, ggml_log_level level, const char * fmt, ...) {
    char text[1024];
    va_list args;
    va_start(args, fmt);
    vsnprintf(text, sizeof text, fmt, args);
    va_end(args);
    to_llama_log(level == GGML_LOG_LEVEL_NONE ? GGML_LOG_LEVEL_INFO : level, text);
}

void common_log_add_json(common_log *, const char *, const common_json &) {}

// (the rest of log.h that common.cpp reaches: llamaplug's logger has no prefix or timestamps to set)
void common_log_set_prefix(common_log *, bool) {}

void common_log_set_timestamps(common_log *, bool) {}

void common_log_default_callback(ggml_log_level level, const char * text, void *) {
    to_llama_log(level, text);
}
