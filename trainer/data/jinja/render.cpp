#include "trainer/data/jinja/render.h"

#include <cmath>
#include <map>

#include "kernels/error.h"
#include "trainer/data/jinja/builtins.h"
#include "trainer/data/jinja/parser.h"

namespace ft::jinja {
namespace {

// raise_exception(message): the template refuses its input.
struct Raised : TemplateFault {
  using TemplateFault::TemplateFault;
};

class Renderer {
 public:
  Renderer(const Template& tmpl, std::time_t now) : tmpl_(tmpl), now_(now) {}

  Rendered run(const Json& context) {
    frames_.emplace_back();
    for (auto it = context.begin(); it != context.end(); ++it) frames_[0][it.key()] = Value(it.value());
    out_ = &result_.text;
    exec(tmpl_.nodes);
    return std::move(result_);
  }

 private:
  enum class Flow { normal, break_, continue_ };

  Flow exec(const std::vector<NodePtr>& nodes) {
    for (const NodePtr& node : nodes) {
      Flow flow = exec_node(*node);
      if (flow != Flow::normal) return flow;
    }
    return Flow::normal;
  }

  Flow exec_node(const Node& node) {
    try {
      return exec_checked(node);
    } catch (const Raised& e) {
      ::ft::fail(tmpl_.where, " line ", node.line, ": the template raised an exception: ", e.what());
    } catch (const TemplateFault& e) {
      ::ft::fail(tmpl_.where, " line ", node.line, ": ", e.what());
    } catch (const Error&) {
      throw;  // from a nested statement: it names its own line
    } catch (const std::exception& e) {  // a missing argument, a value of the wrong JSON type
      ::ft::fail(tmpl_.where, " line ", node.line, ": a filter, test or call got arguments it cannot take (", e.what(), ")");
    }
  }

  Flow exec_checked(const Node& node) {
    switch (node.kind) {
      case NodeKind::text:
        *out_ += node.text;
        return Flow::normal;
      case NodeKind::output:
        *out_ += to_str(eval(*node.expr));
        return Flow::normal;
      case NodeKind::if_:
        return exec(truthy(eval(*node.expr)) ? node.body : node.else_body);
      case NodeKind::for_:
        return exec_for(node);
      case NodeKind::set:
        exec_set(node);
        return Flow::normal;
      case NodeKind::macro:
        frames_.back()[node.text] = macro(node);
        return Flow::normal;
      case NodeKind::generation: {
        const bool top = out_ == &result_.text;
        const size_t begin = out_->size();
        Flow flow = exec(node.body);
        if (top) result_.generation.push_back({begin, out_->size()});
        return flow;
      }
      case NodeKind::with: {
        std::map<std::string, Value> scope;  // every value from the enclosing scope, as Jinja2 binds them
        for (size_t k = 0; k < node.targets.size(); k++) scope[node.targets[k]] = eval(*node.defaults[k]);
        frames_.push_back(std::move(scope));
        Flow flow = exec(node.body);
        frames_.pop_back();
        return flow;
      }
      case NodeKind::filter: {
        std::string buffer;
        std::string* saved = out_;
        out_ = &buffer;
        Flow flow = exec(node.body);
        out_ = saved;
        frames_.push_back({{"", Value(Json(buffer))}});
        *out_ += to_str(eval(*node.expr));
        frames_.pop_back();
        return flow;
      }
      case NodeKind::break_:
        return Flow::break_;
      case NodeKind::continue_:
        return Flow::continue_;
    }
    return Flow::normal;
  }

