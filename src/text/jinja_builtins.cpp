// Jinja built-ins: filters and tests (Jinja2 3.1 semantics, `tojson` as transformers overrides
// it), the Python methods templates call on strings, dicts and lists (as the immutable sandbox
// allows them), attribute and item access, and the global functions.
#include <algorithm>
#include <cmath>
#include <ctime>

#include <fmt/format.h>

#include "jinja_internal.h"

namespace loom::jinja {

namespace {

[[noreturn]] void undefined_error(const Value& v) { throw Error(v.s.empty() ? std::string("undefined value") : v.s); }

int64_t as_int(const Value& v) { return v.kind == Kind::boolean ? (v.b ? 1 : 0) : v.kind == Kind::floating ? static_cast<int64_t>(v.f) : v.i; }
bool is_intlike(const Value& v) { return v.kind == Kind::integer || v.kind == Kind::boolean; }

Value native(std::string name, NativeFn fn) {
  Value v;
  v.kind = Kind::callable;
  v.fn = std::make_shared<Callable>();
  v.fn->name = std::move(name);
  v.fn->native = std::move(fn);
  return v;
}

std::string arg_str(const CallArgs& a, size_t i, std::string_view name, const char* what) {
  const Value* v = a.get(i, name);
  if (!v) throw Error(fmt::format("{}() missing argument '{}'", what, name));
  if (!v->is_string()) throw Error(fmt::format("{}() argument must be str, not {}", what, type_name(*v)));
  return v->s;
}

bool arg_bool(const CallArgs& a, size_t i, std::string_view name, bool dflt) {
  const Value* v = a.get(i, name);
  return v ? truthy(*v) : dflt;
}

// ---- Python str methods -------------------------------------------------------------------------

List split_whitespace(const std::string& s, int64_t maxsplit, bool from_right) {
  std::u32string u = utf8_decode(s);
  if (from_right) std::reverse(u.begin(), u.end());
  List out;
  size_t i = 0;
  while (i < u.size()) {
    while (i < u.size() && py_isspace(u[i])) ++i;
    if (i >= u.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      size_t e = u.size();
      while (e > i && py_isspace(u[e - 1])) --e;
      std::u32string rest = u.substr(i, e - i);
      if (from_right) std::reverse(rest.begin(), rest.end());
      out.push_back(Value::string(utf8_encode(rest)));
      break;
    }
    size_t j = i;
    while (j < u.size() && !py_isspace(u[j])) ++j;
    std::u32string word = u.substr(i, j - i);
    if (from_right) std::reverse(word.begin(), word.end());
    out.push_back(Value::string(utf8_encode(word)));
    i = j;
  }
  if (from_right) std::reverse(out.begin(), out.end());
  return out;
}

List split_sep(const std::string& s, const std::string& sep, int64_t maxsplit, bool from_right) {
  if (sep.empty()) throw Error("empty separator");
  List out;
  if (!from_right) {
    size_t start = 0;
    for (;;) {
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) break;
      const size_t at = s.find(sep, start);
      if (at == std::string::npos) break;
      out.push_back(Value::string(s.substr(start, at - start)));
      start = at + sep.size();
    }
    out.push_back(Value::string(s.substr(start)));
    return out;
  }
  size_t end = s.size();
  List rev;
  for (;;) {
    if (maxsplit >= 0 && static_cast<int64_t>(rev.size()) == maxsplit) break;
    if (end < sep.size()) break;
    const size_t at = s.rfind(sep, end - sep.size());
    if (at == std::string::npos) break;
    rev.push_back(Value::string(s.substr(at + sep.size(), end - at - sep.size())));
    end = at;
  }
  rev.push_back(Value::string(s.substr(0, end)));
  std::reverse(rev.begin(), rev.end());
  return rev;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count) {
  if (old.empty()) {
    std::string out;
    int64_t n = 0;
    for (char32_t c : utf8_decode(s)) {
      if (count < 0 || n < count) {
        out += repl;
        ++n;
      }
      utf8_append(out, c);
    }
    if (count < 0 || n < count) out += repl;
    return out;
  }
  std::string out;
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t at = s.find(old, start);
    if (at == std::string::npos) break;
    out.append(s, start, at - start);
    out += repl;
    start = at + old.size();
    ++n;
  }
  out.append(s, start, std::string::npos);
  return out;
}

bool is_cased_letter(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  return py_upper(utf8_encode(std::u32string(1, c))) != py_lower(utf8_encode(std::u32string(1, c)));
}

std::string py_capitalize(const std::string& s) {
  std::u32string u = utf8_decode(s);
  if (u.empty()) return s;
  std::string first = py_upper(utf8_encode(u.substr(0, 1)));
  return first + py_lower(utf8_encode(u.substr(1)));
}

std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (char32_t c : utf8_decode(s)) {
    const std::string one = utf8_encode(std::u32string(1, c));
    const bool cased = is_cased_letter(c);
    out += cased ? (prev_cased ? py_lower(one) : py_upper(one)) : one;
    prev_cased = cased;
  }
  return out;
}

