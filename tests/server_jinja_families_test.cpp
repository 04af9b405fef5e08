// kvpack's Jinja renderer against Python's jinja2 on the chat templates of the families kvpack loads:
// the template a real GGUF carries (shared/vocab/ggml-vocab-qwen2.gguf), and for families with no file
// in shared/, small templates written here that use the same constructs as those vendors' templates
// (thinking switch, namespace state, reversed scans, raise_exception on bad role order, system folding).
#include <gtest/gtest.h>

#include "gguf/gguf.h"
#include "server/jinja.h"
#include "server_jinja_reference.h"

namespace kvpack {
namespace {

using jinja::Value;
using test::JinjaCase;

// Qwen3-style: tools header, thinking switch, reasoning split out of past assistant turns.
const char* kQwen3Like = R"JJ({%- if messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(last_query=messages|length - 1) %}
{%- for m in messages[::-1] %}
{%- set i = (messages|length - 1) - loop.index0 %}
{%- if m.role == 'user' and ns.last_query == messages|length - 1 and not m.content.startswith('<tool_response>') %}
{%- set ns.last_query = i %}
{%- endif %}
{%- endfor %}
{%- for m in messages %}
{%- if m.role == 'system' and loop.first %}
{%- elif m.role == 'assistant' %}
{%- set content = m.content %}
{%- set reasoning = '' %}
{%- if '</think>' in content %}
{%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
{%- set content = content.split('</think>')[-1].lstrip('\n') %}
{%- endif %}
{%- if loop.index0 > ns.last_query and reasoning %}
{{- '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
{%- else %}
{{- '<|im_start|>assistant\n' + content }}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>' + '\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}
{{- '<think>\n\n</think>\n\n' }}
{%- endif %}
{%- endif %})JJ";

// Llama-3-style: bos, a system turn pulled out first, trimmed contents, header markers.
const char* kLlama3Like = R"JJ({{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{%- if system_message %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" ~ system_message ~ "<|eot_id|>" }}
{%- endif %}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
)JJ";

