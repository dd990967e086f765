"""C declarations for the raw layer, derived from the pinned headers at build time.

The public headers are run through the C preprocessor with stand-ins for the
libc headers (cffi knows those types already), so the declarations are the
headers themselves: nothing is retyped by hand. The module is then compiled in
cffi's API mode against the real headers, so any drift between these
declarations and llama.h fails the build.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

# The entry headers: everything llama.h pulls in except ggml-cpu.h, whose
# functions live in the CPU backend module, not in the libraries the core links.
ENTRY_HEADERS = ("llama.h", "ggml-backend.h", "gguf.h")
STUB_HEADERS = ("stddef.h", "stdint.h", "stdio.h", "stdbool.h", "stdarg.h", "ggml-cpu.h")

# Integer macros of llama.h (seed 003's constants); cffi asks the compiler for their values.
_DEFINE_RE = re.compile(r"^#define\s+(LLAMA_[A-Z0-9_]+)\s+(?:0x[0-9A-Fa-f]+u?|-?\d+|LLAMA_[A-Z0-9_]+)\b", re.M)

# Callbacks that C calls back into Python; the safe layer attaches the bodies.
PYTHON_CALLBACKS = """
extern "Python" void _llamaplug_log_cb(enum ggml_log_level, const char *, void *);
extern "Python" bool _llamaplug_abort_cb(void *);
extern "Python" bool _llamaplug_progress_cb(float, void *);
extern "Python" const char * _llamaplug_sampler_name(const struct llama_sampler *);
extern "Python" void _llamaplug_sampler_accept(struct llama_sampler *, llama_token);
extern "Python" void _llamaplug_sampler_apply(struct llama_sampler *, llama_token_data_array *);
extern "Python" void _llamaplug_sampler_reset(struct llama_sampler *);
extern "Python" struct llama_sampler * _llamaplug_sampler_clone(const struct llama_sampler *);
extern "Python" void _llamaplug_sampler_free(struct llama_sampler *);
"""

# ggml-cpu.h is stubbed out (its functions are not in the core's libraries), but
# llama_numa_init takes its enum; the compiler checks these values against the header.
NUMA_ENUM = """
enum ggml_numa_strategy {
    GGML_NUMA_STRATEGY_DISABLED = 0, GGML_NUMA_STRATEGY_DISTRIBUTE = 1, GGML_NUMA_STRATEGY_ISOLATE = 2,
    GGML_NUMA_STRATEGY_NUMACTL = 3, GGML_NUMA_STRATEGY_MIRROR = 4, GGML_NUMA_STRATEGY_COUNT
};
"""

# Small C helpers compiled into the module:
# - a log sink that needs no Python, for after interpreter shutdown begins (C may
#   still log from destructors);
# - SIGINT -> abort: a C signal handler sets a flag (and chains to Python's own),
#   and a C abort callback reads it (and the context's own cancel flag) between
#   graph nodes. Calling into Python for every node would cost more than the check itself.
# The C functions of core/native's shims (libllamaplug-common): declared for cffi and prototyped for its module.
NATIVE_SHIMS = """
/* core/native/fit_shim.cpp, in libllamaplug-common: llama.cpp's common/fit.cpp behind one C function. */
int llamaplug_fit_params(const char *, struct llama_model_params *, struct llama_context_params *, float *,
                         struct llama_model_tensor_buft_override *, size_t *, uint32_t);
/* core/native/chat_shim.cpp, in libllamaplug-common: llama.cpp's chat layer (common/chat.h) and JSON-schema
   converter, JSON in and out; strings it returns (and *err) are freed with llamaplug_chat_string_free. */
void llamaplug_chat_string_free(char *);
void * llamaplug_chat_templates_new(const struct llama_model *, const char *, const char *, const char *, char **);
void llamaplug_chat_templates_free(void *);
char * llamaplug_chat_templates_info(void *, char **);
char * llamaplug_chat_apply(void *, const char *, char **);
char * llamaplug_chat_parse(const char *, const char *, int, char **);
void * llamaplug_chat_stream_new(const char *, char **);
void llamaplug_chat_stream_free(void *);
char * llamaplug_chat_stream_update(void *, const char *, int, char **);
char * llamaplug_json_schema_to_grammar(const char *, char **);
int llamaplug_chat_grammar_prefill(struct llama_sampler *, const llama_token *, size_t, char **);
/* core/native/sampler_shim.cpp, in libllamaplug-common: the sampler calls that can throw, caught (nonzero or NULL;
   the message of this thread's last failure from llamaplug_sampler_last_error). */
