// The Python methods templates call on strings, dicts and lists (as Jinja2's immutable sandbox
// allows them: mutating methods are unsafe and yield undefined), and attribute and item access
// with Jinja2's fallbacks.
#include <algorithm>

#include <fmt/format.h>

#include "jinja_internal.h"

namespace loom::jinja {

[[noreturn]] void undefined_error(const Value& v) {
  throw Error(v.s.empty() ? std::string("undefined value") : v.s);
}

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

static List split_sep(const std::string& s, const std::string& sep, int64_t maxsplit, bool from_right) {
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

static bool is_cased_letter(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  return py_upper(utf8_encode(std::u32string(1, c))) != py_lower(utf8_encode(std::u32string(1, c)));
}

std::string py_capitalize(const std::string& s) {
  std::u32string u = utf8_decode(s);
  if (u.empty()) return s;
  std::string first = py_upper(utf8_encode(u.substr(0, 1)));
  return first + py_lower(utf8_encode(u.substr(1)));
}

static std::string py_title(const std::string& s) {
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
static int64_t cp_index(const std::string& s, size_t byte) {
  return static_cast<int64_t>(utf8_decode(std::string_view(s).substr(0, byte)).size());
}

static std::string py_format(const std::string& f, const CallArgs& a) {
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
    if (!v->is_string())
      throw Error(fmt::format("{}() argument must be str or None, not {}", name, type_name(*v)));
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
      const bool hit = name == "startswith"
                           ? s.compare(0, o.s.size(), o.s) == 0 && s.size() >= o.s.size()
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
    return Value::string(py_replace(s, arg_str(a, 0, "old", "replace"), arg_str(a, 1, "new", "replace"),
                                    opt_int(2, "count", -1)));
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
      if (!v.is_string())
        throw Error(fmt::format("sequence item: expected str instance, {} found", type_name(v)));
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
      const bool brk = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || (c >= 0x1c && c <= 0x1e) ||
                       c == 0x85 || c == 0x2028 || c == 0x2029;
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
    if (name == "removeprefix")
      return Value::string(s.compare(0, x.size(), x) == 0 && s.size() >= x.size() ? s.substr(x.size()) : s);
    return Value::string(s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0
                             ? s.substr(0, s.size() - x.size())
                             : s);
  }
  auto all_of = [&](auto pred) {
    const std::u32string u = utf8_decode(s);
    return Value::boolean(!u.empty() && std::all_of(u.begin(), u.end(), pred));
  };
  if (name == "isdigit" || name == "isnumeric" || name == "isdecimal")
    return all_of([](char32_t c) { return c >= '0' && c <= '9'; });
  if (name == "isalpha") return all_of([](char32_t c) { return is_cased_letter(c); });
  if (name == "isalnum")
    return all_of([](char32_t c) { return is_cased_letter(c) || (c >= '0' && c <= '9'); });
  if (name == "isspace") return all_of([](char32_t c) { return py_isspace(c); });
  if (name == "isupper") return Value::boolean(py_upper(s) == s && py_lower(s) != s);
  if (name == "islower") return Value::boolean(py_lower(s) == s && py_upper(s) != s);
  throw Error(fmt::format("'str' object has no attribute '{}'", name));
}

static bool is_string_method(const std::string& n) {
  static const char* const kNames[] = {"strip",        "lstrip",       "rstrip",  "split",     "rsplit",
                                       "startswith",   "endswith",     "upper",   "lower",     "title",
                                       "capitalize",   "replace",      "find",    "rfind",     "index",
                                       "rindex",       "count",        "format",  "join",      "splitlines",
                                       "removeprefix", "removesuffix", "isdigit", "isnumeric", "isdecimal",
                                       "isalpha",      "isalnum",      "isspace", "isupper",   "islower"};
  return std::find(std::begin(kNames), std::end(kNames), n) != std::end(kNames);
}

Value dict_items(const Value& d) {
  List out;
  for (const auto& [k, v] : d.dict->items) out.push_back(Value::make_list({Value::string(k), v}, true));
  return Value::make_list(std::move(out));
}

static Value bound_method(const Value& obj, const std::string& name) {
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

static Value unsafe(const Value& obj, const std::string& name) {
  return Value::undef(
      fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, type_name(obj)));
}

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
      if (obj.tuple ? (name == "index" || name == "count") : (name == "index" || name == "count"))
        return bound_method(obj, name);
      if (name == "append" || name == "extend" || name == "insert" || name == "pop" || name == "remove" ||
          name == "reverse" || name == "sort" || name == "clear")
        return unsafe(obj, name);
      break;
    default:
      break;
  }
  return Value::undef(fmt::format("'{}' has no attribute '{}'",
                                  obj.is_none() ? "None" : std::string(type_name(obj)) + " object", name));
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

// The value of attribute path "a.b" (Jinja's make_attrgetter), digits as indices.
Value attr_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    if (dot == std::string::npos) dot = path.size();
    const std::string part = path.substr(start, dot - start);
    const bool digits =
        !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = get_item(cur, digits ? Value::integer(std::stoll(part)) : Value::string(part));
    start = dot + 1;
  }
  return cur;
}

}  // namespace loom::jinja
