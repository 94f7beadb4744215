// The Jinja evaluator: statements and expressions over jinja::Value, with Jinja2's scoping (a
// for loop's body gets a fresh scope each iteration, `if` none, a macro the scope it was defined
// in), and the public entry points of loom/jinja.h.
#include <cmath>
#include <cstdint>
#include <ctime>

#include <fmt/format.h>

#include "jinja_internal.h"
#include "loom/jinja.h"

namespace loom::jinja {

struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* find(std::string_view name) const {
    for (const Scope* s = this; s; s = s->parent.get())
      for (const auto& [k, v] : s->vars)
        if (k == name) return &v;
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    for (auto& [k, old] : vars)
      if (k == name) {
        old = std::move(v);
        return;
      }
    vars.emplace_back(name, std::move(v));
  }
};

namespace {

using ScopePtr = std::shared_ptr<Scope>;

ScopePtr child_of(const ScopePtr& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}

int64_t to_int(const Value& v) { return v.kind == Kind::boolean ? (v.b ? 1 : 0) : v.i; }
double to_double(const Value& v) { return v.kind == Kind::floating ? v.f : static_cast<double>(to_int(v)); }

// Python's a // b; the caller rules out b == 0.
int64_t floor_div(int64_t a, int64_t b) {
  if (b == 0) throw Error("integer division or modulo by zero");
  if (b == -1) return a == INT64_MIN ? a : -a;  // INT64_MIN / -1 overflows (Python's ints do not)
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

// printf-style `str % args` as Python does it for the conversions templates use.
std::string percent_format(const std::string& fmt_str, const Value& args) {
  List values = args.is_list() && args.tuple ? *args.list : List{args};
  size_t next = 0;
  std::string out;
  auto take = [&]() -> const Value& {
    if (next >= values.size()) throw Error("not enough arguments for format string");
    return values[next++];
  };
  for (size_t i = 0; i < fmt_str.size(); ++i) {
    if (fmt_str[i] != '%') {
      out.push_back(fmt_str[i]);
      continue;
    }
    if (++i >= fmt_str.size()) throw Error("incomplete format");
    std::string spec;
    while (i < fmt_str.size() && (std::isdigit(static_cast<unsigned char>(fmt_str[i])) || fmt_str[i] == '.' ||
                                  fmt_str[i] == '-' || fmt_str[i] == '+' || fmt_str[i] == ' '))
      spec.push_back(fmt_str[i++]);
    if (i >= fmt_str.size()) throw Error("incomplete format");
    const char conv = fmt_str[i];
    std::string piece;
    switch (conv) {
      case '%':
        piece = "%";
        break;
      case 's':
        piece = to_str(take());
        break;
      case 'r':
        piece = repr(take());
        break;
      case 'd':
      case 'i': {
        const Value& v = take();
        if (!v.is_number())
          throw Error(fmt::format("%d format: a real number is required, not {}", type_name(v)));
        piece = std::to_string(v.kind == Kind::floating ? static_cast<int64_t>(v.f) : to_int(v));
        break;
      }
      case 'f':
      case 'e':
      case 'g': {
        const Value& v = take();
        if (!v.is_number()) throw Error(fmt::format("must be real number, not {}", type_name(v)));
        char buf[64];
        std::snprintf(buf, sizeof buf, ("%" + spec + conv).c_str(), to_double(v));
        piece = buf;
        spec.clear();
        break;
      }
      default:
        throw Error(fmt::format("unsupported format character '{}'", conv));
    }
    if (!spec.empty() && conv != '%') {
      const bool left = spec[0] == '-';
      const size_t width = static_cast<size_t>(std::atoi(spec.c_str() + (left ? 1 : 0)));
      const size_t len = utf8_decode(piece).size();
      if (len < width)
        piece = left ? piece + std::string(width - len, ' ') : std::string(width - len, ' ') + piece;
    }
    out += piece;
  }
  // Python skips this check when the argument is a mapping or a list (PyMapping_Check).
  if (next < values.size() && !args.is_dict() && !args.is_undefined() && !(args.is_list() && !args.tuple))
    throw Error("not all arguments converted during string formatting");
  return out;
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") return Value::string(to_str(a) + to_str(b));
  // str % x: Undefined passes as a mapping (it has __getitem__), so `'text' % missing` is 'text'.
  if (op == "%" && a.is_string() && b.is_undefined()) return Value::string(percent_format(a.s, b));
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  auto type_error = [&]() -> Value {
    throw Error(
        fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a), type_name(b)));
  };
  const bool nums = a.is_number() && b.is_number();
  const bool ints = is_intlike(a) && is_intlike(b);
  if ((a.is_list() && a.generator) || (b.is_list() && b.generator)) return type_error();
  if (op == "+") {
    if (a.is_string() && b.is_string() && (a.markup || b.markup)) {
      Value r = Value::string((a.markup ? a.s : html_escape(a.s)) + (b.markup ? b.s : html_escape(b.s)));
      r.markup = true;
      return r;
    }
    if (ints) return Value::integer(to_int(a) + to_int(b));
    if (nums) return Value::floating(to_double(a) + to_double(b));
    if (a.is_string() && b.is_string()) return Value::string(a.s + b.s);
    if (a.is_list() && b.is_list() && a.tuple == b.tuple) {
      List items = *a.list;
      items.insert(items.end(), b.list->begin(), b.list->end());
      return Value::make_list(std::move(items), a.tuple);
    }
    if (a.is_string() || b.is_string())
      throw Error(
          fmt::format("can only concatenate str (not \"{}\") to str", type_name(a.is_string() ? b : a)));
    return type_error();
  }
  if (op == "-") {
    if (ints) return Value::integer(to_int(a) - to_int(b));
    if (nums) return Value::floating(to_double(a) - to_double(b));
    return type_error();
  }
  if (op == "*") {
    if (ints) return Value::integer(to_int(a) * to_int(b));
    if (nums) return Value::floating(to_double(a) * to_double(b));
    const Value* seq = a.is_string() || a.is_list() ? &a : b.is_string() || b.is_list() ? &b : nullptr;
    const Value* count = seq == &a ? &b : &a;
    if (seq && is_intlike(*count)) {
      const int64_t n = to_int(*count);
      if (n > 0 && static_cast<uint64_t>(n) * (seq->is_string() ? seq->s.size() : seq->list->size()) >
                       (size_t{1} << 26))
        throw Error("repetition result too large");
      if (seq->is_string()) {
        std::string out;
        for (int64_t k = 0; k < n; ++k) out += seq->s;
        return Value::string(std::move(out));
      }
      List items;
      for (int64_t k = 0; k < n; ++k) items.insert(items.end(), seq->list->begin(), seq->list->end());
      return Value::make_list(std::move(items), seq->tuple);
    }
    return type_error();
  }
  if (op == "/") {
    if (!nums) return type_error();
    if (to_double(b) == 0) throw Error("division by zero");
    return Value::floating(to_double(a) / to_double(b));
  }
  if (op == "//") {
    if (!nums) return type_error();
    if (to_double(b) == 0) throw Error("integer division or modulo by zero");
    if (ints) return Value::integer(floor_div(to_int(a), to_int(b)));
    return Value::floating(std::floor(to_double(a) / to_double(b)));
  }
  if (op == "%") {
    if (a.is_string()) return Value::string(percent_format(a.s, b));
    if (!nums) return type_error();
    if (to_double(b) == 0) throw Error("integer division or modulo by zero");
    if (ints) return Value::integer(to_int(a) - floor_div(to_int(a), to_int(b)) * to_int(b));
    double m = std::fmod(to_double(a), to_double(b));
    if (m != 0 && ((m < 0) != (to_double(b) < 0))) m += to_double(b);
    return Value::floating(m);
  }
  if (op == "**") {
    if (nums && to_double(a) == 0 && to_double(b) < 0)
      throw Error(ints ? "0 cannot be raised to a negative power"
                       : "0.0 cannot be raised to a negative power");
    if (ints && to_int(b) >= 0) {
      int64_t r = 1;
      for (int64_t k = 0; k < to_int(b) && k < 64; ++k) r *= to_int(a);
      return Value::integer(r);
    }
    if (nums) return Value::floating(std::pow(to_double(a), to_double(b)));
    return type_error();
  }
  return type_error();
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Kind::string:
      if (!item.is_string())
        throw Error(fmt::format("'in <string>' requires string as left operand, not {}", type_name(item)));
      return container.s.find(item.s) != std::string::npos;
    case Kind::list:
      for (const Value& v : *container.list)
        if (equals(v, item)) return true;
      return false;
    case Kind::dict:
      if (container.ns) break;
      if ((item.is_list() && !item.tuple) || item.is_dict())
        throw Error(fmt::format("unhashable type: '{}'", type_name(item)));
      return item.is_string() && container.dict->find(item.s) != nullptr;
    case Kind::undefined:
      return false;
    default:
      break;
  }
  throw Error(fmt::format("argument of type '{}' is not iterable", type_name(container)));
}