// Code-point index of a byte offset.
int64_t cp_index(const std::string& s, size_t byte) {
  return static_cast<int64_t>(utf8_decode(std::string_view(s).substr(0, byte)).size());
}

std::string py_format(const std::string& f, const CallArgs& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] == '{') {
      if (i + 1 < f.size() && f[i + 1] == '{') {
        out.push_back('{');
        ++i;
        continue;
      }
      const size_t close = f.find('}', i);
      if (close == std::string::npos) throw Error("Single '{' encountered in format string");
      std::string field = f.substr(i + 1, close - i - 1);
      const size_t colon = field.find(':');
      if (colon != std::string::npos) field.resize(colon);
      const Value* v = nullptr;
      if (field.empty()) {
        v = auto_index < a.pos.size() ? &a.pos[auto_index] : nullptr;
        ++auto_index;
      } else if (std::all_of(field.begin(), field.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        const size_t k = std::stoul(field);
        v = k < a.pos.size() ? &a.pos[k] : nullptr;
      } else {
        for (const auto& [k, x] : a.kw)
          if (k == field) v = &x;
      }
      if (!v) throw Error(fmt::format("format: no argument for '{{{}}}'", field));
      out += to_str(*v);
      i = close;
    } else if (f[i] == '}') {
      if (i + 1 < f.size() && f[i + 1] == '}') ++i;
      out.push_back('}');
    } else {
      out.push_back(f[i]);
    }
  }
  return out;
}

