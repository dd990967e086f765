// llama.cpp's own chat layer (common/chat.h) and JSON-schema converter behind a JSON-in/JSON-out C ABI for
// cffi, so that every template is rendered, constrained and parsed exactly as llama-server does it.
//
// Each function catches every C++ exception: a failure returns NULL (or nonzero) and sets *err to a
// malloc'd message; strings returned are malloc'd too and freed with llamaplug_chat_string_free.
// The request handling mirrors tools/server/server-common.cpp (oaicompat_chat_params_parse) and the
// stream state mirrors tools/server/server-task.cpp (task_result_state::update_chat_msg).
#include "chat.h"
#include "json-schema-to-grammar.h"
#include "json.h"
#include "llama.h"
#include "reasoning-budget.h"

#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#define LLAMAPLUG_API extern "C" __attribute__((visibility("default")))

namespace {

char * dup_string(const std::string & s) {
    char * out = static_cast<char *>(std::malloc(s.size() + 1));
    if (out) {
        std::memcpy(out, s.c_str(), s.size() + 1);
    }
    return out;
}

void set_error(char ** err, const char * what) {
    if (err) {
        *err = dup_string(what);
    }
}

// *err starts with the kind of failure: 'I' a request llama.cpp refuses (std::invalid_argument, as llama-server
// answers 400), 'E' anything else (a template that raises, a parser that fails).
template <typename F> auto guarded(char ** err, F && body) -> decltype(body()) {
    try {
        return body();
    } catch (const std::invalid_argument & e) {
        set_error(err, (std::string("I") + e.what()).c_str());
    } catch (const std::exception & e) {
        set_error(err, (std::string("E") + e.what()).c_str());
    } catch (...) {
        set_error(err, "Eunknown C++ exception in llama.cpp's chat layer");
    }
    return decltype(body())();
}

std::string random_id() {
    static const std::string chars("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz");
    std::random_device rd;
    std::mt19937 gen(rd());
    std::string out(32, ' ');
    for (auto & c : out) {
        c = chars[gen() % chars.size()];
    }
    return out;
}

bool flag(const common_json & body, const char * key, bool def) {
    return body.contains(key) && body.at(key).is_boolean() ? body.at(key).get<bool>() : def;
}

std::string text(const common_json & body, const char * key, const std::string & def = "") {
    return body.contains(key) && body.at(key).is_string() ? body.at(key).get<std::string>() : def;
}

common_json message_json(const common_chat_msg & msg) {
    common_json calls = common_json::array();
    for (const auto & call : msg.tool_calls) {
        calls.push_back(common_json{{"id", call.id}, {"name", call.name}, {"arguments", call.arguments}});
    }
    return common_json{{"role", msg.role.empty() ? std::string("assistant") : msg.role},
                       {"content", msg.content},
                       {"reasoning_content", msg.reasoning_content},
                       {"tool_calls", calls}};
}

common_chat_parser_params parser_params(const common_json & p) {
    common_chat_parser_params out;
    out.format               = static_cast<common_chat_format>(p.value("format", 0));
    out.reasoning_format     = common_reasoning_format_from_name(text(p, "reasoning_format", "none"));
    out.reasoning_in_content = flag(p, "reasoning_in_content", false);
    out.generation_prompt    = text(p, "generation_prompt");
    out.parse_tool_calls     = flag(p, "parse_tool_calls", true);
    out.is_continuation      = flag(p, "is_continuation", false);
    out.echo                 = flag(p, "echo", false);
    std::string parser       = text(p, "parser");
    if (!parser.empty()) {
        out.parser.load(parser);
    }
    return out;
}

// The state of one streamed reply, as llama-server keeps it per task (task_result_state).
struct chat_stream {
    common_chat_parser_params params;
    common_chat_msg           msg;
    std::string               generated;
    std::vector<std::string>  ids;

    explicit chat_stream(common_chat_parser_params p) : params(std::move(p)) {
        if (params.is_continuation && !params.echo) {
            msg = common_chat_parse("", true, params);  // no delta for the assistant prefill
        }
    }

