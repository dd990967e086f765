// What llama.cpp's own chat layer (common/chat.h of the pin, the tools' libllama-common) makes of one
// template: the prompt of a request with tools, a reply that calls a tool in the template's own format
// (taken from the template's rendering of an assistant tool call, after the prompt or, where a finished turn
// is rendered otherwise, after the prompt's generation prompt), and that reply parsed whole and
// streamed (llama-server's diffs, accumulated). The reference for tests/test_chat_templates.py.
//
// usage: llamaplug-chat-reference MODEL.gguf < {"template": TEXT, "request": {...}, "assistant": {...},
//                                               "reasoning_format": "auto"[, "reply": TEXT]}
// "reply" gives the text to start from instead of the template's rendering (cut and parsed the same way).
// The assistant message either calls a tool (the reply taken is the longest start that parses into a call of
// it) or answers with content and reasoning_content (the longest start whose content parses as that answer).
// prints one JSON object.
#include "chat.h"
#include "common.h"
#include "llama.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include <iostream>
#include <iterator>
#include <string>

using json = nlohmann::ordered_json;

static json message_json(const common_chat_msg & msg) {
    json calls = json::array();
    for (const auto & c : msg.tool_calls) {
        calls.push_back({{"name", c.name}, {"arguments", c.arguments}});
    }
    return {{"content", msg.content}, {"reasoning_content", msg.reasoning_content}, {"tool_calls", calls}};
}

// The longest start of `text` (by its tokens, special tokens written out as text) that the request's grammar,
// built as common/sampling.cpp builds it, lets a model write and then end on: what a real model could reply.
static std::string grammar_cut(const llama_model * model, const common_chat_params & params, const std::string & text) {
    if (params.grammar.empty()) {
        return text;
    }
    const llama_vocab *       vocab = llama_model_get_vocab(model);
    std::vector<std::string>  patterns;
    std::vector<llama_token>  trigger_tokens;
    for (const auto & t : params.grammar_triggers) {
        if (t.type == COMMON_GRAMMAR_TRIGGER_TYPE_WORD) {
            auto ids = common_tokenize(vocab, t.value, false, true);
            bool preserved = false;
            for (const auto & p : params.preserved_tokens) {
                auto pid = common_tokenize(vocab, p, false, true);
                preserved |= pid.size() == 1 && ids.size() == 1 && pid[0] == ids[0];
            }
            if (ids.size() == 1 && preserved) {
                trigger_tokens.push_back(ids[0]);
            } else {
                patterns.push_back(regex_escape(t.value));
            }
        } else if (t.type == COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN) {
            patterns.push_back(t.value);
        } else if (t.type == COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL) {
            const auto & v = t.value;
            patterns.push_back(v.empty() ? "^$" : (v.front() != '^' ? "^" : "") + v + (v.back() != '$' ? "$" : ""));
        } else {
            trigger_tokens.push_back(t.token);
        }
    }
    std::vector<const char *> cpatterns;
    for (const auto & p : patterns) {
        cpatterns.push_back(p.c_str());
    }
    llama_sampler * g = params.grammar_lazy
        ? llama_sampler_init_grammar_lazy_patterns(vocab, params.grammar.c_str(), "root", cpatterns.data(),
                                                   cpatterns.size(), trigger_tokens.data(), trigger_tokens.size())
        : llama_sampler_init_grammar(vocab, params.grammar.c_str(), "root");
    if (!g) {
        return text;
    }
    auto allowed = [&](llama_token token) {
        llama_token_data       cand{token, 0.0f, 0.0f};
        llama_token_data_array arr{&cand, 1, -1, false};
        llama_sampler_apply(g, &arr);
        return cand.logit != -INFINITY;
    };
    auto        tokens = common_tokenize(vocab, text, false, false);
    std::string written, ended;  // ended: the text up to the last point where the grammar lets it end
    for (auto token : tokens) {
        if (!allowed(token)) {
            break;
        }
        llama_sampler_accept(g, token);
        written += common_token_to_piece(vocab, token, false);
        if (allowed(llama_vocab_eos(vocab))) {
            ended = written;
        }
    }
    llama_sampler_free(g);
    return ended;
}