Value string_method(const std::string& s, const std::string& name, Evaluator&, CallArgs& a) {
  auto opt_str = [&](size_t i, std::string_view n) -> const std::string* {
    const Value* v = a.get(i, n);
    if (!v || v->is_none()) return nullptr;
    if (!v->is_string()) throw Error(fmt::format("{}() argument must be str or None, not {}", name, type_name(*v)));
    return &v->s;
  };
  auto opt_int = [&](size_t i, std::string_view n, int64_t dflt) {
    const Value* v = a.get(i, n);
    return v && is_intlike(*v) ? as_int(*v) : dflt;
  };
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return Value::string(py_strip(s, opt_str(0, "chars"), name != "rstrip", name != "lstrip"));
  if (name == "split" || name == "rsplit") {
    const std::string* sep = opt_str(0, "sep");
    const int64_t maxsplit = opt_int(1, "maxsplit", -1);
    return Value::make_list(sep ? split_sep(s, *sep, maxsplit, name == "rsplit")
                                : split_whitespace(s, maxsplit, name == "rsplit"));
  }
  if (name == "startswith" || name == "endswith") {
    const Value* p = a.get(0, "prefix");
    if (!p) throw Error(fmt::format("{}() takes at least 1 argument", name));
    List options = p->is_list() ? *p->list : List{*p};
    for (const Value& o : options) {
      if (!o.is_string()) throw Error(fmt::format("{} first arg must be str or a tuple of str", name));
      const bool hit = name == "startswith" ? s.compare(0, o.s.size(), o.s) == 0 && s.size() >= o.s.size()
                                            : s.size() >= o.s.size() && s.compare(s.size() - o.s.size(), o.s.size(), o.s) == 0;
      if (hit) return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  if (name == "upper") return Value::string(py_upper(s));
  if (name == "lower") return Value::string(py_lower(s));
  if (name == "title") return Value::string(py_title(s));
  if (name == "capitalize") return Value::string(py_capitalize(s));
  if (name == "replace")
    return Value::string(py_replace(s, arg_str(a, 0, "old", "replace"), arg_str(a, 1, "new", "replace"), opt_int(2, "count", -1)));
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    const std::string sub = arg_str(a, 0, "sub", name.c_str());
    const size_t at = name[0] == 'r' ? s.rfind(sub) : s.find(sub);
    if (at == std::string::npos) {
      if (name == "index" || name == "rindex") throw Error("substring not found");
      return Value::integer(-1);
    }
    return Value::integer(cp_index(s, at));
  }
  if (name == "count") {
    const std::string sub = arg_str(a, 0, "sub", "count");
    if (sub.empty()) return Value::integer(static_cast<int64_t>(utf8_decode(s).size()) + 1);
    int64_t n = 0;
    for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
    return Value::integer(n);
  }
  if (name == "format") return Value::string(py_format(s, a));
  if (name == "join") {
    const Value* it = a.get(0, "iterable");
    if (!it) throw Error("join() takes exactly one argument");
    std::string out;
    bool first = true;
    for (const Value& v : iterate(*it)) {
      if (!v.is_string()) throw Error(fmt::format("sequence item: expected str instance, {} found", type_name(v)));
      if (!first) out += s;
      first = false;
      out += v.s;
    }
    return Value::string(std::move(out));
  }
  if (name == "splitlines") {
    List out;
    const bool keep = arg_bool(a, 0, "keepends", false);
    std::string line;
    const std::u32string u = utf8_decode(s);
    for (size_t i = 0; i < u.size(); ++i) {
      const char32_t c = u[i];
      const bool brk = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || (c >= 0x1c && c <= 0x1e) || c == 0x85 ||
                       c == 0x2028 || c == 0x2029;
      if (!brk) {
        utf8_append(line, c);
        continue;
      }
      std::string ending;
      utf8_append(ending, c);
      if (c == '\r' && i + 1 < u.size() && u[i + 1] == '\n') {
        ending += '\n';
        ++i;
      }
      out.push_back(Value::string(keep ? line + ending : line));
      line.clear();
    }
    if (!line.empty()) out.push_back(Value::string(line));
    return Value::make_list(std::move(out));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const std::string x = arg_str(a, 0, "prefix", name.c_str());
    if (name == "removeprefix") return Value::string(s.compare(0, x.size(), x) == 0 && s.size() >= x.size() ? s.substr(x.size()) : s);
    return Value::string(s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0 ? s.substr(0, s.size() - x.size()) : s);
  }
  auto all_of = [&](auto pred) {
    const std::u32string u = utf8_decode(s);
    return Value::boolean(!u.empty() && std::all_of(u.begin(), u.end(), pred));
  };
  if (name == "isdigit" || name == "isnumeric" || name == "isdecimal") return all_of([](char32_t c) { return c >= '0' && c <= '9'; });
  if (name == "isalpha") return all_of([](char32_t c) { return is_cased_letter(c); });
  if (name == "isalnum") return all_of([](char32_t c) { return is_cased_letter(c) || (c >= '0' && c <= '9'); });
  if (name == "isspace") return all_of([](char32_t c) { return py_isspace(c); });
  if (name == "isupper") return Value::boolean(py_upper(s) == s && py_lower(s) != s);
  if (name == "islower") return Value::boolean(py_lower(s) == s && py_upper(s) != s);
  throw Error(fmt::format("'str' object has no attribute '{}'", name));
}

bool is_string_method(const std::string& n) {
  static const char* const kNames[] = {"strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith",
                                       "upper", "lower", "title", "capitalize", "replace", "find", "rfind", "index",
                                       "rindex", "count", "format", "join", "splitlines", "removeprefix",
                                       "removesuffix", "isdigit", "isnumeric", "isdecimal", "isalpha", "isalnum",
                                       "isspace", "isupper", "islower"};
  return std::find(std::begin(kNames), std::end(kNames), n) != std::end(kNames);
}

Value dict_items(const Value& d) {
  List out;
  for (const auto& [k, v] : d.dict->items) out.push_back(Value::make_list({Value::string(k), v}, true));
  return Value::make_list(std::move(out));
}

Value bound_method(const Value& obj, const std::string& name) {
  return native(name, [obj, name](Evaluator& ev, CallArgs& a) -> Value {
    if (obj.is_string()) {
      Value r = string_method(obj.s, name, ev, a);
      // markupsafe.Markup's methods that return Markup
      if (obj.markup && r.is_string() && name != "format" && name != "join" && name != "find")
        r.markup = name == "strip" || name == "lstrip" || name == "rstrip" || name == "upper" ||
                   name == "lower" || name == "replace" || name == "capitalize" || name == "title";
      return r;
    }
    if (obj.is_dict()) {
      if (name == "get") {
        const Value* k = a.get(0, "key");
        if (!k) throw Error("get expected at least 1 argument, got 0");
        const Value* dflt = a.get(1, "default");
        const Value* found = k->is_string() ? obj.dict->find(k->s) : nullptr;
        return found ? *found : dflt ? *dflt : Value::none();
      }
      if (name == "items") return dict_items(obj);
      List out;
      for (const auto& [k, v] : obj.dict->items) out.push_back(name == "keys" ? Value::string(k) : v);
      if (name == "copy") {
        Value d = Value::make_dict();
        d.dict->items = obj.dict->items;
        return d;
      }
      return Value::make_list(std::move(out));
    }
    // list: index, count
    const Value* x = a.get(0, "value");
    if (!x) throw Error(fmt::format("{}() takes exactly one argument", name));
    int64_t n = 0;
    for (size_t k = 0; k < obj.list->size(); ++k)
      if (equals((*obj.list)[k], *x)) {
        if (name == "index") return Value::integer(static_cast<int64_t>(k));
        ++n;
      }
    if (name == "index") throw Error(fmt::format("{} is not in list", repr(*x)));
    return Value::integer(n);
  });
}

Value unsafe(const Value& obj, const std::string& name) {
  return Value::undef(fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, type_name(obj)));
}

}  // namespace

