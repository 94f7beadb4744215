// Internals of the Jinja interpreter (loom/jinja.h): the value type, the syntax tree, and the
// pieces shared by the parser (jinja_parse.cpp), the evaluator (jinja_eval.cpp), the values'
// Python-like behaviour (jinja_value.cpp) and the filters, tests and methods (jinja_builtins.cpp).
//
// Errors inside the interpreter are thrown as jinja::Error and turned into a Status at the public
// boundary (JinjaTemplate::parse / render): evaluation is deeply recursive and every expression
// can fail, and nothing outside this library sees the exception.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace loom::jinja {

/// A template error; `line` 0 when not yet known (the evaluator adds the statement's line).
struct Error : std::runtime_error {
  Error(const std::string& what, int line_ = 0) : std::runtime_error(what), line(line_) {}
  int line;
};

struct Value;
struct Dict;
struct Callable;
using List = std::vector<Value>;

enum class Kind : uint8_t { undefined, none, boolean, integer, floating, string, list, dict, callable };

/// A Jinja value. Lists and dicts are shared (Python reference semantics; the sandbox keeps them
/// immutable, except namespaces whose attributes `set` assigns).
struct Value {
  Kind kind = Kind::undefined;
  bool tuple = false;      // a list written as a tuple (prints with parentheses)
  bool ns = false;         // a dict that is a namespace()
  bool generator = false;  // a list a filter yields lazily in Jinja2 (map, select...): no len(), no JSON
  bool markup = false;     // a string marked safe (markupsafe.Markup): `+` escapes the other operand
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // the string; for undefined, a hint for error messages
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<Callable> fn;

  static Value undef(std::string hint = {}) {
    Value v;
    v.s = std::move(hint);
    return v;
  }
  static Value none() {
    Value v;
    v.kind = Kind::none;
    return v;
  }
  static Value boolean(bool x) {
    Value v;
    v.kind = Kind::boolean;
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v;
    v.kind = Kind::integer;
    v.i = x;
    return v;
  }
  static Value floating(double x) {
    Value v;
    v.kind = Kind::floating;
    v.f = x;
    return v;
  }
  static Value string(std::string x) {
    Value v;
    v.kind = Kind::string;
    v.s = std::move(x);
    return v;
  }
  static Value make_list(List items = {}, bool is_tuple = false);
  static Value make_dict();
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return kind == Kind::undefined; }
  bool is_none() const { return kind == Kind::none; }
  bool is_string() const { return kind == Kind::string; }
  bool is_number() const { return kind == Kind::integer || kind == Kind::floating || kind == Kind::boolean; }
  bool is_list() const { return kind == Kind::list; }
  bool is_dict() const { return kind == Kind::dict; }
};

struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
};

/// Positional and keyword arguments of a call.
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  /// Positional `index`, else keyword `name`, else nullptr.
  const Value* get(size_t index, std::string_view name) const;
};

class Evaluator;
using NativeFn = std::function<Value(Evaluator&, CallArgs&)>;
struct MacroStmt;
struct Scope;

/// A function value: a built-in (global function or bound method), or a macro with its scope.
struct Callable {
  std::string name;
  NativeFn native;
  const MacroStmt* macro = nullptr;
  // Weak: the scope holds the macro, so a strong pointer would be a cycle; the renderer keeps
  // every scope that defines a macro alive until the render ends.
  std::weak_ptr<Scope> closure;
  Value caller;  // the `caller` a {% call %} block passes
};

// ---- Python-like value behaviour (jinja_value.cpp) ----------------------------------------------
bool truthy(const Value& v);
/// str(v) as Python prints it; undefined is "".
std::string to_str(const Value& v);
/// repr(v) as Python writes it.
std::string repr(const Value& v);
/// Python's float repr ("1.0", "0.1", "1e-05", "1e+16").
std::string float_repr(double d);
/// json.dumps(v, ensure_ascii=False, indent=indent, separators=...) as transformers' tojson.
/// `indent` < 0: none; `item_sep`/`key_sep` empty: the json module's defaults.
std::string to_json(const Value& v, int indent, const std::string& item_sep = {},
                    const std::string& key_sep = {}, bool sort_keys = false);
/// Python ==.
bool equals(const Value& a, const Value& b);
/// Python <, or an Error for unorderable types.
bool less(const Value& a, const Value& b);
/// Python's type name for messages ("str", "int", "dict", "NoneType").
const char* type_name(const Value& v);
/// The items a for loop goes through (list items, dict keys, string characters).
List iterate(const Value& v);
/// len(v), or an Error.
int64_t length(const Value& v);

// ---- UTF-8 and Python string helpers (jinja_value.cpp) -----------------------------------------
std::u32string utf8_decode(std::string_view s);
std::string utf8_encode(std::u32string_view s);
void utf8_append(std::string& out, char32_t c);
/// str.isspace() for one code point.
bool py_isspace(char32_t c);
/// str.strip/lstrip/rstrip: `chars` nullptr strips whitespace.
std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right);
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
/// markupsafe.escape: & < > " ' as HTML entities.
std::string html_escape(std::string_view s);