const char * llamaplug_sampler_last_error(void);
int llamaplug_sampler_apply_checked(struct llama_sampler *, llama_token_data_array *);
int llamaplug_sampler_accept_checked(struct llama_sampler *, llama_token);
int llamaplug_sampler_reset_checked(struct llama_sampler *);
struct llama_sampler * llamaplug_sampler_init_grammar_checked(const struct llama_vocab *, const char *, const char *,
                                                             int, const char **, size_t, const llama_token *, size_t);
struct llama_sampler * llamaplug_reasoning_budget_new(const struct llama_vocab *, const llama_token *, size_t,
                                                     const llama_token *, const size_t *, size_t, const llama_token *,
                                                     size_t, int32_t, const llama_token *, size_t, char **);
"""

C_HELPERS_CDEF = """
static void llamaplug_log_discard(enum ggml_log_level, const char *, void *);
static void llamaplug_log_filtered(enum ggml_log_level, const char *, void *);
static void llamaplug_log_set_min(int);
static int llamaplug_install_sigint(void);
static bool llamaplug_abort_on_interrupt(void *);
static int llamaplug_take_interrupt(void);
static int llamaplug_sample_checked(struct llama_sampler *, struct llama_sampler **, size_t, struct llama_context *,
                                    int32_t, llama_token_data *, size_t, llama_token *);
static int llamaplug_sample_grammar_checked(struct llama_sampler *, struct llama_sampler *, struct llama_sampler **,
                                            size_t, struct llama_context *, int32_t, llama_token_data *, size_t,
                                            llama_token *);
""" + NATIVE_SHIMS + """"""
C_HELPERS_SOURCE = """
#include "ggml-cpu.h"
#include <math.h>
#include <signal.h>

""" + NATIVE_SHIMS + """
static void llamaplug_log_discard(enum ggml_log_level level, const char * text, void * user_data) {
    (void) level; (void) text; (void) user_data;
}

/* llama.cpp's lines below this level (ggml's scale: 1 debug ... 4 error, 6 none) are dropped here, before Python:
   each line that reaches Python takes the GIL, and a model loading beside a thread that imports waited for it
   line by line. A continuation (CONT) goes where the line it continues went. */
static volatile int llamaplug_log_min = 4;
static volatile int llamaplug_log_passed = 0;

static void _llamaplug_log_cb(enum ggml_log_level, const char *, void *);

static void llamaplug_log_set_min(int level) {
    llamaplug_log_min = level;
}

static void llamaplug_log_filtered(enum ggml_log_level level, const char * text, void * user_data) {
    if (level != GGML_LOG_LEVEL_CONT) {
        llamaplug_log_passed = (level == GGML_LOG_LEVEL_NONE ? GGML_LOG_LEVEL_INFO : (int) level) >= llamaplug_log_min;
    }
    if (llamaplug_log_passed) {
        _llamaplug_log_cb(level, text, user_data);
    }
}

static volatile sig_atomic_t llamaplug_interrupted = 0;
static void (*llamaplug_prev_sigint)(int) = 0;

static void llamaplug_on_sigint(int sig) {
    llamaplug_interrupted = 1;
    if (llamaplug_prev_sigint) {
        llamaplug_prev_sigint(sig);
    }
}

static int llamaplug_install_sigint(void) {
    struct sigaction now, before;
    if (sigaction(SIGINT, NULL, &before) != 0) {
        return 0;
    }
    if (before.sa_handler == llamaplug_on_sigint) {
        return 1;
    }
    if (before.sa_handler == SIG_DFL || before.sa_handler == SIG_IGN || (before.sa_flags & SA_SIGINFO)) {
        return 0;  /* only chain to a plain handler (Python's) */
    }
    llamaplug_prev_sigint = before.sa_handler;
    now = before;
    now.sa_handler = llamaplug_on_sigint;
    return sigaction(SIGINT, &now, NULL) == 0;
}

/* data: NULL, or the context's own flag (int), which Llama.cancel sets from another thread. */
static bool llamaplug_abort_on_interrupt(void * data) {
    return llamaplug_interrupted != 0 || (data != NULL && *(volatile int *) data != 0);
}