Value get_attr(const Value& obj, const std::string& name) {
  switch (obj.kind) {
    case Kind::undefined:
      undefined_error(obj);
    case Kind::dict:
      if (obj.ns) {
        if (const Value* v = obj.dict->find(name)) return *v;
        break;
      }
      if (name == "get" || name == "items" || name == "keys" || name == "values" || name == "copy")
        return bound_method(obj, name);
      if (name == "pop" || name == "popitem" || name == "setdefault" || name == "update" || name == "clear")
        return unsafe(obj, name);
      if (const Value* v = obj.dict->find(name)) return *v;
      break;
    case Kind::string:
      if (is_string_method(name)) return bound_method(obj, name);
      break;
    case Kind::list:
      if (obj.tuple ? (name == "index" || name == "count") : (name == "index" || name == "count")) return bound_method(obj, name);
      if (name == "append" || name == "extend" || name == "insert" || name == "pop" || name == "remove" ||
          name == "reverse" || name == "sort" || name == "clear")
        return unsafe(obj, name);
      break;
    default:
      break;
  }
  return Value::undef(fmt::format("'{}' has no attribute '{}'", obj.is_none() ? "None" : std::string(type_name(obj)) + " object", name));
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_list() && obj.generator) return Value::undef("'generator' object is not subscriptable");
  switch (obj.kind) {
    case Kind::undefined:
      undefined_error(obj);
    case Kind::dict:
      if (key.is_string()) {
        if (!obj.ns)
          if (const Value* v = obj.dict->find(key.s)) return *v;
        return get_attr(obj, key.s);
      }
      break;
    case Kind::list:
    case Kind::string:
      if (is_intlike(key)) {
        int64_t i = as_int(key);
        if (obj.is_list()) {
          const auto n = static_cast<int64_t>(obj.list->size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) return (*obj.list)[static_cast<size_t>(i)];
        } else {
          const std::u32string u = utf8_decode(obj.s);
          const auto n = static_cast<int64_t>(u.size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) return Value::string(utf8_encode(u.substr(static_cast<size_t>(i), 1)));
        }
        return Value::undef(fmt::format("{} object has no element {}", type_name(obj), as_int(key)));
      }
      if (key.is_string()) return get_attr(obj, key.s);
      break;
    default:
      break;
  }
  return Value::undef(fmt::format("{} object has no element {}", type_name(obj), repr(key)));
}

// ---- tests --------------------------------------------------------------------------------------

namespace {

// The value of attribute path "a.b" (Jinja's make_attrgetter), digits as indices.
Value attr_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    if (dot == std::string::npos) dot = path.size();
    const std::string part = path.substr(start, dot - start);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = get_item(cur, digits ? Value::integer(std::stoll(part)) : Value::string(part));
    start = dot + 1;
  }
  return cur;
}

const char* const kTests[] = {"defined", "undefined", "none", "boolean", "true", "false", "integer", "float",
                              "number", "string", "mapping", "iterable", "sequence", "callable", "sameas",
                              "escaped", "in", "eq", "equalto", "==", "ne", "!=", "lt", "lessthan", "<", "le",
                              "<=", "gt", "greaterthan", ">", "ge", ">=", "odd", "even", "divisibleby", "lower",
                              "upper", "filter", "test"};

}  // namespace

bool has_test(std::string_view name) {
  return std::find(std::begin(kTests), std::end(kTests), name) != std::end(kTests);
}

bool apply_test(Evaluator&, const std::string& name, const Value& v, CallArgs& a) {
  auto other = [&]() -> const Value& {
    const Value* o = a.get(0, "other");
    if (!o) throw Error(fmt::format("test '{}' needs an argument", name));
    return *o;
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.kind == Kind::boolean;
  if (name == "true") return v.kind == Kind::boolean && v.b;
  if (name == "false") return v.kind == Kind::boolean && !v.b;
  if (name == "integer") return v.kind == Kind::integer;
  if (name == "float") return v.kind == Kind::floating;
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict() && !v.ns;
  if (name == "iterable") return v.is_undefined() || v.is_string() || v.is_list() || (v.is_dict() && !v.ns);
  if (name == "sequence") return v.is_undefined() || v.is_string() || (v.is_list() && !v.generator) || (v.is_dict() && !v.ns);
  if (name == "callable") return v.kind == Kind::callable;
  if (name == "escaped") return false;
  if (name == "sameas") {
    const Value& o = other();
    if (v.kind != o.kind) return false;
    switch (v.kind) {
      case Kind::none: return true;
      case Kind::boolean: return v.b == o.b;
      case Kind::integer: return v.i == o.i && v.i >= -5 && v.i <= 256;  // CPython's small-int cache
      case Kind::list: return v.list == o.list;
      case Kind::dict: return v.dict == o.dict;
      case Kind::callable: return v.fn == o.fn;
      default: return false;
    }
  }
  if (name == "in") {
    const Value& c = other();
    if (c.is_string()) return v.is_string() && c.s.find(v.s) != std::string::npos;
    if (c.is_dict()) return v.is_string() && c.dict->find(v.s);
    for (const Value& x : iterate(c))
      if (equals(x, v)) return true;
    return false;
  }
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, other());
  if (name == "ne" || name == "!=") return !equals(v, other());
  if (name == "lt" || name == "lessthan" || name == "<") return less(v, other());
  if (name == "le" || name == "<=") return less(v, other()) || equals(v, other());
  if (name == "gt" || name == "greaterthan" || name == ">") return less(other(), v);
  if (name == "ge" || name == ">=") return less(other(), v) || equals(v, other());
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (!is_intlike(v)) throw Error(fmt::format("test '{}' needs an integer, not {}", name, type_name(v)));
    const int64_t d = name == "divisibleby" ? as_int(other()) : 2;
    if (d == 0) throw Error("integer division or modulo by zero");
    const int64_t r = ((as_int(v) % d) + d) % d;
    return name == "odd" ? r == 1 : r == 0;
  }
  if (name == "lower") return v.is_string() && py_lower(v.s) == v.s;
  if (name == "upper") return v.is_string() && py_upper(v.s) == v.s;
  if (name == "filter") return other().is_string() && has_filter(other().s);
  if (name == "test") return other().is_string() && has_test(other().s);
  throw Error(fmt::format("no test named '{}'", name));
}