// Gemma-style: no system role (folded into the first user turn), strict alternation, 'model' role.
const char* kGemmaLike = R"JJ({{ bos_token }}
{% if messages[0]['role'] == 'system' %}
{% set first_user_prefix = messages[0]['content'] | trim + '\n\n' %}
{% set loop_messages = messages[1:] %}
{% else %}
{% set first_user_prefix = "" %}
{% set loop_messages = messages %}
{% endif %}
{% for message in loop_messages %}
{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
{{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
{% endif %}
{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}
<start_of_turn>{{ role }}
{{ (first_user_prefix if loop.first else "") ~ message['content'] | trim }}<end_of_turn>
{% endfor %}
{% if add_generation_prompt %}
<start_of_turn>model
{% endif %}
)JJ";

// Phi-3-style: role tags, selectattr over the system turns, loop.last.
const char* kPhi3Like = R"JJ({% set systems = messages | selectattr('role', 'equalto', 'system') | list %}
{% if systems | length > 0 %}<|system|>
{{ systems | map(attribute='content') | join('\n') }}<|end|>
{% endif %}
{% for message in messages if message.role != 'system' %}
{% if message['role'] == 'user' %}
{{'<|user|>' + '\n' + message['content'] + '<|end|>' + '\n'}}
{% elif message['role'] == 'assistant' %}
{{'<|assistant|>' + '\n' + message['content'] + '<|end|>' + '\n'}}
{% endif %}
{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}
{% endfor %}
)JJ";

// Mistral-style: [INST] blocks, system text prepended to the last user turn, eos after answers.
const char* kMistralLike = R"JJ({%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message["role"] == "user") != (loop.index0 % 2 == 0) %}
        {{- raise_exception("After the optional system message, roles must alternate user/assistant/user/...") }}
    {%- endif %}
    {%- if message["role"] == "user" %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
)JJ";

Value msg(const char* role, const std::string& content) { return {{"role", role}, {"content", content}}; }

std::vector<Value> conversations() {
  return {
      Value::array({msg("user", "Hello!")}),
      Value::array({msg("system", "  You are terse.  "), msg("user", "What is 2+2?")}),
      Value::array({msg("system", "Be kind."), msg("user", "Hi"), msg("assistant", "<think>\nhmm\n</think>\n\nHello."),
                    msg("user", "Tell me about \"quotes\", 'apostrophes' and ünïcödé ✓ \\ backslashes.")}),
      Value::array({msg("user", "one"), msg("assistant", " two "), msg("user", "<tool_response>3</tool_response>"),
                    msg("assistant", "four"), msg("user", "  five\n")}),
      Value::array({msg("user", "a"), msg("user", "b")}),  // bad alternation: Gemma/Mistral-style raise
  };
}

std::vector<JinjaCase> cases_for(const std::string& name, const std::string& tmpl) {
  std::vector<JinjaCase> out;
  int k = 0;
  for (const auto& conv : conversations()) {
    for (int variant = 0; variant < 3; ++variant) {
      Value ctx = {{"messages", conv}, {"bos_token", "<s>"}, {"eos_token", "</s>"},
                   {"add_generation_prompt", variant != 1}};
      if (variant == 2) ctx["enable_thinking"] = false;
      out.push_back({name + " conversation " + std::to_string(k) + " variant " + std::to_string(variant), tmpl, ctx});
    }
    ++k;
  }
  return out;
}

void expect_same_as_jinja2(const std::vector<JinjaCase>& cases) {
  const auto ref = test::python_render(cases);
  ASSERT_EQ(ref.size(), cases.size()) << "python3 tests/data/jinja_reference.py failed";
  for (size_t i = 0; i < cases.size(); ++i) {
    const Value ours = test::kvpack_render(cases[i]);
    if (ref[i].contains("ok")) {
      ASSERT_TRUE(ours.contains("ok")) << cases[i].name << ": jinja2 renders, kvpack fails: " << ours["error"];
      EXPECT_EQ(ours["ok"].get<std::string>(), ref[i]["ok"].get<std::string>()) << cases[i].name;
    } else {
      EXPECT_TRUE(ours.contains("error")) << cases[i].name << ": jinja2 fails (" << ref[i]["error"]
                                          << "), kvpack renders " << ours["ok"];
    }
  }
}

class JinjaFamilies : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::have_python_jinja2()) GTEST_SKIP() << "python3-jinja2 is not installed (scripts/install-deps.sh)";
  }
};

TEST_F(JinjaFamilies, QwenTemplateFromGgufMatchesJinja2) {
  const std::string path = std::string(KVPACK_SHARED_DIR) + "/vocab/ggml-vocab-qwen2.gguf";
  auto f = gguf::File::open(path);
  const auto tmpl = f->get_string("tokenizer.chat_template");
  ASSERT_TRUE(tmpl.has_value()) << path << " carries no tokenizer.chat_template";
  expect_same_as_jinja2(cases_for("qwen2 gguf", *tmpl));
}

TEST_F(JinjaFamilies, Qwen3StyleThinkingSwitchMatchesJinja2) { expect_same_as_jinja2(cases_for("qwen3-like", kQwen3Like)); }
TEST_F(JinjaFamilies, Llama3StyleMatchesJinja2) { expect_same_as_jinja2(cases_for("llama3-like", kLlama3Like)); }
TEST_F(JinjaFamilies, GemmaStyleMatchesJinja2) { expect_same_as_jinja2(cases_for("gemma-like", kGemmaLike)); }
TEST_F(JinjaFamilies, Phi3StyleMatchesJinja2) { expect_same_as_jinja2(cases_for("phi3-like", kPhi3Like)); }
TEST_F(JinjaFamilies, MistralStyleMatchesJinja2) { expect_same_as_jinja2(cases_for("mistral-like", kMistralLike)); }

// The thinking switch really switches (guards against both renderers ignoring enable_thinking).
TEST_F(JinjaFamilies, Qwen3StyleEnableThinkingFalseAddsEmptyThinkBlock) {
  Value ctx = {{"messages", Value::array({msg("user", "hi")})}, {"add_generation_prompt", true}};
  const std::string on = jinja::Template(kQwen3Like).render(ctx);
  ctx["enable_thinking"] = false;
  const std::string off = jinja::Template(kQwen3Like).render(ctx);
  EXPECT_EQ(off, on + "<think>\n\n</think>\n\n");
}

}  // namespace
}  // namespace kvpack
