// The Jinja value type's Python-like behaviour: truth, str() and repr(), json.dumps, comparison,
// iteration, and the UTF-8 string helpers that give Python's code-point semantics.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include <fmt/format.h>
#include <utf8proc.h>

#include "jinja_internal.h"

namespace loom::jinja {

Value Value::make_list(List items, bool is_tuple) {
  Value v;
  v.kind = Kind::list;
  v.tuple = is_tuple;
  v.list = std::make_shared<List>(std::move(items));
  return v;
}

Value Value::make_dict() {
  Value v;
  v.kind = Kind::dict;
  v.dict = std::make_shared<Dict>();
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return none();
    case nlohmann::ordered_json::value_t::boolean:
      return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return integer(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return floating(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return make_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = make_dict();
      for (auto it = j.begin(); it != j.end(); ++it)
        d.dict->items.emplace_back(it.key(), from_json(it.value()));
      return d;
    }
    default:
      return undef();
  }
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& [k, old] : items)
    if (k == key) {
      old = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

const Value* CallArgs::get(size_t index, std::string_view name) const {
  if (index < pos.size()) return &pos[index];
  for (const auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}

// ---- UTF-8 --------------------------------------------------------------------------------------

std::u32string utf8_decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    utf8proc_int32_t cp = 0;
    const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                    static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
    if (n <= 0) {  // invalid byte: keep it as a code point of its own (surrogate-escape style)
      out.push_back(0xDC00 + static_cast<unsigned char>(s[i]));
      ++i;
    } else {
      out.push_back(static_cast<char32_t>(cp));
      i += static_cast<size_t>(n);
    }
  }
  return out;
}

void utf8_append(std::string& out, char32_t c) {
  if (c >= 0xDC80 && c <= 0xDCFF) {  // an invalid byte kept by utf8_decode
    out.push_back(static_cast<char>(c - 0xDC00));
    return;
  }
  utf8proc_uint8_t buf[4];
  const auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(c), buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

std::string utf8_encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) utf8_append(out, c);
  return out;
}

bool py_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
         c == 0x3000;
}

std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right) {
  const std::u32string u = utf8_decode(s);
  const std::u32string set = chars ? utf8_decode(*chars) : std::u32string();
  auto strip_it = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : py_isspace(c); };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip_it(u[b])) ++b;
  if (right)
    while (e > b && strip_it(u[e - 1])) --e;
  return utf8_encode(std::u32string_view(u).substr(b, e - b));
}

namespace {

std::string map_case(std::string_view s, bool upper) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : utf8_decode(s)) {
    if (c < 0x80) {
      char ch = static_cast<char>(c);
      if (upper && ch >= 'a' && ch <= 'z') ch = static_cast<char>(ch - 32);
      if (!upper && ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch + 32);
      out.push_back(ch);
    } else if (c >= 0xDC80 && c <= 0xDCFF) {
      utf8_append(out, c);
    } else {
      utf8_append(out, static_cast<char32_t>(upper ? utf8proc_toupper(static_cast<utf8proc_int32_t>(c))
                                                   : utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
    }
  }
  return out;
}

}  // namespace

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

std::string py_upper(std::string_view s) { return map_case(s, true); }
std::string py_lower(std::string_view s) { return map_case(s, false); }

// ---- str, repr, json ----------------------------------------------------------------------------

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::undefined:
    case Kind::none:
      return false;
    case Kind::boolean:
      return v.b;
    case Kind::integer:
      return v.i != 0;
    case Kind::floating:
      return v.f != 0.0;
    case Kind::string:
      return !v.s.empty();
    case Kind::list:
      return v.generator || !v.list->empty();
    case Kind::dict:
      return v.ns || !v.dict->items.empty();
    case Kind::callable:
      return true;
  }
  return false;
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: positional for exponents -4..15.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const size_t e_pos = sci.find('e');
  std::string mant = sci.substr(0, e_pos);
  const int exp = std::stoi(sci.substr(e_pos + 1));
  std::string sign;
  if (mant[0] == '-') {
    sign = "-";
    mant.erase(0, 1);
  }
  std::string digits;
  for (char c : mant)
    if (c != '.') digits.push_back(c);
  if (exp < -4 || exp >= 16) {
    std::string m = digits.substr(0, 1);
    if (digits.size() > 1) m += "." + digits.substr(1);
    return fmt::format("{}{}e{}{:02d}", sign, m, exp < 0 ? '-' : '+', std::abs(exp));
  }
  std::string out;
  if (exp < 0) {
    out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
    out = digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
  } else {
    out = digits.substr(0, static_cast<size_t>(exp) + 1) + "." + digits.substr(static_cast<size_t>(exp) + 1);
  }
  return sign + out;
}