// ---- filters ------------------------------------------------------------------------------------

namespace {

const char* const kFilters[] = {"abs", "attr", "capitalize", "count", "d", "default", "dictsort", "e", "escape",
                                "first", "float", "format", "indent", "int", "items", "join", "last", "length",
                                "list", "lower", "map", "max", "min", "reject", "rejectattr", "replace", "reverse",
                                "round", "safe", "select", "selectattr", "sort", "string", "sum", "title", "tojson",
                                "trim", "unique", "upper", "wordcount", "center"};

Value generator(List items) {
  Value v = Value::make_list(std::move(items));
  v.generator = true;
  return v;
}

Value keep_markup(const Value& in, Value out) {
  out.markup = in.markup;
  return out;
}

// Sort key for sort/dictsort/unique/min/max: strings lower-cased unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  return !case_sensitive && v.is_string() ? Value::string(py_lower(v.s)) : v;
}

// select/reject/selectattr/rejectattr: `a` holds (attr,) test name, test arguments.
Value select_common(Evaluator& ev, const Value& seq, CallArgs& a, bool by_attr, bool keep) {
  size_t k = 0;
  std::string attr;
  if (by_attr) {
    if (a.pos.empty()) throw Error("selectattr/rejectattr need an attribute");
    attr = to_str(a.pos[k++]);
  }
  std::string test;
  if (k < a.pos.size()) test = to_str(a.pos[k++]);
  CallArgs targs;
  targs.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(k), a.pos.end());
  List out;
  if (!truthy(seq)) return generator(std::move(out));
  for (const Value& item : iterate(seq)) {
    const Value x = by_attr ? attr_path(item, attr) : item;
    const bool hit = test.empty() ? truthy(x) : apply_test(ev, test, x, targs);
    if (hit == keep) out.push_back(item);
  }
  return generator(std::move(out));
}

std::string do_indent(const std::string& s_in, const Value* width, bool first, bool blank) {
  const std::string ind = width && width->is_string() ? width->s : std::string(static_cast<size_t>(width ? std::max<int64_t>(0, as_int(*width)) : 4), ' ');
  Value text = Value::string(s_in + "\n");
  CallArgs none;
  Evaluator* no_ev = nullptr;
  (void)no_ev;
  List lines;
  {
    // str.splitlines
    CallArgs a;
    struct NullEval final : Evaluator {
      Value call(const Value&, CallArgs&) override { return Value::none(); }
      int64_t now() const override { return 0; }
    } ev;
    lines = *string_method(text.s, "splitlines", ev, a).list;
  }
  std::string rv;
  if (blank) {
    for (size_t k = 0; k < lines.size(); ++k) {
      if (k > 0) rv += "\n" + ind;
      rv += lines[k].s;
    }
  } else {
    rv = lines.empty() ? "" : lines[0].s;
    if (lines.size() > 1) {
      rv += "\n";
      for (size_t k = 1; k < lines.size(); ++k) {
        if (k > 1) rv += "\n";
        rv += lines[k].s.empty() ? lines[k].s : ind + lines[k].s;
      }
    }
  }
  if (first) rv = ind + rv;
  return rv;
}

std::string ascii_escape_json(const std::string& s) {
  std::string out;
  for (char32_t c : utf8_decode(s)) {
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else if (c >= 0x10000) {
      const char32_t v = c - 0x10000;
      out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
    } else {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
    }
  }
  return out;
}

}  // namespace

bool has_filter(std::string_view name) {
  return std::find(std::begin(kFilters), std::end(kFilters), name) != std::end(kFilters);
}