    common_json update(const std::string & added, bool is_partial) {
        generated += added;
        common_chat_msg previous = msg;
        common_chat_msg fresh    = common_chat_parse(generated, is_partial, params);
        common_json     diffs    = common_json::array();
        if (!fresh.empty()) {
            fresh.set_tool_call_ids(ids, random_id);
            msg = fresh;
            for (const auto & d : common_chat_msg_diff::compute_diffs(previous, msg)) {
                bool has_call = d.tool_call_index != std::string::npos;
                diffs.push_back(common_json{
                    {"reasoning_content", d.reasoning_content_delta},
                    {"content", d.content_delta},
                    {"index", has_call ? (int64_t) d.tool_call_index : (int64_t) -1},
                    {"id", d.tool_call_delta.id},
                    {"name", d.tool_call_delta.name},
                    {"arguments", d.tool_call_delta.arguments}});
            }
        }
        return diffs;
    }
};

common_chat_templates_inputs chat_inputs(const common_chat_templates * tmpls, common_json & body) {
    auto caps = common_chat_templates_get_caps(tmpls);
    common_chat_templates_inputs in;
    if (!body.contains("messages") || !body.at("messages").is_array()) {
        throw std::invalid_argument("Expected 'messages' to be an array");
    }
    common_json tools = body.contains("tools") && !body.at("tools").is_null() ? body.at("tools") : common_json::array();
    in.messages    = common_chat_msgs_parse_oaicompat(body.at("messages"));
    in.tools       = common_chat_tools_parse_oaicompat(tools);
    in.tool_choice = common_chat_tool_choice_parse_oaicompat(text(body, "tool_choice", "auto"));
    if (body.contains("json_schema") && !body.at("json_schema").is_null()) {
        common_json schema = body.at("json_schema");
        if (schema.is_object() && schema.empty()) {
            schema["type"] = "object";  // an empty schema means any object
        }
        in.json_schema = schema.dump();
    }
    in.grammar                = text(body, "grammar");
    in.use_jinja              = flag(body, "use_jinja", true);  // false: a llama.cpp built-in template name
    in.force_pure_content     = flag(body, "force_pure_content", false);  // the rendering alone, no parser
    in.parallel_tool_calls    = flag(body, "parallel_tool_calls", caps["supports_parallel_tool_calls"]);
    in.add_generation_prompt  = flag(body, "add_generation_prompt", true);
    in.continue_final_message = body.contains("continue_final_message")
        ? common_chat_continuation_parse(body.at("continue_final_message")) : COMMON_CHAT_CONTINUATION_NONE;
    if (in.continue_final_message == COMMON_CHAT_CONTINUATION_NONE && flag(body, "prefill_assistant", true)
        && !in.messages.empty() && in.messages.back().role == "assistant") {
        if (in.messages.size() >= 2 && in.messages[in.messages.size() - 2].role == "assistant") {
            throw std::invalid_argument("Cannot have 2 or more assistant messages at the end of the list.");
        }
        in.continue_final_message = COMMON_CHAT_CONTINUATION_AUTO;
        in.add_generation_prompt  = false;
    }
    if (in.continue_final_message != COMMON_CHAT_CONTINUATION_NONE && in.add_generation_prompt) {
        throw std::invalid_argument("Cannot set both add_generation_prompt and continue_final_message to true.");
    }
    if (in.continue_final_message != COMMON_CHAT_CONTINUATION_NONE && !in.messages.empty()
        && in.messages.back().role == "assistant" && !in.messages.back().tool_calls.empty()) {
        throw std::invalid_argument("Cannot continue an assistant message that contains tool calls.");
    }
    in.reasoning_format = common_reasoning_format_from_name(text(body, "reasoning_format", "auto"));
    // llama-server's default: thinking on where the template can switch it (--reasoning auto)
    bool can_think = false;
    if (!body.contains("enable_thinking")) {
        try {
            can_think = common_chat_templates_support_enable_thinking(tmpls);
        } catch (const std::exception &) {
        }
    }
    in.enable_thinking  = flag(body, "enable_thinking", can_think);
    if (body.contains("chat_template_kwargs") && body.at("chat_template_kwargs").is_object()) {
        for (const auto & item : body.at("chat_template_kwargs").items()) {
            in.chat_template_kwargs[item.key()] = item.value().dump();
        }
    }
    auto thinking = in.chat_template_kwargs.find("enable_thinking");
    if (thinking != in.chat_template_kwargs.end()) {
        if (thinking->second == "true") {
            in.enable_thinking = true;
        } else if (thinking->second == "false") {
            in.enable_thinking = false;
        } else if (!thinking->second.empty() && thinking->second[0] == '"') {
            throw std::invalid_argument("invalid type for \"enable_thinking\" (expected boolean, got string)");
        }
    }
    std::string effort = text(body, "reasoning_effort");
    if (effort == "none") {
        in.enable_thinking = false;
        in.chat_template_kwargs.erase("reasoning_effort");
    } else if (!effort.empty()) {
        in.chat_template_kwargs["reasoning_effort"] = common_json(effort).dump();
    }
    if (body.contains("now") && body.at("now").is_number()) {
        auto seconds = std::chrono::seconds((int64_t) body.at("now").get<double>());
        in.now       = std::chrono::system_clock::time_point(seconds);
    }
    return in;
}

common_json params_json(const common_chat_params & p, const common_chat_templates_inputs & in) {
    common_json triggers = common_json::array();
    for (const auto & t : p.grammar_triggers) {
        triggers.push_back(common_json{{"type", (int) t.type}, {"value", t.value}, {"token", (int) t.token}});
    }
    common_json preserved = common_json::array();
    for (const auto & s : p.preserved_tokens) {
        preserved.push_back(s);
    }
    common_json stops = common_json::array();
    for (const auto & s : p.additional_stops) {
        stops.push_back(s);
    }
    common_json end_tags = common_json::array();
    for (const auto & s : p.thinking_end_tags) {
        end_tags.push_back(s);
    }
    bool parse_tools = !in.tools.empty() && in.tool_choice != COMMON_CHAT_TOOL_CHOICE_NONE;
    return common_json{
        {"prompt", p.prompt},
        {"format", (int) p.format},
        {"format_name", std::string(common_chat_format_name(p.format))},
        {"grammar", p.grammar},
        {"grammar_lazy", p.grammar_lazy},
        {"grammar_triggers", triggers},
        {"preserved_tokens", preserved},
        {"additional_stops", stops},
        {"generation_prompt", p.generation_prompt},
        {"parser", p.parser},
        {"supports_thinking", p.supports_thinking},
        {"thinking_start_tag", p.thinking_start_tag},
        {"thinking_end_tags", end_tags},
        {"parse_tool_calls", parse_tools},
        {"reasoning_format", std::string(common_reasoning_format_name(in.reasoning_format))},
        {"is_continuation", in.continue_final_message != COMMON_CHAT_CONTINUATION_NONE},
        {"enable_thinking", in.enable_thinking},
    };
}

}  // namespace