namespace {

std::string repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : utf8_decode(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f || (c >= 0x80 && c <= 0xa0) || c == 0xad) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(c));
    } else if (c >= 0xDC80 && c <= 0xDCFF) {
      out += fmt::format("\\udc{:02x}", static_cast<unsigned>(c - 0xDC00));
    } else if (c == 0x2028 || c == 0x2029 || (c >= 0x200b && c <= 0x200f) || c == 0xfeff) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
    } else {
      utf8_append(out, c);
    }
  }
  out.push_back(quote);
  return out;
}

void json_string(std::string& out, const std::string& s) {
  out.push_back('"');
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (u < 0x20)
          out += fmt::format("\\u{:04x}", u);
        else
          out.push_back(c);
    }
  }
  out.push_back('"');
}

void json_dump(std::string& out, const Value& v, int indent, int level, const std::string& item_sep,
               const std::string& key_sep, bool sort_keys) {
  auto newline = [&](int lvl) {
    out.push_back('\n');
    out.append(static_cast<size_t>(indent * lvl), ' ');
  };
  switch (v.kind) {
    case Kind::none:
      out += "null";
      return;
    case Kind::boolean:
      out += v.b ? "true" : "false";
      return;
    case Kind::integer:
      out += std::to_string(v.i);
      return;
    case Kind::floating:
      if (std::isnan(v.f))
        out += "NaN";
      else if (std::isinf(v.f))
        out += v.f > 0 ? "Infinity" : "-Infinity";
      else
        out += float_repr(v.f);
      return;
    case Kind::string:
      json_string(out, v.s);
      return;
    case Kind::list: {
      if (v.generator) throw Error("Object of type generator is not JSON serializable");
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k > 0) out += item_sep;
        if (indent >= 0) newline(level + 1);
        json_dump(out, (*v.list)[k], indent, level + 1, item_sep, key_sep, sort_keys);
      }
      if (indent >= 0) newline(level);
      out.push_back(']');
      return;
    }
    case Kind::dict: {
      if (v.ns) throw Error("Object of type Namespace is not JSON serializable");
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out.push_back('{');
      for (size_t k = 0; k < items.size(); ++k) {
        if (k > 0) out += item_sep;
        if (indent >= 0) newline(level + 1);
        json_string(out, items[k]->first);
        out += key_sep;
        json_dump(out, items[k]->second, indent, level + 1, item_sep, key_sep, sort_keys);
      }
      if (indent >= 0) newline(level);
      out.push_back('}');
      return;
    }
    case Kind::undefined:
      throw Error("Object of type Undefined is not JSON serializable");
    case Kind::callable:
      throw Error("Object of type function is not JSON serializable");
  }
}

}  // namespace

std::string to_json(const Value& v, int indent, const std::string& item_sep, const std::string& key_sep,
                    bool sort_keys) {
  std::string out;
  json_dump(out, v, indent, 0, item_sep.empty() ? (indent >= 0 ? "," : ", ") : item_sep,
            key_sep.empty() ? ": " : key_sep, sort_keys);
  return out;
}