  Flow exec_for(const Node& node) {
    std::vector<Value> items = iterate(eval(*node.expr));
    if (node.filter) {
      std::vector<Value> kept;
      for (const Value& item : items) {
        frames_.emplace_back();
        bind(node, item);
        if (truthy(eval(*node.filter))) kept.push_back(item);
        frames_.pop_back();
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec(node.else_body);
    const int64_t n = int64_t(items.size());
    for (int64_t i = 0; i < n; i++) {
      Json loop = {{"index", i + 1}, {"index0", i},     {"revindex", n - i}, {"revindex0", n - i - 1},
                   {"first", i == 0}, {"last", i == n - 1}, {"length", n}};
      if (i > 0) loop["previtem"] = items[size_t(i - 1)].data;
      if (i + 1 < n) loop["nextitem"] = items[size_t(i + 1)].data;
      frames_.emplace_back();
      frames_.back()["loop"] = Value(std::move(loop));
      bind(node, items[size_t(i)]);
      Flow flow = exec(node.body);
      frames_.pop_back();
      if (flow == Flow::break_) break;
    }
    return Flow::normal;
  }

  void bind(const Node& node, const Value& item) {
    if (node.targets.size() == 1) {
      frames_.back()[node.targets[0]] = item;
      return;
    }
    if (!item.is_list() || item.data.size() != node.targets.size())
      throw TemplateFault("cannot unpack a " + type_name(item) + " into " + std::to_string(node.targets.size()) + " names");
    for (size_t k = 0; k < node.targets.size(); k++) frames_.back()[node.targets[k]] = Value(item.data[k]);
  }

  void exec_set(const Node& node) {
    Value value;
    if (node.expr) {
      value = eval(*node.expr);
    } else {  // {% set name %}body{% endset %}
      std::string buffer;
      std::string* saved = out_;
      out_ = &buffer;
      exec(node.body);
      out_ = saved;
      value = Value(Json(buffer));
    }
    if (node.attribute.empty()) {
      frames_.back()[node.targets[0]] = value;
      return;
    }
    Value target = lookup(node.targets[0]);
    if (target.kind != Value::Kind::ns)
      throw TemplateFault("cannot set ." + node.attribute + " on " + node.targets[0] + ", a " + type_name(target) +
                          " (only namespace() objects take attributes)");
    if (value.kind != Value::Kind::data) throw TemplateFault("a namespace attribute holds data, got " + type_name(value));
    (*target.ns)[node.attribute] = value.data;
  }

  Value macro(const Node& node) {
    return Value::function(node.text, [this, &node](const Args& args) {
      if (args.positional.size() > node.targets.size())
        throw TemplateFault("macro " + node.text + " takes " + std::to_string(node.targets.size()) + " arguments");
      std::map<std::string, Value> scope;
      for (size_t k = 0; k < node.targets.size(); k++) {
        const Value* given = args.get(k, node.targets[k].c_str());
        scope[node.targets[k]] = given                ? *given
                                 : node.defaults[k] ? eval(*node.defaults[k])
                                                    : Value::undefined(node.targets[k]);
      }
      if (macro_depth_ >= kMaxMacroDepth)
        throw TemplateFault("macro " + node.text + " calls nest deeper than " + std::to_string(kMaxMacroDepth));
      macro_depth_++;
      std::vector<std::map<std::string, Value>> saved = std::move(frames_);
      frames_ = {saved[0], std::move(scope)};
      std::string buffer;
      std::string* saved_out = out_;
      out_ = &buffer;
      exec(node.body);
      out_ = saved_out;
      saved[0] = std::move(frames_[0]);
      frames_ = std::move(saved);
      macro_depth_--;
      return Value(Json(buffer));
    });
  }

  Value lookup(const std::string& name) {
    for (auto frame = frames_.rbegin(); frame != frames_.rend(); ++frame) {
      auto it = frame->find(name);
      if (it != frame->end()) return it->second;
    }
    return global(name);
  }

  Value global(const std::string& name) {
    if (name == "raise_exception")
      return Value::function(name, [](const Args& args) -> Value {
        throw Raised(args.positional.empty() ? std::string("") : to_str(args.positional[0]));
      });
    if (name == "strftime_now")
      return Value::function(name, [this](const Args& args) {
        std::tm local{};
        localtime_r(&now_, &local);
        char buffer[256];
        size_t n = std::strftime(buffer, sizeof buffer, args.positional.at(0).str().c_str(), &local);
        return Value(Json(std::string(buffer, n)));
      });
    if (name == "namespace" || name == "dict")
      return Value::function(name, [name](const Args& args) {
        Json object = Json::object();
        if (!args.positional.empty()) object = args.positional[0].data;
        for (const auto& [key, value] : args.keywords) object[key] = value.kind == Value::Kind::ns ? *value.ns : value.data;
        if (name == "dict") return Value(object);
        Value ns;
        ns.kind = Value::Kind::ns;
        ns.ns = std::make_shared<Json>(std::move(object));
        return ns;
      });
    if (name == "range")
      return Value::function(name, [](const Args& args) {
        const size_t n = args.positional.size();
        const int64_t start = n > 1 ? args.positional[0].integer() : 0;
        const int64_t stop = args.positional.at(n > 1 ? 1 : 0).integer();
        const int64_t step = n > 2 ? args.positional[2].integer() : 1;
        if (step == 0) throw TemplateFault("range() step must not be zero");
        if ((stop - start) / step > kMaxRange) throw TemplateFault("range() of more than " + std::to_string(kMaxRange) + " items");
        Json out = Json::array();
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(i);
        return Value(out);
      });
    return Value::undefined(name);
  }

  Args eval_args(const Expr& e, size_t first) {
    Args args;
    for (size_t i = first; i < e.children.size(); i++) args.positional.push_back(eval(*e.children[i]));
    for (const auto& [key, value] : e.keywords) args.keywords.push_back({key, eval(*value)});
    return args;
  }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case ExprKind::literal:
        return Value(e.value);
      case ExprKind::name:
        return lookup(e.text);
      case ExprKind::list: {
        Json list = Json::array();
        for (const ExprPtr& child : e.children) list.push_back(data_of(eval(*child)));
        return Value(list);
      }
      case ExprKind::dict: {
        Json dict = Json::object();
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) dict[eval(*e.children[i]).str()] = data_of(eval(*e.children[i + 1]));
        return Value(dict);
      }
      case ExprKind::attribute:
        return get_attribute(eval(*e.children[0]), e.text);
      case ExprKind::subscript:
        return get_item(eval(*e.children[0]), eval(*e.children[1]));
      case ExprKind::slice: {
        auto part = [&](size_t i) { return e.children[i] ? eval(*e.children[i]) : Value(); };
        return get_slice(eval(*e.children[0]), part(1), part(2), part(3));
      }
      case ExprKind::call:
        return eval_call(e);
      case ExprKind::filter:
        return apply_filter(e.text, eval(*e.children[0]), eval_args(e, 1));
      case ExprKind::test:
        return Value(Json(apply_test(e.text, eval(*e.children[0]), eval_args(e, 1)) != e.negated));
      case ExprKind::unary:
        return eval_unary(e);
      case ExprKind::binary:
        return eval_binary(e);
      case ExprKind::ternary:
        if (truthy(eval(*e.children[1]))) return eval(*e.children[0]);
        return e.children.size() > 2 ? eval(*e.children[2]) : Value::undefined("the else of an if expression");
    }
    return Value();
  }