LLAMAPLUG_API void llamaplug_chat_string_free(char * s) {
    std::free(s);
}

// The model's templates (or `tmpl_override`: Jinja text, or a llama.cpp built-in name); NULL on failure.
LLAMAPLUG_API void * llamaplug_chat_templates_new(const llama_model * model, const char * tmpl_override,
                                                  const char * bos, const char * eos, char ** err) {
    return guarded(err, [&]() -> void * {
        try {
            auto tmpls = common_chat_templates_init(model, tmpl_override ? tmpl_override : "", bos ? bos : "",
                                                    eos ? eos : "");
            return static_cast<void *>(tmpls.release());
        } catch (const std::exception & e) {
            throw std::runtime_error(std::string("the chat template does not compile: ") + e.what());
        }
    });
}

LLAMAPLUG_API void llamaplug_chat_templates_free(void * tmpls) {
    common_chat_templates_free(static_cast<common_chat_templates *>(tmpls));
}

// {"source", "tool_use_source", "caps": {...}, "supports_enable_thinking"}
LLAMAPLUG_API char * llamaplug_chat_templates_info(void * h, char ** err) {
    return guarded(err, [&]() -> char * {
        auto *      tmpls = static_cast<common_chat_templates *>(h);
        common_json caps  = common_json::object();
        for (const auto & [name, value] : common_chat_templates_get_caps(tmpls)) {
            caps[name] = value;
        }
        bool thinking = false;
        try {  // it renders the template: one that raises on the probe's inputs cannot switch thinking
            thinking = common_chat_templates_support_enable_thinking(tmpls);
        } catch (const std::exception &) {
        }
        common_json out{{"source", common_chat_templates_source(tmpls, "")},
                        {"tool_use_source", common_chat_templates_source(tmpls, "tool_use")},
                        {"caps", caps},
                        {"supports_enable_thinking", thinking}};
        return dup_string(out.dump());
    });
}

// An OpenAI-shaped chat request (llama-server's fields) -> the prompt and everything generation needs.
LLAMAPLUG_API char * llamaplug_chat_apply(void * h, const char * request_json, char ** err) {
    return guarded(err, [&]() -> char * {
        auto *      tmpls = static_cast<common_chat_templates *>(h);
        common_json body  = common_json::parse(request_json);
        auto        in    = chat_inputs(tmpls, body);
        auto        out   = common_chat_templates_apply(tmpls, in);
        return dup_string(params_json(out, in).dump());
    });
}