std::string repr(const Value& v) {
  switch (v.kind) {
    case Kind::string:
      return repr_string(v.s);
    case Kind::list: {
      std::string out(1, v.tuple ? '(' : '[');
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k > 0) out += ", ";
        out += repr((*v.list)[k]);
      }
      if (v.tuple && v.list->size() == 1) out += ",";
      out += v.tuple ? ')' : ']';
      return out;
    }
    case Kind::dict: {
      std::string out = v.ns ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, x] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(k) + ": " + repr(x);
      }
      return out + (v.ns ? "}>" : "}");
    }
    default:
      return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Kind::undefined:
      return "";
    case Kind::none:
      return "None";
    case Kind::boolean:
      return v.b ? "True" : "False";
    case Kind::integer:
      return std::to_string(v.i);
    case Kind::floating:
      return float_repr(v.f);
    case Kind::string:
      return v.s;
    case Kind::list:
      if (v.generator) return "<generator object>";
      return repr(v);
    case Kind::dict:
      return repr(v);
    case Kind::callable:
      return fmt::format("<function {}>", v.fn->name);
  }
  return "";
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Kind::undefined:
      return "Undefined";
    case Kind::none:
      return "NoneType";
    case Kind::boolean:
      return "bool";
    case Kind::integer:
      return "int";
    case Kind::floating:
      return "float";
    case Kind::string:
      return "str";
    case Kind::list:
      return v.tuple ? "tuple" : "list";
    case Kind::dict:
      return v.ns ? "Namespace" : "dict";
    case Kind::callable:
      return "function";
  }
  return "object";
}

// ---- comparison and iteration -------------------------------------------------------------------

namespace {
double as_double(const Value& v) {
  return v.kind == Kind::floating  ? v.f
         : v.kind == Kind::boolean ? (v.b ? 1.0 : 0.0)
                                   : static_cast<double>(v.i);
}
}  // namespace

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::floating || b.kind == Kind::floating) return as_double(a) == as_double(b);
    return as_int(a) == as_int(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::undefined:
    case Kind::none:
      return true;
    case Kind::string:
      return a.s == b.s;
    case Kind::list:
      if (a.tuple != b.tuple || a.generator || b.generator) return a.list == b.list;  // (1,) != [1]
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equals((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case Kind::dict:
      if (a.ns || b.ns) return a.dict == b.dict;
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->find(k);
        if (!o || !equals(v, *o)) return false;
      }
      return true;
    case Kind::callable:
      return a.fn == b.fn;
    default:
      return false;
  }
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::floating || b.kind == Kind::floating) return as_double(a) < as_double(b);
    return as_int(a) < as_int(b);
  }
  if (a.is_string() && b.is_string()) return a.s < b.s;  // UTF-8 byte order is code-point order
  if (a.is_list() && b.is_list() && a.tuple == b.tuple && !a.generator && !b.generator) {
    const size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      if (!equals((*a.list)[k], (*b.list)[k])) return less((*a.list)[k], (*b.list)[k]);
    }
    return a.list->size() < b.list->size();
  }
  throw Error(
      fmt::format("'<' not supported between instances of '{}' and '{}'", type_name(a), type_name(b)));
}

List iterate(const Value& v) {
  switch (v.kind) {
    case Kind::undefined:
      return {};
    case Kind::list:
      return *v.list;
    case Kind::dict: {
      if (v.ns) throw Error("'Namespace' object is not iterable");
      List keys;
      for (const auto& kv : v.dict->items) keys.push_back(Value::string(kv.first));
      return keys;
    }
    case Kind::string: {
      List chars;
      for (char32_t c : utf8_decode(v.s)) {
        std::string one;
        utf8_append(one, c);
        chars.push_back(Value::string(std::move(one)));
      }
      return chars;
    }
    default:
      throw Error(fmt::format("'{}' object is not iterable", type_name(v)));
  }
}

int64_t length(const Value& v) {
  switch (v.kind) {
    case Kind::undefined:
      return 0;
    case Kind::string:
      return static_cast<int64_t>(utf8_decode(v.s).size());
    case Kind::list:
      if (v.generator) throw Error("object of type 'generator' has no len()");
      return static_cast<int64_t>(v.list->size());
    case Kind::dict:
      if (!v.ns) return static_cast<int64_t>(v.dict->items.size());
      [[fallthrough]];
    default:
      throw Error(fmt::format("object of type '{}' has no len()", type_name(v)));
  }
}

}  // namespace loom::jinja
