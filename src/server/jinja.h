// A bounded Jinja subset, enough for the chat templates that GGUF files carry (tokenizer.chat_template).
//
// Semantics follow Python jinja2 as Hugging Face's apply_chat_template configures it (trim_blocks and
// lstrip_blocks on, a tojson that keeps key order and non-ASCII text, raise_exception() and strftime_now()
// as globals), because that is the rendering model authors test their templates against.
// Values are nlohmann::ordered_json (insertion order matters for tojson); "undefined" is a discarded json.
//
// Supported: {{ }}, {% if/elif/else %}, {% for a[, b] in xs [if c] %}...{% else %}, loop.* variables,
// {% set x = ... %} / {% set ns.attr = ... %} with namespace(), comments, whitespace control (-/+), the
// filters/tests/methods listed in jinja_eval.cpp. Anything else (macros, call blocks, ...) is a parse
// error naming line and column, so the caller can fall back to a native format. Tuples are lists
// (they print as [1, 2], not (1, 2)); no chat template prints one.
// Bounded: nesting depth, loop iterations, evaluation steps and output size are capped (Limits), so a
// hostile template cannot hang the server or exhaust its memory.
#pragma once
#include <cstddef>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace kvpack::jinja {

using Value = nlohmann::ordered_json;

// Where a template went wrong; what() reads "line L, column C: message".
class Error : public std::runtime_error {
 public:
  Error(int line, int col, const std::string& msg);
  int line, col;
  std::string message;  // without the position
};
// The template itself called raise_exception(msg): the input is one it refuses (e.g. roles that do not
// alternate), not a template we failed to understand. message is the template's own text.
class RaisedError : public Error {
 public:
  using Error::Error;
};

struct Limits {
  size_t max_output_bytes = size_t{8} << 20;
  size_t max_loop_iterations = 1'000'000;  // all loops of one render together
  size_t max_steps = 20'000'000;           // expression evaluations of one render
  int max_depth = 200;                     // nesting of blocks / expressions (parse) and of evaluation
};

struct Node;  // jinja_ast.h

class Template {
 public:
  // Throws Error (with the position) when the text is not in the supported subset.
  explicit Template(const std::string& source, Limits limits = {});
  ~Template();
  Template(Template&&) noexcept;
  // Renders with `context` (an object: messages, bos_token, add_generation_prompt, ...). Throws Error /
  // RaisedError; never crashes on any template or context.
  std::string render(const Value& context) const;

 private:
  std::unique_ptr<Node> root_;
  Limits limits_;
};

}  // namespace kvpack::jinja
