// The Jinja lexer: template text to tokens, with Jinja2 3.1's whitespace rules for trim_blocks
// and lstrip_blocks on and keep_trailing_newline off, as transformers configures it.
#include <fmt/format.h>

#include "jinja_internal.h"

namespace loom::jinja {

namespace {

bool is_ascii_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_ascii_digit(c); }

// Length in bytes of the whitespace (str.isspace) that ends `s`.
size_t trailing_space(std::string_view s) {
  const std::u32string u = utf8_decode(s);
  size_t n = u.size(), bytes = 0;
  while (n > 0 && py_isspace(u[n - 1])) {
    std::string one;
    utf8_append(one, u[n - 1]);
    bytes += one.size();
    --n;
  }
  return bytes;
}

// Length in bytes of the whitespace that starts `s`.
size_t leading_space(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (!py_isspace(c)) break;
      ++i;
      continue;
    }
    size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (i + n > s.size()) break;
    const std::u32string u = utf8_decode(s.substr(i, n));
    if (u.size() != 1 || !py_isspace(u[0])) break;
    i += n;
  }
  return i;
}

// Python's unicode-escape decoding of a string literal's body, as Jinja's lexer does it.
std::string unescape(std::string_view s, int line) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 >= s.size()) {
      out.push_back(s[i]);
      continue;
    }
    const char c = s[++i];
    auto hex = [&](size_t n) {
      uint32_t v = 0;
      for (size_t k = 1; k <= n; ++k) {
        const char h = i + k < s.size() ? s[i + k] : 'x';
        int d = h >= '0' && h <= '9'   ? h - '0'
                : h >= 'a' && h <= 'f' ? h - 'a' + 10
                : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                       : -1;
        if (d < 0) throw Error("truncated escape in a string", line);
        v = v * 16 + static_cast<uint32_t>(d);
      }
      i += n;
      return v;
    };
    switch (c) {
      case '\n':
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'x':
        utf8_append(out, hex(2));
        break;
      case 'u':
        utf8_append(out, hex(4));
        break;
      case 'U':
        utf8_append(out, hex(8));
        break;
      default:
        if (c >= '0' && c <= '7') {
          uint32_t v = static_cast<uint32_t>(c - '0');
          for (int k = 0; k < 2 && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '7'; ++k)
            v = v * 8 + static_cast<uint32_t>(s[++i] - '0');
          utf8_append(out, v);
        } else {
          out.push_back('\\');
          out.push_back(c);
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view src) {
    // Newlines normalized to \n and one trailing newline dropped (keep_trailing_newline=False).
    src_.reserve(src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i] == '\r') {
        src_.push_back('\n');
        if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
      } else {
        src_.push_back(src[i]);
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t start = pos_;
      char kind = 0;
      for (;;) {
        start = src_.find('{', start);
        if (start == std::string::npos || start + 1 >= src_.size()) break;
        const char k = src_[start + 1];
        if (k == '{' || k == '%' || k == '#') {
          kind = k;
          break;
        }
        ++start;
      }
      if (!kind) {
        emit_data(src_.substr(pos_));
        pos_ = src_.size();
        break;
      }
      std::string text = src_.substr(pos_, start - pos_);
      const char sign = start + 2 < src_.size() ? src_[start + 2] : 0;
      if (sign == '-') {
        text.resize(text.size() - trailing_space(text));
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: only whitespace between the line start and a block or comment tag.
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
            leading_space(std::string_view(text).substr(l_pos)) == text.size() - l_pos)
          text.resize(l_pos);
      }
      emit_data(text);
      advance_to(start);
      const size_t tag_len = 2 + (sign == '-' || sign == '+' ? 1 : 0);
      if (kind == '#') {
        advance_to(pos_ + tag_len);
        size_t end = src_.find("#}", pos_);
        if (end == std::string::npos) throw Error("missing end of comment tag", line_);
        const bool strip = end > pos_ && src_[end - 1] == '-';
        advance_to(end + 2);
        line_starting = finish_tag(strip, true);
        continue;
      }
      tokens_.push_back({kind == '{' ? Tok::var_begin : Tok::block_begin, "", line_});
      advance_to(pos_ + tag_len);
      line_starting = lex_tag(kind == '{');
    }
    tokens_.push_back({Tok::eof, "", line_});
    return std::move(tokens_);
  }

 private:
  void emit_data(std::string text) {
    if (!text.empty()) tokens_.push_back({Tok::data, std::move(text), line_});
  }

  void advance_to(size_t p) {
    for (size_t k = pos_; k < p && k < src_.size(); ++k)
      if (src_[k] == '\n') ++line_;
    pos_ = p;
  }

  // After a tag's end: `-` strips all whitespace, trim_blocks one newline after a block or
  // comment. Returns whether what the tag end consumed ends with a newline.
  bool finish_tag(bool strip, bool trim_newline) {
    if (strip) {
      const size_t n = leading_space(std::string_view(src_).substr(pos_));
      const bool nl = n > 0 && src_[pos_ + n - 1] == '\n';
      advance_to(pos_ + n);
      return nl;
    }
    if (trim_newline && pos_ < src_.size() && src_[pos_] == '\n') {
      advance_to(pos_ + 1);
      return true;
    }
    return false;
  }

  bool lex_tag(bool variable) {
    int depth = 0;
    const int begin_line = line_;
    for (;;) {
      while (pos_ < src_.size()) {
        const size_t n = leading_space(std::string_view(src_).substr(pos_, 4));
        if (n == 0) break;
        advance_to(pos_ + n);
      }
      if (pos_ >= src_.size())
        throw Error(
            fmt::format("unexpected end of template, the tag opened on line {} is not closed", begin_line),
            line_);
      std::string_view rest = std::string_view(src_).substr(pos_);
      if (depth == 0) {
        const std::string_view end = variable ? "}}" : "%}";
        const bool minus = rest.size() >= 3 && rest[0] == '-' && rest.substr(1, 2) == end;
        const bool plus = !variable && rest.size() >= 3 && rest[0] == '+' && rest.substr(1, 2) == end;
        if (minus || plus || rest.substr(0, 2) == end) {
          tokens_.push_back({variable ? Tok::var_end : Tok::block_end, "", line_});
          advance_to(pos_ + (minus || plus ? 3 : 2));
          return finish_tag(minus, !variable && !plus);
        }
      }
      const char c = rest[0];
      if (is_name_start(c)) {
        size_t n = 1;
        while (n < rest.size() && is_name_char(rest[n])) ++n;
        tokens_.push_back({Tok::name, std::string(rest.substr(0, n)), line_});
        advance_to(pos_ + n);
      } else if (is_ascii_digit(c)) {
        size_t n = 0;
        while (n < rest.size() && (is_ascii_digit(rest[n]) || rest[n] == '_')) ++n;
        bool is_float = false;
        const bool after_dot =
            !tokens_.empty() && tokens_.back().type == Tok::op && tokens_.back().value == ".";
        if (!after_dot && n + 1 < rest.size() && rest[n] == '.' && is_ascii_digit(rest[n + 1])) {
          is_float = true;
          ++n;
          while (n < rest.size() && (is_ascii_digit(rest[n]) || rest[n] == '_')) ++n;
        }
        if (!after_dot && n < rest.size() && (rest[n] == 'e' || rest[n] == 'E')) {
          size_t m = n + 1;
          if (m < rest.size() && (rest[m] == '+' || rest[m] == '-')) ++m;
          if (m < rest.size() && is_ascii_digit(rest[m])) {
            is_float = true;
            n = m;
            while (n < rest.size() && is_ascii_digit(rest[n])) ++n;
          }
        }
        std::string num;
        for (char ch : rest.substr(0, n))
          if (ch != '_') num.push_back(ch);
        tokens_.push_back({is_float ? Tok::floating : Tok::integer, num, line_});
        advance_to(pos_ + n);
      } else if (c == '\'' || c == '"') {
        size_t n = 1;
        while (n < rest.size() && rest[n] != c) n += rest[n] == '\\' ? 2 : 1;
        if (n >= rest.size()) throw Error("unterminated string", line_);
        tokens_.push_back({Tok::string, unescape(rest.substr(1, n - 1), line_), line_});
        advance_to(pos_ + n + 1);
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "/",
                                           "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                           "<",  ">",  "=",  ".",  ":",  "|",  ",", ";"};
        std::string op;
        for (const char* o : kOps)
          if (rest.substr(0, std::string_view(o).size()) == o) {
            op = o;
            break;
          }
        if (op.empty()) throw Error(fmt::format("unexpected char '{}'", c), line_);
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") {
          if (depth == 0) throw Error(fmt::format("unexpected '{}'", op), line_);
          --depth;
        }
        tokens_.push_back({Tok::op, op, line_});
        advance_to(pos_ + op.size());
      }
    }
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> lex(std::string_view source) { return Lexer(source).run(); }

}  // namespace loom::jinja