static int llamaplug_take_interrupt(void) {
    int was = llamaplug_interrupted;
    llamaplug_interrupted = 0;
    return was;
}

/* The candidates of output idx (llama_sampler_sample's first half): 0, or 2 = no logits, 3 = over `cap`. */
static int llamaplug_fill_candidates(struct llama_context * ctx, int32_t idx, llama_token_data * buf, size_t cap,
                                     size_t * n_out) {
    const float * probs = llama_get_sampled_probs_ith(ctx, idx);
    const float * sampled_logits = llama_get_sampled_logits_ith(ctx, idx);
    const llama_token * ids = llama_get_sampled_candidates_ith(ctx, idx);
    size_t n;
    if (probs) {
        n = llama_get_sampled_probs_count_ith(ctx, idx);
        if (n > cap) return 3;
        for (size_t i = 0; i < n; i++) {
            buf[i].id = ids[i]; buf[i].logit = sampled_logits[i]; buf[i].p = probs[i];
        }
    } else if (sampled_logits) {
        n = llama_get_sampled_logits_count_ith(ctx, idx);
        if (n > cap) return 3;
        for (size_t i = 0; i < n; i++) {
            buf[i].id = ids[i]; buf[i].logit = sampled_logits[i]; buf[i].p = 0.0f;
        }
    } else {
        const float * logits = llama_get_logits_ith(ctx, idx);
        if (!logits) return 2;
        n = (size_t) llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(ctx)));
        if (n > cap) return 3;
        for (size_t i = 0; i < n; i++) {
            buf[i].id = (llama_token) i; buf[i].logit = logits[i]; buf[i].p = 0.0f;
        }
    }
    *n_out = n;
    return 0;
}

/* The statuses of the sampling helpers below, where llama_sampler_sample would GGML_ASSERT or a C++ exception
   would cross these C frames (either ends the process): 1 = no sampler selected a candidate, 2 = no logits at idx,
   3 = more candidates than `cap`, 4 = the selected candidate was removed (logit -inf or NaN: every token was
   masked), 5 = a grammar refuses the selected token (*out), 6 = a sampler's apply threw, 7 = the grammar's accept
   of *out threw, 8 = the chain's accept of *out threw (6-8: llamaplug_sampler_last_error has llama.cpp's message;
   the samplers that had accepted *out keep it). */

/* The token `tok` as a grammar would take it: 0 when `g` allows it (a lazy grammar awaiting its trigger allows
   everything), 5 when it refuses, 6 when its apply threw. Applying a grammar reads its state, never changes it. */
static int llamaplug_grammar_allows(struct llama_sampler * g, llama_token tok) {
    llama_token_data single = { tok, 1.0f, 0.0f };
    llama_token_data_array one = { &single, 1, -1, false };
    if (llamaplug_sampler_apply_checked(g, &one)) return 6;
    return single.logit > -INFINITY ? 0 : 5;
}

/* Apply (`first`, then `smpl`), then the checks llama_sampler_sample GGML_ASSERTs, then the pick against each
   of the `n_checks` grammars inside `smpl`: a sampler after one of them may have raised a token it masked, and
   accepting a token a grammar refuses throws (or, for an end-of-generation token, aborts). */
static int llamaplug_pick_checked(struct llama_sampler * first, struct llama_sampler * smpl,
                                  struct llama_sampler ** checks, size_t n_checks, llama_token_data * buf,
                                  size_t n, llama_token * out) {
    llama_token_data_array cur = { buf, n, -1, false };
    if (first && llamaplug_sampler_apply_checked(first, &cur)) return 6;
    if (llamaplug_sampler_apply_checked(smpl, &cur)) return 6;
    if (cur.selected < 0 || cur.selected >= (int64_t) cur.size) return 1;
    if (!(cur.data[cur.selected].logit > -INFINITY)) return 4;
    *out = cur.data[cur.selected].id;
    for (size_t i = 0; i < n_checks; i++) {
        int status = llamaplug_grammar_allows(checks[i], *out);
        if (status) return status;
    }
    return 0;
}

/* llama_sampler_sample of the pin, with a status where it would abort (see above). `buf` is the caller's
   candidate buffer, reused across calls; `checks`: the grammars inside `smpl` (not owned). */
