// Jinja built-ins: filters and tests (Jinja2 3.1 semantics, `tojson` as transformers overrides
// it) and the global functions (range, namespace, dict, raise_exception, strftime_now).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include <fmt/format.h>

#include "jinja_internal.h"

namespace loom::jinja {

// ---- tests --------------------------------------------------------------------------------------

namespace {

const char* const kTests[] = {"defined",  "undefined", "none",   "boolean", "true",        "false",
                              "integer",  "float",     "number", "string",  "mapping",     "iterable",
                              "sequence", "callable",  "sameas", "escaped", "in",          "eq",
                              "equalto",  "==",        "ne",     "!=",      "lt",          "lessthan",
                              "<",        "le",        "<=",     "gt",      "greaterthan", ">",
                              "ge",       ">=",        "odd",    "even",    "divisibleby", "lower",
                              "upper",    "filter",    "test"};

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
  if (name == "sequence")
    return v.is_undefined() || v.is_string() || (v.is_list() && !v.generator) || (v.is_dict() && !v.ns);
  if (name == "callable") return v.kind == Kind::callable || v.is_undefined();  // Undefined has __call__
  if (name == "escaped") return false;
  if (name == "sameas") {
    const Value& o = other();
    if (v.kind != o.kind) return false;
    switch (v.kind) {
      case Kind::none:
        return true;
      case Kind::boolean:
        return v.b == o.b;
      case Kind::integer:
        return v.i == o.i && v.i >= -5 && v.i <= 256;  // CPython's small-int cache
      case Kind::list:
        return v.list == o.list;
      case Kind::dict:
        return v.dict == o.dict;
      case Kind::callable:
        return v.fn == o.fn;
      default:
        return false;
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
    // value % 2 == 1, value % 2 == 0, value % num == 0 with Python's modulo
    const Value divisor = name == "divisibleby" ? other() : Value::integer(2);
    if (!v.is_number() || !divisor.is_number())
      throw Error(
          fmt::format("unsupported operand type(s) for %: '{}' and '{}'", type_name(v), type_name(divisor)));
    const bool floats = v.kind == Kind::floating || divisor.kind == Kind::floating;
    const double d = divisor.kind == Kind::floating ? divisor.f : static_cast<double>(as_int(divisor));
    if (d == 0) throw Error("integer division or modulo by zero");
    double r;
    if (floats) {
      const double x = v.kind == Kind::floating ? v.f : static_cast<double>(as_int(v));
      r = std::fmod(x, d);
      if (r != 0 && ((r < 0) != (d < 0))) r += d;
    } else {
      const int64_t di = as_int(divisor);
      r = di == -1 ? 0.0 : static_cast<double>(((as_int(v) % di) + di) % di);
    }
    return name == "odd" ? r == 1 : r == 0;
  }
  if (name == "lower" || name == "upper") {
    // str(value).islower() / .isupper(): at least one cased character, all of them in that case
    const std::string s = to_str(v);
    const std::string other = name == "lower" ? py_upper(s) : py_lower(s);
    return s != other && s == (name == "lower" ? py_lower(s) : py_upper(s));
  }
  if (name == "filter") return other().is_string() && has_filter(other().s);
  if (name == "test") return other().is_string() && has_test(other().s);
  throw Error(fmt::format("no test named '{}'", name));
}

// ---- filters ------------------------------------------------------------------------------------

namespace {

const char* const kFilters[] = {
    "abs",   "attr",   "capitalize", "count",      "d",     "default", "dictsort",   "e",       "escape",
    "first", "float",  "format",     "indent",     "int",   "items",   "join",       "last",    "length",
    "list",  "lower",  "map",        "max",        "min",   "reject",  "rejectattr", "replace", "reverse",
    "round", "safe",   "select",     "selectattr", "sort",  "string",  "sum",        "title",   "tojson",
    "trim",  "unique", "upper",      "wordcount",  "center"};

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
  const std::string ind =
      width && width->is_string()
          ? width->s
          : std::string(static_cast<size_t>(width ? std::max<int64_t>(0, as_int(*width)) : 4), ' ');
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
    if (v.is_undefined() || (arg_bool(a, 1, "boolean", false) && !truthy(v)))
      return dflt ? *dflt : Value::string("");
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
                                    to_str(*a.get(1, "new")),
                                    count && !count->is_none() ? as_int(*count) : -1));
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
  // Undefined has no __int__, __float__, __abs__, __round__: Jinja2 raises UndefinedError.
  if (v.is_undefined() && (name == "int" || name == "float" || name == "abs" || name == "round"))
    undefined_error(v);
  if (name == "int") {
    const Value* dflt = a.get(0, "default");
    const Value fallback = dflt ? *dflt : Value::integer(0);
    if (is_intlike(v)) return Value::integer(as_int(v));
    if (v.kind == Kind::floating)
      return std::isfinite(v.f) ? Value::integer(static_cast<int64_t>(v.f)) : fallback;
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
    if (v.is_number())
      return Value::floating(v.kind == Kind::floating ? v.f : static_cast<double>(as_int(v)));
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
    if (m == "common" && v.kind != Kind::floating && (!prec || as_int(*prec) >= 0))
      return Value::integer(as_int(v));
    const double value = v.kind == Kind::floating ? v.f : static_cast<double>(as_int(v));
    const int64_t digits = prec ? as_int(*prec) : 0;
    if (m == "common" && digits >= 0 && digits < 30 && std::isfinite(value)) {
      // Python's round(): correctly rounded from the exact binary value, ties to even, as
      // printf's %.Nf rounds.
      char buf[400];
      std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(digits), value);
      return Value::floating(std::strtod(buf, nullptr));
    }
    const double x = value * p;
    const double r = m == "ceil" ? std::ceil(x) : m == "floor" ? std::floor(x) : std::nearbyint(x);
    return Value::floating(r / p);
  }
  if (name == "indent") {
    if (!v.is_string())  // do_indent does `s += "\n"`
      throw Error(fmt::format("unsupported operand type(s) for +=: '{}' and 'str'", type_name(v)));
    return Value::string(do_indent(to_str(v), a.get(0, "width"), arg_bool(a, 1, "first", false),
                                   arg_bool(a, 2, "blank", false)));
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
          if (f[i] == 's')
            o += to_str(x);
          else if (f[i] == 'r')
            o += repr(x);
          else if (f[i] == 'd' || f[i] == 'i')
            o += std::to_string(as_int(x));
          else
            throw Error(fmt::format("unsupported format character '{}'", f[i]));
        }
        return o;
      }
    };
    return Value::string(Pct::run(v.s, *args.list));
  }
  if (name == "wordcount") {  // len(re.findall(r"\w+", s))
    int64_t n = 0;
    bool in_word = false;
    for (char32_t c : utf8_decode(to_str(v))) {
      const bool word = c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
                        (c >= 'A' && c <= 'Z') ||
                        (c >= 0x80 && !py_isspace(c) && c != 0x85 && !(c >= 0x2000 && c <= 0x206f));
      if (word && !in_word) ++n;
      in_word = word;
    }
    return Value::integer(n);
  }
  if (name == "center") {
    const Value* w = a.get(0, "width");
    const int64_t width = w ? as_int(*w) : 80;
    std::string s = to_str(v);
    const auto len = static_cast<int64_t>(utf8_decode(s).size());
    if (len >= width) return Value::string(s);
    const int64_t total = width - len, left = total / 2 + (total & width & 1);
    return Value::string(std::string(static_cast<size_t>(left), ' ') + s +
                         std::string(static_cast<size_t>(total - left), ' '));
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
  if (name == "selectattr" || name == "rejectattr")
    return select_common(ev, v, a, true, name == "selectattr");
  if (name == "dictsort") {
    if (!v.is_dict() || v.ns) throw Error("dictsort: a mapping is required");
    const bool cs = arg_bool(a, 0, "case_sensitive", false);
    const Value* by = a.get(1, "by");
    const bool by_value = by && to_str(*by) == "value";
    const bool rev = arg_bool(a, 2, "reverse", false);
    List items = *dict_items(v).list;
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      const Value kx = sort_key((*x.list)[by_value ? 1 : 0], cs),
                  ky = sort_key((*y.list)[by_value ? 1 : 0], cs);
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
      if (name == "min" ? less(key(items[k]), key(items[best])) : less(key(items[best]), key(items[k])))
        best = k;
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
        total =
            Value::floating((total.kind == Kind::floating ? total.f : static_cast<double>(as_int(total))) +
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
        if (!is_intlike(x))
          throw Error(fmt::format("'{}' object cannot be interpreted as an integer", type_name(x)));
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
        if (out.size() >= 100000)
          throw Error("range too big, maximum size for range is 100000");  // the sandbox's MAX_RANGE
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