// A template that renders a finished turn otherwise than it opens one (a thinking block the prompt opens and a
// past turn drops, as R1 distills and QwQ do): the turn's text after the prompt without its generation prompt
// (the part llama.cpp's parser reads as already written), after what the turn shares with that generation
// prompt; where the generation prompt left a thinking block open, a model closes it first.
static bool continued_turn(const common_chat_params & params, const std::string & rendered, std::string & reply) {
    const std::string & prompt = params.prompt;
    const std::string & gen    = params.generation_prompt;
    if (gen.empty() || prompt.size() < gen.size() || prompt.compare(prompt.size() - gen.size(), gen.size(), gen) != 0) {
        return false;
    }
    const std::string base = prompt.substr(0, prompt.size() - gen.size());
    if (rendered.rfind(base, 0) != 0) {
        return false;
    }
    const std::string turn = rendered.substr(base.size());
    size_t            k    = 0;
    while (k < turn.size() && k < gen.size() && turn[k] == gen[k]) {
        ++k;
    }
    while (k > 0 && k < gen.size() && turn[k - 1] != '>' && turn[k - 1] != '\n') {
        --k;  // parted inside a tag ("<think>" against "</think>"): from the tag's start
    }
    reply                   = turn.substr(k);
    const std::string left  = gen.substr(k);  // what the prompt opens that the finished turn does not show
    const bool        open  = !params.thinking_start_tag.empty() && left.find(params.thinking_start_tag) != std::string::npos;
    bool closed = false;
    for (const auto & tag : params.thinking_end_tags) {
        closed |= reply.rfind(tag, 0) == 0;
    }
    if (open && !closed && !params.thinking_end_tags.empty()) {
        reply = params.thinking_end_tags.front() + reply;
    }
    return !reply.empty();
}

static common_chat_templates_inputs inputs_of(const json & request, bool add_generation_prompt,
                                              common_reasoning_format reasoning_format) {
    common_chat_templates_inputs in;
    in.messages              = common_chat_msgs_parse_oaicompat(common_json::parse(request.at("messages").dump()));
    in.tools                 = common_chat_tools_parse_oaicompat(
        common_json::parse(request.value("tools", json::array()).dump()));
    in.tool_choice           = COMMON_CHAT_TOOL_CHOICE_AUTO;
    in.reasoning_format      = reasoning_format;
    in.add_generation_prompt = add_generation_prompt;
    in.parallel_tool_calls   = false;
    return in;
}