// Python slice indices for a sequence of length n.
std::vector<size_t> slice_indices(int64_t n, const Value& start, const Value& stop, const Value& step) {
  auto opt = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (!is_intlike(v)) throw Error(fmt::format("slice {} must be an integer or None", what));
    return to_int(v);
  };
  const int64_t st = opt(step, "step").value_or(1);
  if (st == 0) throw Error("slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> x, int64_t dflt, bool is_start) {
    if (!x) return dflt;
    int64_t v = *x;
    if (v < 0) v += n;
    if (st > 0) return std::clamp<int64_t>(v, 0, n);
    (void)is_start;
    return std::clamp<int64_t>(v, -1, n - 1);
  };
  const int64_t b = clamp(opt(start, "start"), st > 0 ? 0 : n - 1, true);
  const int64_t e = clamp(opt(stop, "stop"), st > 0 ? n : -1, false);
  std::vector<size_t> out;
  if (st > 0)
    for (int64_t k = b; k < e; k += st) out.push_back(static_cast<size_t>(k));
  else
    for (int64_t k = b; k > e; k += st) out.push_back(static_cast<size_t>(k));
  return out;
}

class Renderer final : public Evaluator {
 public:
  explicit Renderer(const JinjaRenderOptions& options) : options_(options) {}