Value apply_filter(Evaluator& ev, const std::string& name, Value v, CallArgs& a) {
  if (name == "default" || name == "d") {
    const Value* dflt = a.get(0, "default_value");
    if (v.is_undefined() || (arg_bool(a, 1, "boolean", false) && !truthy(v))) return dflt ? *dflt : Value::string("");
    return v;
  }
  if (name == "safe") {
    Value r = v.is_string() ? v : Value::string(to_str(v));
    r.markup = true;
    return r;
  }
  if (name == "string") return v.is_string() ? v : Value::string(to_str(v));
  if (name == "length" || name == "count") return Value::integer(length(v));
  if (name == "tojson") {
    // transformers: json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=False)
    const bool ensure_ascii = arg_bool(a, 0, "ensure_ascii", false);
    const Value* indent = a.get(1, "indent");
    const Value* seps = a.get(2, "separators");
    const bool sort_keys = arg_bool(a, 3, "sort_keys", false);
    int ind = -1;
    if (indent && !indent->is_none()) {
      if (!is_intlike(*indent)) throw Error("tojson: indent must be an integer");
      ind = static_cast<int>(std::max<int64_t>(0, as_int(*indent)));
    }
    std::string item_sep, key_sep;
    if (seps && !seps->is_none()) {
      if (!seps->is_list() || seps->list->size() != 2) throw Error("tojson: separators must be a pair");
      item_sep = to_str((*seps->list)[0]);
      key_sep = to_str((*seps->list)[1]);
    }
    std::string out = to_json(v, ind, item_sep, key_sep, sort_keys);
    return Value::string(ensure_ascii ? ascii_escape_json(out) : out);
  }
  if (name == "trim") {
    const Value* chars = a.get(0, "chars");
    const std::string* cs = chars && !chars->is_none() ? &chars->s : nullptr;
    return keep_markup(v, Value::string(py_strip(to_str(v), cs, true, true)));
  }
  if (name == "upper") return keep_markup(v, Value::string(py_upper(to_str(v))));
  if (name == "lower") return keep_markup(v, Value::string(py_lower(to_str(v))));
  if (name == "capitalize") return keep_markup(v, Value::string(py_capitalize(to_str(v))));
  if (name == "title") {
    // Jinja: words split on [-\s({\[<]+, each capitalized
    std::string s = to_str(v), out, word;
    auto flush = [&]() {
      if (!word.empty()) out += py_capitalize(word);
      word.clear();
    };
    for (char32_t c : utf8_decode(s)) {
      if (py_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<') {
        flush();
        utf8_append(out, c);
      } else {
        utf8_append(word, c);
      }
    }
    flush();
    return Value::string(out);
  }
  if (name == "replace") {
    const Value* count = a.get(2, "count");
    return Value::string(py_replace(to_str(v), to_str(a.pos.size() > 0 ? a.pos[0] : *a.get(0, "old")),
                                    to_str(*a.get(1, "new")), count && !count->is_none() ? as_int(*count) : -1));
  }
  if (name == "join") {
    const Value* sep = a.get(0, "d");
    const Value* attr = a.get(1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& x : iterate(v)) {
      if (!first && sep) out += to_str(*sep);
      first = false;
      out += to_str(attr ? attr_path(x, to_str(*attr)) : x);
    }
    return Value::string(out);
  }
  if (name == "first" || name == "last") {
    List items = iterate(v);
    if (items.empty()) return Value::undef(fmt::format("No {} item, sequence was empty.", name));
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value::make_list(iterate(v));
  if (name == "items") {
    if (v.is_undefined()) return generator({});
    if (!v.is_dict() || v.ns) throw Error("Can only get item pairs from a mapping.");
    return generator(*dict_items(v).list);
  }
  if (name == "reverse") {
    if (v.is_string()) {
      std::u32string u = utf8_decode(v.s);
      std::reverse(u.begin(), u.end());
      return Value::string(utf8_encode(u));
    }
    List items = iterate(v);
    std::reverse(items.begin(), items.end());
    return generator(std::move(items));
  }
  if (name == "int") {
    const Value* dflt = a.get(0, "default");
    const Value fallback = dflt ? *dflt : Value::integer(0);
    if (is_intlike(v)) return Value::integer(as_int(v));
    if (v.kind == Kind::floating) return std::isfinite(v.f) ? Value::integer(static_cast<int64_t>(v.f)) : fallback;
    if (v.is_string()) {
      const std::string s = py_strip(v.s, nullptr, true, true);
      try {
        size_t used = 0;
        const int64_t x = std::stoll(s, &used, 10);
        if (used == s.size()) return Value::integer(x);
        const double d = std::stod(s, &used);
        if (used == s.size() && std::isfinite(d)) return Value::integer(static_cast<int64_t>(d));
      } catch (const std::exception&) {
      }
    }
    return fallback;
  }
  if (name == "float") {
    const Value* dflt = a.get(0, "default");
    if (v.is_number()) return Value::floating(v.kind == Kind::floating ? v.f : static_cast<double>(as_int(v)));
    if (v.is_string()) {
      try {
        size_t used = 0;
        const std::string s = py_strip(v.s, nullptr, true, true);
        const double d = std::stod(s, &used);
        if (used == s.size()) return Value::floating(d);
      } catch (const std::exception&) {
      }
    }
    return dflt ? *dflt : Value::floating(0.0);
  }
  if (name == "abs") {
    if (is_intlike(v)) return Value::integer(std::llabs(as_int(v)));
    if (v.kind == Kind::floating) return Value::floating(std::fabs(v.f));
    throw Error(fmt::format("bad operand type for abs(): '{}'", type_name(v)));
  }
  if (name == "round") {
    const Value* prec = a.get(0, "precision");
    const Value* method = a.get(1, "method");
    const double p = std::pow(10.0, prec ? static_cast<double>(as_int(*prec)) : 0.0);
    const std::string m = method ? to_str(*method) : "common";
    if (!v.is_number()) throw Error("round: a number is required");
    if (m == "common" && v.kind != Kind::floating && (!prec || as_int(*prec) >= 0)) return Value::integer(as_int(v));
    const double x = (v.kind == Kind::floating ? v.f : static_cast<double>(as_int(v))) * p;
    const double r = m == "ceil" ? std::ceil(x) : m == "floor" ? std::floor(x) : std::round(x);
    return Value::floating(r / p);
  }
  if (name == "indent") {
    return Value::string(do_indent(to_str(v), a.get(0, "width"), arg_bool(a, 1, "first", false), arg_bool(a, 2, "blank", false)));
  }
  if (name == "e" || name == "escape") {
    if (v.markup) return v;
    Value r = Value::string(html_escape(to_str(v)));
    r.markup = true;
    return r;
  }
  if (name == "format") {
    Value args = Value::make_list(a.pos, true);
    if (!v.is_string()) throw Error("format: the value must be a string");
    // Python: value % args
    CallArgs fa;
    std::string out;
    // reuse the evaluator's % through a tiny local: positional tuple
    struct Pct {
      static std::string run(const std::string& f, const List& values) {
        std::string o;
        size_t next = 0;
        for (size_t i = 0; i < f.size(); ++i) {
          if (f[i] != '%') {
            o.push_back(f[i]);
            continue;
          }
          if (++i >= f.size()) throw Error("incomplete format");
          if (f[i] == '%') {
            o.push_back('%');
            continue;
          }
          if (next >= values.size()) throw Error("not enough arguments for format string");
          const Value& x = values[next++];
          if (f[i] == 's') o += to_str(x);
          else if (f[i] == 'r') o += repr(x);
          else if (f[i] == 'd' || f[i] == 'i') o += std::to_string(as_int(x));
          else throw Error(fmt::format("unsupported format character '{}'", f[i]));
        }
        return o;
      }
    };
    return Value::string(Pct::run(v.s, *args.list));
  }
  if (name == "wordcount") return Value::integer(static_cast<int64_t>(split_whitespace(to_str(v), -1, false).size()));
  if (name == "center") {
    const Value* w = a.get(0, "width");
    const int64_t width = w ? as_int(*w) : 80;
    std::string s = to_str(v);
    const auto len = static_cast<int64_t>(utf8_decode(s).size());
    if (len >= width) return Value::string(s);
    const int64_t total = width - len, left = total / 2 + (total & width & 1);
    return Value::string(std::string(static_cast<size_t>(left), ' ') + s + std::string(static_cast<size_t>(total - left), ' '));
  }
  if (name == "attr") return get_attr(v, to_str(*a.get(0, "name")));
  if (name == "map") {
    List out;
    if (!truthy(v)) return generator({});
    const Value* attribute = nullptr;
    for (const auto& [k, x] : a.kw)
      if (k == "attribute") attribute = &x;
    if (attribute) {
      const Value* dflt = nullptr;
      for (const auto& [k, x] : a.kw)
        if (k == "default") dflt = &x;
      for (const Value& item : iterate(v)) {
        Value r = attr_path(item, to_str(*attribute));
        out.push_back(r.is_undefined() && dflt ? *dflt : r);
      }
      return generator(std::move(out));
    }
    if (a.pos.empty()) return generator(iterate(v));
    const std::string filter = to_str(a.pos[0]);
    if (!has_filter(filter)) throw Error(fmt::format("no filter named '{}'", filter));
    CallArgs fa;
    fa.pos.assign(a.pos.begin() + 1, a.pos.end());
    fa.kw = a.kw;
    for (const Value& item : iterate(v)) {
      CallArgs copy = fa;
      out.push_back(apply_filter(ev, filter, item, copy));
    }
    return generator(std::move(out));
  }
  if (name == "select" || name == "reject") return select_common(ev, v, a, false, name == "select");
  if (name == "selectattr" || name == "rejectattr") return select_common(ev, v, a, true, name == "selectattr");
  if (name == "dictsort") {
    if (!v.is_dict() || v.ns) throw Error("dictsort: a mapping is required");
    const bool cs = arg_bool(a, 0, "case_sensitive", false);
    const Value* by = a.get(1, "by");
    const bool by_value = by && to_str(*by) == "value";
    const bool rev = arg_bool(a, 2, "reverse", false);
    List items = *dict_items(v).list;
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      const Value kx = sort_key((*x.list)[by_value ? 1 : 0], cs), ky = sort_key((*y.list)[by_value ? 1 : 0], cs);
      return rev ? less(ky, kx) : less(kx, ky);
    });
    return Value::make_list(std::move(items));
  }
  if (name == "sort") {
    const bool rev = arg_bool(a, 0, "reverse", false);
    const bool cs = arg_bool(a, 1, "case_sensitive", false);
    const Value* attr = a.get(2, "attribute");
    List items = iterate(v);
    auto key = [&](const Value& x) { return sort_key(attr ? attr_path(x, to_str(*attr)) : x, cs); };
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      return rev ? less(key(y), key(x)) : less(key(x), key(y));
    });
    return Value::make_list(std::move(items));
  }
  if (name == "unique") {
    const bool cs = arg_bool(a, 0, "case_sensitive", false);
    const Value* attr = a.get(1, "attribute");
    List out, seen;
    for (const Value& x : iterate(v)) {
      const Value k = sort_key(attr ? attr_path(x, to_str(*attr)) : x, cs);
      if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, k); })) {
        seen.push_back(k);
        out.push_back(x);
      }
    }
    return generator(std::move(out));
  }
  if (name == "min" || name == "max") {
    const bool cs = arg_bool(a, 0, "case_sensitive", false);
    const Value* attr = a.get(1, "attribute");
    List items = iterate(v);
    if (items.empty()) return Value::undef(fmt::format("No aggregated item, sequence was empty."));
    auto key = [&](const Value& x) { return sort_key(attr ? attr_path(x, to_str(*attr)) : x, cs); };
    size_t best = 0;
    for (size_t k = 1; k < items.size(); ++k)
      if (name == "min" ? less(key(items[k]), key(items[best])) : less(key(items[best]), key(items[k]))) best = k;
    return items[best];
  }
  if (name == "sum") {
    const Value* attr = a.get(0, "attribute");
    const Value* start = a.get(1, "start");
    Value total = start ? *start : Value::integer(0);
    for (const Value& x : iterate(v)) {
      const Value y = attr ? attr_path(x, to_str(*attr)) : x;
      if (!y.is_number() || !total.is_number()) throw Error("sum: numbers are required");
      if (is_intlike(total) && is_intlike(y))
        total = Value::integer(as_int(total) + as_int(y));
      else
        total = Value::floating((total.kind == Kind::floating ? total.f : static_cast<double>(as_int(total))) +
                                (y.kind == Kind::floating ? y.f : static_cast<double>(as_int(y))));
    }
    return total;
  }
  throw Error(fmt::format("no filter named '{}'", name));
}