// ---- Syntax tree --------------------------------------------------------------------------------
enum class ExprKind : uint8_t {
  literal,
  name,
  list,
  tuple,
  dict,
  getattr,
  getitem,
  slice,
  call,
  filter,
  test,
  neg,
  pos,
  not_,
  and_,
  or_,
  binary,
  compare,
  cond,
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind;
  int line = 0;
  Value literal;                                        // literal
  std::string name;                                     // name, attribute, filter/test name, binary operator
  std::vector<ExprPtr> kids;                            // operands; call: callee then positional args
  std::vector<std::string> ops;                         // compare: the operators between kids
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // call/filter/test keyword arguments
  bool negated = false;                                 // test: `is not`
  bool known = true;  // filter/test: exists (unknown ones fail when evaluated)
};

enum class StmtKind : uint8_t {
  text,
  output,
  if_,
  for_,
  set,
  set_attr,
  set_block,
  macro,
  call_block,
  filter_block,
  break_,
  continue_,
  scope,
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  explicit Stmt(StmtKind k, int l) : kind(k), line(l) {}
  virtual ~Stmt() = default;
  StmtKind kind;
  int line;
  std::string text;                  // text
  ExprPtr expr;                      // output, set value, for iterable, call_block call, filter_block filter
  std::vector<std::string> targets;  // set / for / set_block target names; set_attr: {ns, attr}
  std::vector<std::pair<ExprPtr, Body>> branches;  // if/elif
  Body body;            // for, set_block, macro, call_block, filter_block, scope, if else
  Body else_body;       // for else, if else
  ExprPtr loop_filter;  // for ... if cond
};

struct MacroStmt : Stmt {
  MacroStmt(int l) : Stmt(StmtKind::macro, l) {}
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // one per param, null where none
};

struct Program {
  std::string name;
  Body body;
};

// ---- Tokens (jinja_lexer.cpp) -------------------------------------------------------------------
enum class Tok : uint8_t {
  data,
  var_begin,
  var_end,
  block_begin,
  block_end,
  name,
  string,
  integer,
  floating,
  op,
  eof
};

struct Token {
  Tok type;
  std::string value;
  int line;
};

/// The tokens of a template: data, and the contents of {{ }} and {% %} tags; throws Error.
std::vector<Token> lex(std::string_view source);

/// Parses a template (jinja_parse.cpp); throws Error with the line.
std::unique_ptr<Program> parse_program(std::string_view source, std::string name);

// ---- Built-ins (jinja_builtins.cpp) -------------------------------------------------------------
bool has_filter(std::string_view name);
bool has_test(std::string_view name);
Value apply_filter(Evaluator& ev, const std::string& name, Value input, CallArgs& args);
bool apply_test(Evaluator& ev, const std::string& name, const Value& input, CallArgs& args);
/// obj.name: a bound method, a dict key, a namespace attribute, or undefined.
Value get_attr(const Value& obj, const std::string& name);
/// obj[key] with Jinja's fallback to an attribute.
Value get_item(const Value& obj, const Value& key);
/// The global functions: range, namespace, dict, raise_exception, strftime_now.
Value global_function(const std::string& name);

// Shared by the built-ins (jinja_methods.cpp).
[[noreturn]] void undefined_error(const Value& v);
inline bool is_intlike(const Value& v) { return v.kind == Kind::integer || v.kind == Kind::boolean; }
inline int64_t as_int(const Value& v) {
  return v.kind == Kind::boolean ? (v.b ? 1 : 0) : v.kind == Kind::floating ? static_cast<int64_t>(v.f) : v.i;
}
/// A built-in function value.
Value native(std::string name, NativeFn fn);
/// Argument `index` or `name` as a string / truth value.
std::string arg_str(const CallArgs& a, size_t i, std::string_view name, const char* what);
bool arg_bool(const CallArgs& a, size_t i, std::string_view name, bool dflt);
/// str.split() without a separator.
List split_whitespace(const std::string& s, int64_t maxsplit, bool from_right);
/// str.replace, str.capitalize.
std::string py_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count);
std::string py_capitalize(const std::string& s);
/// s.name(args) for a Python str method.
Value string_method(const std::string& s, const std::string& name, Evaluator& ev, CallArgs& a);
/// dict.items() as a list of (key, value) tuples.
Value dict_items(const Value& d);
/// The value at attribute path "a.b.0" (Jinja's make_attrgetter).
Value attr_path(const Value& v, const std::string& path);

/// Rendering state the built-ins need (jinja_eval.cpp).
class Evaluator {
 public:
  virtual ~Evaluator() = default;
  /// Calls a function value (macro or built-in).
  virtual Value call(const Value& fn, CallArgs& args) = 0;
  /// `strftime_now`'s clock, seconds since the epoch.
  virtual int64_t now() const = 0;
};

}  // namespace loom::jinja
