// A chat template compiled once and rendered as transformers'
// apply_chat_template renders it with Jinja2 (ImmutableSandboxedEnvironment,
// trim_blocks, lstrip_blocks, loop controls, {% generation %}), with the
// globals it adds: raise_exception, strftime_now, namespace, range.
//
//   auto tmpl = jinja::compile(source, "tokenizer_config.json: chat_template");
//   jinja::Rendered out = jinja::render(*tmpl, {{"messages", ...}, {"add_generation_prompt", true}}, now);
#pragma once
#include <ctime>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trainer/data/jinja/ast.h"

namespace ft::jinja {

struct Template {
  std::string where;  // names the template in errors, each followed by " line N: "
  std::vector<NodePtr> nodes;
  bool has_generation = false;  // it marks the assistant's text with {% generation %} blocks
  // Filters and tests that cannot run, used inside an if or an if expression:
  // as Jinja2 does, only a rendering that reaches one fails ("line N: ...").
  std::vector<std::string> deferred_faults;
};

// Errors (syntax, unsupported constructs, a filter or test that cannot run
// outside an if) name `where`, the line and the construct.
std::shared_ptr<const Template> compile(const std::string& source, const std::string& where);

struct Rendered {
  std::string text;
  // [begin, end) byte ranges of text written inside {% generation %} blocks.
  std::vector<std::pair<size_t, size_t>> generation;
};

// context: the template's variables. now: the local time strftime_now formats.
// Errors (a raise_exception, a type mistake) name the template and the line.
Rendered render(const Template& tmpl, const Json& context, std::time_t now);

}  // namespace ft::jinja
