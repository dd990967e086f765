// llama.cpp's sampler calls that can throw, behind C functions that cannot.
//
// A grammar sampler throws std::runtime_error from accept when a token leaves it no parse ("Unexpected empty
// grammar stack after accepting piece"), and a lazy grammar does so when its trigger fires and the buffered text
// does not parse; a trigger pattern that is no valid regex throws std::regex_error from init. The raw layer's C
// helpers (raw/declarations.py) and cffi's own C frames cannot carry a C++ exception: it ends in
// std::terminate, which kills the process. Here each call catches everything: the function returns nonzero (or
// NULL) and keeps the message in a thread-local buffer that llamaplug_sampler_last_error returns.
#include "llama.h"

#include <exception>
#include <string>

#define LLAMAPLUG_API extern "C" __attribute__((visibility("default")))

namespace {

thread_local std::string last_error;

template <typename F> int guarded(F && body) {
    last_error.clear();
    try {
        body();
        return 0;
    } catch (const std::exception & e) {
        last_error = e.what();
    } catch (...) {
        last_error = "unknown C++ exception";
    }
    if (last_error.empty()) {
        last_error = "a C++ exception without a message";
    }
    return 1;
}

}  // namespace

// The message of this thread's last failed call below ("" when it succeeded); valid until the next call.
LLAMAPLUG_API const char * llamaplug_sampler_last_error(void) {
    return last_error.c_str();
}

LLAMAPLUG_API int llamaplug_sampler_apply_checked(llama_sampler * smpl, llama_token_data_array * cur_p) {
    return guarded([&] { llama_sampler_apply(smpl, cur_p); });
}

LLAMAPLUG_API int llamaplug_sampler_accept_checked(llama_sampler * smpl, llama_token token) {
    return guarded([&] { llama_sampler_accept(smpl, token); });
}

LLAMAPLUG_API int llamaplug_sampler_reset_checked(llama_sampler * smpl) {
    return guarded([&] { llama_sampler_reset(smpl); });
}

// llama_sampler_init_grammar(_lazy_patterns): NULL when llama.cpp refuses the grammar (then the message is empty:
// llama.cpp printed and logged its reason) or when it threw (then llamaplug_sampler_last_error has it).
LLAMAPLUG_API llama_sampler * llamaplug_sampler_init_grammar_checked(const llama_vocab * vocab, const char * source,
                                                                    const char * root, int lazy,
                                                                    const char ** trigger_patterns,
                                                                    size_t n_patterns,
                                                                    const llama_token * trigger_tokens,
                                                                    size_t n_tokens) {
    llama_sampler * out = nullptr;
    guarded([&] {
        out = lazy ? llama_sampler_init_grammar_lazy_patterns(vocab, source, root, trigger_patterns, n_patterns,
                                                              trigger_tokens, n_tokens)
                   : llama_sampler_init_grammar(vocab, source, root);
    });
    return out;
}