  enum class Flow { normal, break_, continue_ };

  int line() const { return line_; }

  Value call(const Value& fn, CallArgs& args) override {
    if (fn.is_undefined()) undefined_error(fn);
    if (fn.kind != Kind::callable) throw Error(fmt::format("'{}' object is not callable", type_name(fn)));
    if (fn.fn->macro) return call_macro(*fn.fn, args);
    return fn.fn->native(*this, args);
  }

  int64_t now() const override {
    return options_.now >= 0 ? options_.now : static_cast<int64_t>(std::time(nullptr));
  }

  Flow exec_body(const Body& body, const ScopePtr& scope, std::string& out) {
    for (const auto& s : body) {
      const Flow f = exec(*s, scope, out);
      if (f != Flow::normal) return f;
    }
    return Flow::normal;
  }

 private:
  void emit(std::string& out, std::string_view text) {
    if (out.size() + text.size() > options_.max_output_bytes)
      throw Error(fmt::format("the output exceeds {} bytes", options_.max_output_bytes));
    out += text;
  }

  void assign(const ScopePtr& scope, const std::vector<std::string>& targets, Value v) {
    if (targets.size() == 1) {
      scope->set(targets[0], std::move(v));
      return;
    }
    List items = iterate(v);
    if (items.size() != targets.size())
      throw Error(fmt::format("cannot unpack {} values into {} names", items.size(), targets.size()));
    for (size_t k = 0; k < targets.size(); ++k) scope->set(targets[k], items[k]);
  }