static int llamaplug_sample_checked(struct llama_sampler * smpl, struct llama_sampler ** checks, size_t n_checks,
                                    struct llama_context * ctx, int32_t idx, llama_token_data * buf, size_t cap,
                                    llama_token * out) {
    const llama_token sampled = llama_get_sampled_token_ith(ctx, idx);
    if (sampled != LLAMA_TOKEN_NULL) {
        *out = sampled;
        return llamaplug_sampler_accept_checked(smpl, sampled) ? 8 : 0;
    }
    size_t n;
    int status = llamaplug_fill_candidates(ctx, idx, buf, cap, &n);
    if (status) return status;
    status = llamaplug_pick_checked(NULL, smpl, checks, n_checks, buf, n, out);
    if (status) return status;
    return llamaplug_sampler_accept_checked(smpl, *out) ? 8 : 0;
}

/* The same for a grammar and the chain after it, as llama.cpp's common sampler does it: the chain
   picks from the unconstrained candidates, and only when the grammar refuses that token are the
   candidates rebuilt, the grammar applied to all of them and the chain run again. Checking one
   token instead of the whole vocabulary is what makes constrained generation cheap. The second pick
   is checked against the grammar too (a sampler of the chain may raise a token the grammar masked),
   so the grammar only ever accepts a token it allows; a lazy grammar may still throw at its trigger
   (the buffered text is parsed then), which is status 7. */
static int llamaplug_sample_grammar_checked(struct llama_sampler * grammar, struct llama_sampler * smpl,
                                            struct llama_sampler ** checks, size_t n_checks,
                                            struct llama_context * ctx, int32_t idx, llama_token_data * buf,
                                            size_t cap, llama_token * out) {
    size_t n;
    int status = llamaplug_fill_candidates(ctx, idx, buf, cap, &n);
    if (status) return status;
    status = llamaplug_pick_checked(NULL, smpl, checks, n_checks, buf, n, out);
    if (status == 6) return status;
    if (status == 0) status = llamaplug_grammar_allows(grammar, *out);
    if (status == 6) return status;
    if (status) {
        status = llamaplug_fill_candidates(ctx, idx, buf, cap, &n);
        if (status) return status;
        status = llamaplug_pick_checked(grammar, smpl, checks, n_checks, buf, n, out);
        if (status) return status;
        status = llamaplug_grammar_allows(grammar, *out);
        if (status) return status;
    }
    if (llamaplug_sampler_accept_checked(grammar, *out)) return 7;
    return llamaplug_sampler_accept_checked(smpl, *out) ? 8 : 0;
}
"""


def preprocess(cc: str, include_dirs: list[str]) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        stubs = Path(tmp)
        for name in STUB_HEADERS:
            (stubs / name).write_text("")
        entry = stubs / "entry.h"
        entry.write_text("".join(f'#include "{h}"\n' for h in ENTRY_HEADERS))
        # Without __GNUC__ the headers choose their attribute-free spellings.
        cmd = [cc, "-E", "-P", "-nostdinc", "-U__GNUC__", "-U__clang__", f"-I{stubs}"]
        cmd += [f"-I{d}" for d in include_dirs] + [str(entry)]
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def clean(text: str) -> str:
    # Array sizes written as expressions (64 / sizeof(int32_t)) become '...':
    # cffi's API mode takes the size from the compiler.
    text = re.sub(r"\[([^\]]+)\]", lambda m: m.group(0) if m.group(1).strip().isdigit() else "[...]", text)
    # The headers repeat some identical typedefs (legal C11, rejected by cffi).
    seen: set[str] = set()
    lines = []
    for line in text.splitlines():
        flat = " ".join(line.split())
        if flat.startswith("typedef") and flat.endswith(";") and "{" not in flat:
            if flat in seen:
                continue
            seen.add(flat)
        lines.append(line)
    return "\n".join(lines)


def integer_macros(llama_h: Path) -> str:
    names = _DEFINE_RE.findall(llama_h.read_text())
    return "".join(f"#define {name} ...\n" for name in dict.fromkeys(names))


def cdef(cc: str, include_dirs: list[str]) -> str:
    llama_h = next(Path(d) / "llama.h" for d in include_dirs if (Path(d) / "llama.h").is_file())
    text = clean(preprocess(cc, include_dirs))
    return NUMA_ENUM + text + "\n" + integer_macros(llama_h) + PYTHON_CALLBACKS + C_HELPERS_CDEF