  static Json data_of(const Value& value) {
    if (value.kind == Value::Kind::ns) return *value.ns;
    if (value.kind != Value::Kind::data) throw TemplateFault("a list or dict holds data, got " + type_name(value));
    return value.data;
  }

  Value eval_call(const Expr& e) {
    const Expr& callee = *e.children[0];
    if (callee.kind == ExprKind::attribute) {
      Value object = eval(*callee.children[0]);
      if (callee.text == "cycle" && object.is_dict() && object.data.contains("index0")) return cycle(object, e);
      if (object.kind != Value::Kind::ns) return call_method(object, callee.text, eval_args(e, 1));
    }
    Value function = eval(callee);
    if (function.kind != Value::Kind::callable)
      throw TemplateFault((callee.kind == ExprKind::name ? "'" + callee.text + "'" : std::string("the callee")) +
                          " is not a function (it is " + type_name(function) + ")");
    return (*function.call)(eval_args(e, 1));
  }

  // loop.cycle(a, b, ...): the argument at the loop's index, round and round.
  Value cycle(const Value& loop, const Expr& e) {
    const Args args = eval_args(e, 1);
    if (args.positional.empty()) throw TemplateFault("no items for cycling given");
    return args.positional[size_t(loop.data["index0"].get<int64_t>()) % args.positional.size()];
  }

  Value eval_unary(const Expr& e) {
    Value operand = eval(*e.children[0]);
    if (e.text == "not") return Value(Json(!truthy(operand)));
    if (operand.data.is_number_float()) return Value(Json(e.text == "-" ? -operand.number() : operand.number()));
    return Value(Json(e.text == "-" ? -operand.integer() : operand.integer()));
  }

  Value eval_binary(const Expr& e) {
    const std::string& op = e.text;
    Value left = eval(*e.children[0]);
    if (op == "and") return truthy(left) ? eval(*e.children[1]) : left;
    if (op == "or") return truthy(left) ? left : eval(*e.children[1]);
    Value right = eval(*e.children[1]);
    if (op == "in") return Value(Json(apply_test("in", left, Args{{right}, {}}) != e.negated));
    if (op == "==") return Value(Json(equal(left, right)));
    if (op == "!=") return Value(Json(!equal(left, right)));
    if (op == "<") return Value(Json(less(left, right)));
    if (op == ">") return Value(Json(less(right, left)));
    if (op == "<=") return Value(Json(!less(right, left)));
    if (op == ">=") return Value(Json(!less(left, right)));
    if (op == "~") return Value(Json(to_str(left) + to_str(right)));
    return arithmetic(op, left, right);
  }