  Flow exec(const Stmt& s, const ScopePtr& scope, std::string& out) {
    line_ = s.line;
    switch (s.kind) {
      case StmtKind::text:
        emit(out, s.text);
        return Flow::normal;
      case StmtKind::output:
        emit(out, to_str(eval(*s.expr, scope)));
        return Flow::normal;
      case StmtKind::if_:
        for (const auto& [cond, body] : s.branches)
          if (truthy(eval(*cond, scope))) return exec_body(body, scope, out);
        return exec_body(s.else_body, scope, out);
      case StmtKind::for_:
        return exec_for(s, scope, out);
      case StmtKind::set:
        assign(scope, s.targets, eval(*s.expr, scope));
        return Flow::normal;
      case StmtKind::set_attr: {
        const Value* target = scope->find(s.targets[0]);
        if (!target || !target->is_dict() || !target->ns)
          throw Error(fmt::format("cannot assign attribute on non-namespace object '{}'", s.targets[0]));
        target->dict->set(s.targets[1], eval(*s.expr, scope));
        return Flow::normal;
      }
      case StmtKind::set_block: {
        std::string text;
        exec_body(s.body, child_of(scope), text);
        Value v = Value::string(std::move(text));
        if (s.expr) v = eval_with_input(*s.expr, scope, std::move(v));
        assign(scope, s.targets, std::move(v));
        return Flow::normal;
      }
      case StmtKind::macro: {
        const auto& m = static_cast<const MacroStmt&>(s);
        Value fn;
        fn.kind = Kind::callable;
        fn.fn = std::make_shared<Callable>();
        fn.fn->name = m.name;
        fn.fn->macro = &m;
        fn.fn->closure = scope;
        if (closures_.empty() || closures_.back() != scope) closures_.push_back(scope);
        scope->set(m.name, std::move(fn));
        return Flow::normal;
      }
      case StmtKind::call_block: {
        const auto& m = static_cast<const MacroStmt&>(s);
        Value caller;
        caller.kind = Kind::callable;
        caller.fn = std::make_shared<Callable>();
        caller.fn->name = "caller";
        caller.fn->macro = &m;
        caller.fn->closure = scope;
        if (closures_.empty() || closures_.back() != scope) closures_.push_back(scope);
        const Expr& call_expr = *m.expr;
        Value fn = eval(*call_expr.kids[0], scope);
        CallArgs args = eval_args(call_expr, scope, 1);
        args.kw.emplace_back("caller", std::move(caller));
        emit(out, to_str(call(fn, args)));
        return Flow::normal;
      }
      case StmtKind::filter_block: {
        std::string text;
        exec_body(s.body, child_of(scope), text);
        emit(out, to_str(eval_with_input(*s.expr, scope, Value::string(std::move(text)))));
        return Flow::normal;
      }
      case StmtKind::break_:
        return Flow::break_;
      case StmtKind::continue_:
        return Flow::continue_;
      case StmtKind::scope:
        exec_body(s.body, child_of(scope), out);
        return Flow::normal;
    }
    return Flow::normal;
  }