// ---- global functions ---------------------------------------------------------------------------

Value global_function(const std::string& name) {
  if (name == "range")
    return native(name, [](Evaluator&, CallArgs& a) {
      if (a.pos.empty() || a.pos.size() > 3) throw Error("range expected 1 to 3 arguments");
      for (const Value& x : a.pos)
        if (!is_intlike(x)) throw Error(fmt::format("'{}' object cannot be interpreted as an integer", type_name(x)));
      int64_t start = 0, stop, step = 1;
      if (a.pos.size() == 1) {
        stop = as_int(a.pos[0]);
      } else {
        start = as_int(a.pos[0]);
        stop = as_int(a.pos[1]);
        if (a.pos.size() == 3) step = as_int(a.pos[2]);
      }
      if (step == 0) throw Error("range() arg 3 must not be zero");
      List out;
      for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
        if (out.size() >= 100000) throw Error("range too big, maximum size for range is 100000");  // the sandbox's MAX_RANGE
        out.push_back(Value::integer(k));
      }
      return Value::make_list(std::move(out));
    });
  if (name == "namespace" || name == "dict")
    return native(name, [name](Evaluator&, CallArgs& a) {
      Value d = Value::make_dict();
      d.ns = name == "namespace";
      for (const Value& p : a.pos) {
        if (!p.is_dict()) throw Error(fmt::format("{}() positional argument must be a mapping", name));
        for (const auto& [k, x] : p.dict->items) d.dict->set(k, x);
      }
      for (const auto& [k, x] : a.kw) d.dict->set(k, x);
      return d;
    });
  if (name == "raise_exception")
    return native(name, [](Evaluator&, CallArgs& a) -> Value {
      throw Error(a.pos.empty() ? std::string("raise_exception") : to_str(a.pos[0]));
    });
  if (name == "strftime_now")
    return native(name, [](Evaluator& ev, CallArgs& a) {
      const std::string f = arg_str(a, 0, "format", "strftime_now");
      const std::time_t t = static_cast<std::time_t>(ev.now());
      std::tm tm{};
      localtime_r(&t, &tm);
      char buf[512];
      const size_t n = std::strftime(buf, sizeof buf, f.c_str(), &tm);
      return Value::string(std::string(buf, n));
    });
  return Value::undef();
}

}  // namespace loom::jinja