  static Value arithmetic(const std::string& op, const Value& a, const Value& b) {
    if (op == "+" && a.is_string() && b.is_string()) return Value(Json(a.str() + b.str()));
    if (op == "%" && a.is_string()) return percent_format(a, b);
    if (op == "+" && a.is_list() && b.is_list()) {
      Json out = a.data;
      for (const Json& item : b.data) out.push_back(item);
      return Value(out);
    }
    if (op == "*" && a.is_string() && b.is_number()) {
      bounded_length(int64_t(a.str().size()) * std::min<int64_t>(b.integer(), int64_t(1) << 30), "a repeated string");
      std::string out;
      for (int64_t i = 0; i < b.integer(); i++) out += a.str();
      return Value(Json(out));
    }
    const bool numbers = (a.is_number() || (a.kind == Value::Kind::data && a.data.is_boolean())) &&
                         (b.is_number() || (b.kind == Value::Kind::data && b.data.is_boolean()));
    if (!numbers)
      throw TemplateFault("unsupported operand types for " + op + ": " + type_name(a) + " and " + type_name(b));
    const bool integers = !a.data.is_number_float() && !b.data.is_number_float();
    const double x = a.number(), y = b.number();
    if ((op == "/" || op == "//" || op == "%") && y == 0) throw TemplateFault("division by zero");
    if (op == "/") return Value(Json(x / y));
    if (integers) {
      const int64_t i = a.integer(), j = b.integer();
      if (op == "+") return Value(Json(i + j));
      if (op == "-") return Value(Json(i - j));
      if (op == "*") return Value(Json(i * j));
      if (op == "//") return Value(Json(int64_t(std::floor(double(i) / double(j)))));
      if (op == "%") return Value(Json(((i % j) + j) % j));
      if (op == "**" && j >= 0) return Value(Json(int64_t(std::llround(std::pow(double(i), double(j))))));
    }
    if (op == "+") return Value(Json(x + y));
    if (op == "-") return Value(Json(x - y));
    if (op == "*") return Value(Json(x * y));
    if (op == "//") return Value(Json(std::floor(x / y)));
    if (op == "%") return Value(Json(x - y * std::floor(x / y)));
    if (op == "**") return Value(Json(std::pow(x, y)));
    throw TemplateFault("unsupported operator " + op);
  }

  // Bounds that keep a faulty template an error rather than a crash.
  static constexpr int kMaxMacroDepth = 64;
  static constexpr int64_t kMaxRange = 1 << 20;

  const Template& tmpl_;
  std::time_t now_;
  int macro_depth_ = 0;
  std::vector<std::map<std::string, Value>> frames_;  // innermost last; frames_[0] holds the context
  std::string* out_ = nullptr;
  Rendered result_;
};

// Every filter and test name the template uses can run (unknown_filter,
// unknown_test). As Jinja2's compiler: one that cannot is an error when the
// template compiles, unless it sits in an if (its condition and branches) or
// an if expression, which Jinja2 leaves to the rendering that reaches it
// (soft: collected in `deferred`).
void check_names(const Expr& e, bool soft, const std::string& where, std::vector<std::string>& deferred) {
  const std::string fault = e.kind == ExprKind::filter ? unknown_filter(e.text)
                            : e.kind == ExprKind::test ? unknown_test(e.text)
                                                       : "";
  if (!fault.empty() && !soft) ::ft::fail(where, " line ", e.line, ": ", fault);
  if (!fault.empty()) deferred.push_back("line " + std::to_string(e.line) + ": " + fault);
  soft = soft || e.kind == ExprKind::ternary;
  for (const ExprPtr& child : e.children)
    if (child) check_names(*child, soft, where, deferred);
  for (const auto& keyword : e.keywords) check_names(*keyword.second, soft, where, deferred);
}

void check_names(const std::vector<NodePtr>& nodes, bool soft, const std::string& where,
                 std::vector<std::string>& deferred) {
  for (const NodePtr& node : nodes) {
    const bool inner = soft || node->kind == NodeKind::if_;
    for (const Expr* e : {node->expr.get(), node->filter.get()})
      if (e) check_names(*e, inner, where, deferred);
    for (const ExprPtr& e : node->defaults)
      if (e) check_names(*e, inner, where, deferred);
    check_names(node->body, inner, where, deferred);
    check_names(node->else_body, inner, where, deferred);
  }
}

bool has_generation(const std::vector<NodePtr>& nodes) {
  for (const NodePtr& node : nodes)
    if (node->kind == NodeKind::generation || has_generation(node->body) || has_generation(node->else_body)) return true;
  return false;
}

}  // namespace

std::shared_ptr<const Template> compile(const std::string& source, const std::string& where) {
  auto tmpl = std::make_shared<Template>();
  tmpl->where = where;
  tmpl->nodes = parse(tokenize(source, where), where);
  check_names(tmpl->nodes, false, where, tmpl->deferred_faults);
  tmpl->has_generation = has_generation(tmpl->nodes);
  return tmpl;
}

Rendered render(const Template& tmpl, const Json& context, std::time_t now) {
  return Renderer(tmpl, now).run(context);
}

}  // namespace ft::jinja