// One whole or partial reply parsed with the parser params that llamaplug_chat_apply returned.
LLAMAPLUG_API char * llamaplug_chat_parse(const char * params_json, const char * reply, int is_partial, char ** err) {
    return guarded(err, [&]() -> char * {
        auto params = parser_params(common_json::parse(params_json));
        auto msg    = common_chat_parse(reply, is_partial != 0, params);
        return dup_string(message_json(msg).dump());
    });
}

LLAMAPLUG_API void * llamaplug_chat_stream_new(const char * params_json, char ** err) {
    return guarded(err, [&]() -> void * { return new chat_stream(parser_params(common_json::parse(params_json))); });
}

LLAMAPLUG_API void llamaplug_chat_stream_free(void * stream) {
    delete static_cast<chat_stream *>(stream);
}

// The text generated since the last call -> llama-server's deltas (the reply so far is re-parsed, as there).
LLAMAPLUG_API char * llamaplug_chat_stream_update(void * stream, const char * added, int is_partial, char ** err) {
    return guarded(err, [&]() -> char * {
        return dup_string(static_cast<chat_stream *>(stream)->update(added, is_partial != 0).dump());
    });
}

// llama.cpp's JSON-schema-to-GBNF converter (the one llama-server uses).
LLAMAPLUG_API char * llamaplug_json_schema_to_grammar(const char * schema_json, char ** err) {
    return guarded(err, [&]() -> char * {
        return dup_string(json_schema_to_grammar(common_json::parse(schema_json)));
    });
}

// The tokens the template already put after the prompt, accepted by a tool-call or output-format grammar
// (common/sampling.cpp does this): 0 on success; a grammar that refuses them is an error, not an abort.
LLAMAPLUG_API int llamaplug_chat_grammar_prefill(llama_sampler * grammar, const llama_token * tokens, size_t n,
                                                 char ** err) {
    bool done = guarded(err, [&]() -> bool {
        for (size_t i = 0; i < n; ++i) {
            // checked first: a grammar accepting an end-of-generation token it does not allow aborts (GGML_ABORT)
            llama_token_data       single = {tokens[i], 1.0f, 0.0f};
            llama_token_data_array one    = {&single, 1, -1, false};
            llama_sampler_apply(grammar, &one);
            if (!(single.logit > -INFINITY)) {
                throw std::runtime_error("the grammar does not allow token " + std::to_string(tokens[i]) +
                                         " (prompt token " + std::to_string(i) + ")");
            }
            llama_sampler_accept(grammar, tokens[i]);
        }
        return true;
    });
    return done ? 0 : 1;
}

// llama-server's reasoning budget (--reasoning-budget, reasoning_budget_tokens): common/reasoning-budget.h's
// sampler, set up as common_sampler_init does. `start` opens the thinking; any of the `n_ends` end sequences
// (`ends` holds them one after another, `end_lens` their lengths) closes it; after `budget` tokens (< 0:
// unlimited) it forces `forced` (the budget message, then the first end tag). The generation prompt's tokens
// (`prefill`) are accepted first, so a prompt that opens the thinking starts the count. NULL on failure.
LLAMAPLUG_API llama_sampler * llamaplug_reasoning_budget_new(const llama_vocab * vocab, const llama_token * start,
                                                            size_t n_start, const llama_token * ends,
                                                            const size_t * end_lens, size_t n_ends,
                                                            const llama_token * forced, size_t n_forced,
                                                            int32_t budget, const llama_token * prefill,
                                                            size_t n_prefill, char ** err) {
    return guarded(err, [&]() -> llama_sampler * {
        std::vector<llama_tokens> end_seqs;
        for (size_t i = 0, at = 0; i < n_ends; at += end_lens[i], ++i) {
            end_seqs.emplace_back(ends + at, ends + at + end_lens[i]);
        }
        llama_sampler * smpl = common_reasoning_budget_init(vocab, {llama_tokens(start, start + n_start)}, end_seqs,
                                                            llama_tokens(forced, forced + n_forced),
                                                            budget < 0 ? INT_MAX : budget);
        for (size_t i = 0; i < n_prefill; ++i) {
            llama_sampler_accept(smpl, prefill[i]);
        }
        return smpl;
    });
}