  Flow exec_for(const Stmt& s, const ScopePtr& scope, std::string& out) {
    List items = iterate(eval(*s.expr, scope));
    if (s.loop_filter) {
      List kept;
      for (Value& v : items) {
        ScopePtr test_scope = child_of(scope);
        assign(test_scope, s.targets, v);
        if (truthy(eval(*s.loop_filter, test_scope))) kept.push_back(std::move(v));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      exec_body(s.else_body, child_of(scope), out);
      return Flow::normal;
    }
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < n; ++k) {
      ScopePtr iter_scope = child_of(scope);
      Value loop = Value::make_dict();
      Dict& d = *loop.dict;
      d.items.reserve(11);
      d.items.emplace_back("index", Value::integer(k + 1));
      d.items.emplace_back("index0", Value::integer(k));
      d.items.emplace_back("revindex", Value::integer(n - k));
      d.items.emplace_back("revindex0", Value::integer(n - k - 1));
      d.items.emplace_back("first", Value::boolean(k == 0));
      d.items.emplace_back("last", Value::boolean(k == n - 1));
      d.items.emplace_back("length", Value::integer(n));
      d.items.emplace_back("depth", Value::integer(1));
      d.items.emplace_back("depth0", Value::integer(0));
      d.items.emplace_back(
          "previtem", k > 0 ? items[static_cast<size_t>(k - 1)] : Value::undef("there is no previous item"));
      d.items.emplace_back(
          "nextitem", k + 1 < n ? items[static_cast<size_t>(k + 1)] : Value::undef("there is no next item"));
      iter_scope->vars.emplace_back("loop", std::move(loop));
      assign(iter_scope, s.targets, items[static_cast<size_t>(k)]);
      if (exec_body(s.body, iter_scope, out) == Flow::break_) break;
    }
    return Flow::normal;
  }

  Value call_macro(const Callable& c, CallArgs& args) {
    const MacroStmt& m = *c.macro;
    if (++depth_ > options_.max_depth)
      throw Error(fmt::format("macro calls nested deeper than {}", options_.max_depth));
    ScopePtr closure = c.closure.lock();
    if (!closure) throw Error(fmt::format("macro '{}' called after its render ended", m.name));
    ScopePtr scope = child_of(closure);
    if (args.pos.size() > m.params.size())
      throw Error(fmt::format("macro '{}' takes not more than {} argument(s)", m.name, m.params.size()));
    for (const auto& [k, v] : args.kw) {
      if (k == "caller" && m.kind == StmtKind::macro) {
        scope->set("caller", v);
        continue;
      }
      if (std::find(m.params.begin(), m.params.end(), k) == m.params.end())
        throw Error(fmt::format("macro '{}' takes no keyword argument '{}'", m.name, k));
    }
    for (size_t p = 0; p < m.params.size(); ++p) {
      const Value* given = args.get(p, m.params[p]);
      if (given)
        scope->set(m.params[p], *given);
      else if (m.defaults[p])
        scope->set(m.params[p], eval(*m.defaults[p], scope));
      else
        scope->set(m.params[p], Value::undef(fmt::format("'{}' is undefined", m.params[p])));
    }
    std::string out;
    const int saved_line = line_;
    exec_body(m.body, scope, out);
    line_ = saved_line;
    --depth_;
    return Value::string(std::move(out));
  }

  CallArgs eval_args(const Expr& e, const ScopePtr& scope, size_t first) {
    CallArgs args;
    for (size_t k = first; k < e.kids.size(); ++k) args.pos.push_back(eval(*e.kids[k], scope));
    for (const auto& [name, x] : e.kwargs) args.kw.emplace_back(name, eval(*x, scope));
    return args;
  }

  // A filter chain whose innermost input is a block's text.
  Value eval_with_input(const Expr& e, const ScopePtr& scope, Value input) {
    Value in = e.kids[0] ? eval_with_input(*e.kids[0], scope, std::move(input)) : std::move(input);
    return run_filter(e, scope, std::move(in));
  }

  Value run_filter(const Expr& e, const ScopePtr& scope, Value in) {
    if (!e.known) throw Error(fmt::format("no filter named '{}'", e.name), e.line);
    CallArgs args = eval_args(e, scope, 1);
    return apply_filter(*this, e.name, std::move(in), args);
  }

  // Expression evaluation nested this deep (through macro calls too) fails instead of
  // overflowing the stack; Python's own recursion limit stops Jinja2 at a similar depth.
  static constexpr int kMaxEvalDepth = 1000;