int main(int argc, char ** argv) {
    if (argc != 2) {
        std::cerr << "usage: llamaplug-chat-reference MODEL.gguf < request.json\n";
        return 2;
    }
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_model_params mparams = llama_model_default_params();
    mparams.vocab_only         = true;
    llama_model * model        = llama_model_load_from_file(argv[1], mparams);
    if (!model) {
        std::cerr << "cannot load " << argv[1] << "\n";
        return 2;
    }
    std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    json        input = json::parse(text);
    json        out;
    try {
        auto tmpls   = common_chat_templates_init(model, input.at("template").get<std::string>());
        auto request = input.at("request");
        auto rformat = common_reasoning_format_from_name(input.value("reasoning_format", std::string("auto")));
        auto params  = common_chat_templates_apply(tmpls.get(), inputs_of(request, true, rformat));
        out["prompt"]       = params.prompt;
        out["format"]       = common_chat_format_name(params.format);
        out["grammar_lazy"] = params.grammar_lazy;
        json stops          = json::array();
        for (const auto & s : params.additional_stops) {
            stops.push_back(s);
        }
        out["additional_stops"] = stops;

        // The template's own rendering of the assistant's call, after the prompt that asks for it.
        json with_call = request;
        with_call["messages"].push_back(input.at("assistant"));
        auto   rendered = common_chat_templates_apply(tmpls.get(), inputs_of(with_call, false, rformat)).prompt;
        std::string reply;
        if (input.contains("reply")) {  // a reply given (the pin's tests/test-chat.cpp's input for the template)
            reply = input.at("reply").get<std::string>();
        } else if (rendered.rfind(params.prompt, 0) == 0) {
            reply = rendered.substr(params.prompt.size());
        } else if (!continued_turn(params, rendered, reply)) {
            out["reply"] = nullptr;  // the rendering does not continue the prompt: no reply to take
            out["why"]   = "the template's rendering of the turn does not continue its own prompt";
            std::cout << out.dump() << "\n";
            return 0;
        }
        out["derived"] = input.contains("reply")                      ? "given"
                         : rendered.rfind(params.prompt, 0) == 0 ? "continued"
                                                                  : "after the generation prompt";
        // What the template writes after an assistant turn's text ("<|im_end|>\n", "<|eot_id|>", ...) is the
        // end of turn a model writes as its end token: cut it off (found with a plain-text turn).
        json with_text = request;
        with_text["messages"].push_back(json{{"role", "assistant"}, {"content", "XYZZY"}});
        auto  plain  = common_chat_templates_apply(tmpls.get(), inputs_of(with_text, false, rformat)).prompt;
        auto  mark   = plain.rfind("XYZZY");
        std::string end_of_turn = mark == std::string::npos ? "" : plain.substr(mark + 5);
        auto  trimmed = end_of_turn.substr(0, end_of_turn.find_last_not_of(" \n") + 1);
        if (!trimmed.empty() && reply.size() >= trimmed.size()) {
            auto at = reply.rfind(trimmed);
            if (at != std::string::npos) {
                reply = reply.substr(0, at);
            }
        }
        out["end_of_turn"] = end_of_turn;
        for (const auto & stop : params.additional_stops) {  // a stop string ends the reply, as in llama-server
            auto at = reply.find(stop);
            if (at != std::string::npos) {
                reply = reply.substr(0, at);
            }
        }
        out["turn"] = reply;  // before the grammar's cut: what a failed derivation started from
        reply = grammar_cut(model, params, reply);
        common_chat_parser_params pp(params);
        pp.reasoning_format = rformat;
        pp.parse_tool_calls = true;
        if (!params.parser.empty()) {
            pp.parser.load(params.parser);
        }
        // The longest start of it that parses whole into a call of the tool: the end-of-turn text after
        // the call is the template's, not the model's (a model ends its turn with an end token).
        std::string          taken;
        common_chat_msg      parsed;
        const json &         wanted = input.at("assistant");
        const bool           calls  = wanted.contains("tool_calls");
        const std::string    name   = calls ? wanted.at("tool_calls").at(0).at("function").at("name") : "";
        const std::string    answer = wanted.value("content", std::string());
        auto matches = [&](const common_chat_msg & msg) {
            if (calls) {
                return !msg.tool_calls.empty() && msg.tool_calls[0].name == name;
            }
            return msg.tool_calls.empty() && msg.content.size() >= answer.size() &&
                   msg.content.compare(msg.content.size() - answer.size(), answer.size(), answer) == 0;
        };
        for (size_t n = reply.size(); n > 0; --n) {
            if (n < reply.size() && (static_cast<unsigned char>(reply[n]) & 0xC0) == 0x80) {
                continue;
            }
            try {
                auto msg = common_chat_parse(reply.substr(0, n), false, pp);
                if (matches(msg)) {
                    taken  = reply.substr(0, n);
                    parsed = msg;
                    break;
                }
            } catch (const std::exception &) {
            }
        }
        out["reply"] = taken.empty() ? json(nullptr) : json(taken);
        if (taken.empty()) {
            out["why"] = reply.empty() ? "llama.cpp's grammar lets no start of the rendered turn end"
                                       : "no start of the rendered turn parses back into the call";
        }
        if (!taken.empty()) {
            out["message"] = message_json(parsed);
            // Streamed a character at a time, the diffs accumulated as a client joins them.
            pp.reasoning_in_content = false;
            common_chat_msg previous, accumulated;
            std::vector<std::string> ids;
            auto id_gen = []() { return std::string("id"); };
            for (size_t n = 1; n <= taken.size(); ++n) {
                if (n < taken.size() && (static_cast<unsigned char>(taken[n]) & 0xC0) == 0x80) {
                    continue;  // text arrives in whole characters
                }
                common_chat_msg now;
                try {
                    now = common_chat_parse(taken.substr(0, n), n < taken.size(), pp);
                } catch (const std::exception &) {
                    continue;
                }
                if (now.empty()) {
                    continue;
                }
                now.set_tool_call_ids(ids, id_gen);
                for (const auto & d : common_chat_msg_diff::compute_diffs(previous, now)) {
                    accumulated.content += d.content_delta;
                    accumulated.reasoning_content += d.reasoning_content_delta;
                    if (d.tool_call_index != std::string::npos) {
                        if (accumulated.tool_calls.size() <= d.tool_call_index) {
                            accumulated.tool_calls.resize(d.tool_call_index + 1);
                        }
                        auto & call = accumulated.tool_calls[d.tool_call_index];
                        if (!d.tool_call_delta.name.empty()) {
                            call.name = d.tool_call_delta.name;
                        }
                        call.arguments += d.tool_call_delta.arguments;
                    }
                }
                previous = now;
            }
            out["streamed"] = message_json(accumulated);
        }
    } catch (const std::exception & e) {
        out["error"] = e.what();
    }
    std::cout << out.dump() << "\n";
    llama_model_free(model);
    return 0;
}