  Value eval(const Expr& e, const ScopePtr& scope) {
    struct Guard {
      explicit Guard(int& d) : depth(d) {
        if (++depth > kMaxEvalDepth) throw Error("expressions and macro calls nested too deeply");
      }
      ~Guard() { --depth; }
      int& depth;
    } guard(eval_depth_);
    return eval_expr(e, scope);
  }

  Value eval_expr(const Expr& e, const ScopePtr& scope) {
    line_ = e.line;
    switch (e.kind) {
      case ExprKind::literal:
        return e.literal;
      case ExprKind::name: {
        if (const Value* v = scope->find(e.name)) return *v;
        Value g = global_function(e.name);
        if (!g.is_undefined()) return g;
        return Value::undef(fmt::format("'{}' is undefined", e.name));
      }
      case ExprKind::list:
      case ExprKind::tuple: {
        List items;
        for (const auto& k : e.kids) items.push_back(eval(*k, scope));
        return Value::make_list(std::move(items), e.kind == ExprKind::tuple);
      }
      case ExprKind::dict: {
        Value d = Value::make_dict();
        for (size_t k = 0; k + 1 < e.kids.size(); k += 2) {
          Value key = eval(*e.kids[k], scope);
          d.dict->set(key.is_string() ? key.s : to_str(key), eval(*e.kids[k + 1], scope));
        }
        return d;
      }
      case ExprKind::getattr:
        return get_attr(eval(*e.kids[0], scope), e.name);
      case ExprKind::getitem: {
        Value obj = eval(*e.kids[0], scope);
        return get_item(obj, eval(*e.kids[1], scope));
      }
      case ExprKind::slice: {
        Value obj = eval(*e.kids[0], scope);
        auto part = [&](size_t k) { return e.kids[k] ? eval(*e.kids[k], scope) : Value::none(); };
        const Value start = part(1), stop = part(2), step = part(3);
        if (obj.is_undefined()) undefined_error(obj);
        if (obj.is_string()) {
          const std::u32string u = utf8_decode(obj.s);
          std::u32string r;
          for (size_t k : slice_indices(static_cast<int64_t>(u.size()), start, stop, step)) r.push_back(u[k]);
          return Value::string(utf8_encode(r));
        }
        if (obj.is_list()) {
          List r;
          for (size_t k : slice_indices(static_cast<int64_t>(obj.list->size()), start, stop, step))
            r.push_back((*obj.list)[k]);
          return Value::make_list(std::move(r), obj.tuple);
        }
        return Value::undef(fmt::format("'{}' object is not subscriptable", type_name(obj)));
      }
      case ExprKind::call: {
        Value fn = eval(*e.kids[0], scope);
        CallArgs args = eval_args(e, scope, 1);
        Value r = call(fn, args);
        line_ = e.line;
        return r;
      }
      case ExprKind::filter:
        return run_filter(e, scope, eval(*e.kids[0], scope));
      case ExprKind::test: {
        if (!e.known) throw Error(fmt::format("no test named '{}'", e.name), e.line);
        Value in = eval(*e.kids[0], scope);
        CallArgs args = eval_args(e, scope, 1);
        return Value::boolean(apply_test(*this, e.name, in, args) != e.negated);
      }
      case ExprKind::neg:
      case ExprKind::pos: {
        Value v = eval(*e.kids[0], scope);
        if (v.is_undefined()) undefined_error(v);
        if (!v.is_number())
          throw Error(fmt::format("bad operand type for unary {}: '{}'", e.kind == ExprKind::neg ? '-' : '+',
                                  type_name(v)));
        if (e.kind == ExprKind::pos) return is_intlike(v) ? Value::integer(to_int(v)) : v;
        return is_intlike(v) ? Value::integer(-to_int(v)) : Value::floating(-v.f);
      }
      case ExprKind::not_:
        return Value::boolean(!truthy(eval(*e.kids[0], scope)));
      case ExprKind::and_: {
        Value a = eval(*e.kids[0], scope);
        return truthy(a) ? eval(*e.kids[1], scope) : a;
      }
      case ExprKind::or_: {
        Value a = eval(*e.kids[0], scope);
        return truthy(a) ? a : eval(*e.kids[1], scope);
      }
      case ExprKind::binary: {
        Value a = eval(*e.kids[0], scope);
        Value b = eval(*e.kids[1], scope);
        line_ = e.line;
        return arithmetic(e.name, a, b);
      }
      case ExprKind::compare: {
        Value a = eval(*e.kids[0], scope);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value b = eval(*e.kids[k + 1], scope);
          const std::string& op = e.ops[k];
          bool r;
          if (op == "==")
            r = equals(a, b);
          else if (op == "!=")
            r = !equals(a, b);
          else if (op == "<")
            r = less(a, b);
          else if (op == ">")
            r = less(b, a);
          else if (op == "<=")
            r = less(a, b) || equals(a, b);
          else if (op == ">=")
            r = less(b, a) || equals(a, b);
          else if (op == "in")
            r = contains(b, a);
          else
            r = !contains(b, a);
          if (!r) return Value::boolean(false);
          a = std::move(b);
        }
        return Value::boolean(true);
      }
      case ExprKind::cond:
        if (truthy(eval(*e.kids[1], scope))) return eval(*e.kids[0], scope);
        if (e.kids[2]) return eval(*e.kids[2], scope);
        return Value::undef("the inline if-expression evaluated to false and no else section was defined");
    }
    return Value::undef();
  }

  const JinjaRenderOptions& options_;
  int line_ = 0;
  int depth_ = 0;
  int eval_depth_ = 0;
  std::vector<ScopePtr> closures_;  // scopes that define macros (see Callable::closure)
};

}  // namespace

}  // namespace loom::jinja

namespace loom {

Result<JinjaTemplate> JinjaTemplate::parse(std::string_view source, std::string name) {
  try {
    JinjaTemplate t;
    t.program_ = jinja::parse_program(source, name);
    return t;
  } catch (const jinja::Error& e) {
    return make_error(StatusCode::format_error, "{}: line {}: {}", name, e.line, e.what());
  } catch (const std::exception& e) {
    return make_error(StatusCode::format_error, "{}: {}", name, e.what());
  }
}

const std::string& JinjaTemplate::name() const { return program_->name; }

Result<std::string> JinjaTemplate::render(const nlohmann::ordered_json& context,
                                          const JinjaRenderOptions& options) const {
  if (!program_) return make_error(StatusCode::invalid_argument, "jinja: render of an empty template");
  if (!context.is_object())
    return make_error(StatusCode::invalid_argument, "{}: the context must be a JSON object", program_->name);
  jinja::Renderer renderer(options);
  try {
    auto root = std::make_shared<jinja::Scope>();
    for (auto it = context.begin(); it != context.end(); ++it)
      root->vars.emplace_back(it.key(), jinja::Value::from_json(it.value()));
    std::string out;
    renderer.exec_body(program_->body, root, out);
    return out;
  } catch (const jinja::Error& e) {
    return make_error(StatusCode::invalid_argument, "{}: line {}: {}", program_->name,
                      e.line > 0 ? e.line : renderer.line(), e.what());
  } catch (const std::exception& e) {
    return make_error(StatusCode::invalid_argument, "{}: line {}: {}", program_->name, renderer.line(),
                      e.what());
  }
}

Result<std::string> render_jinja_chat(const JinjaTemplate& t, const JinjaChatInputs& in,
                                      const JinjaRenderOptions& options) {
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  ctx["messages"] = in.messages ? *in.messages : nlohmann::ordered_json::array();
  ctx["tools"] = in.tools ? *in.tools : nlohmann::ordered_json(nullptr);
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = in.add_generation_prompt;
  ctx["bos_token"] = in.bos_token;
  ctx["eos_token"] = in.eos_token;
  return t.render(ctx, options);
}

}  // namespace loom
