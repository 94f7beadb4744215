// The Jinja lexer and parser: template text to a syntax tree (jinja_internal.h). Whitespace
// follows Jinja2 3.1 with trim_blocks and lstrip_blocks on and keep_trailing_newline off, as
// transformers configures it; operator precedence follows jinja2/parser.py.
#include <fmt/format.h>

#include "jinja_internal.h"

namespace loom::jinja {

namespace {

enum class Tok : uint8_t { data, var_begin, var_end, block_begin, block_end, name, string, integer, floating, op, eof };

struct Token {
  Tok type;
  std::string value;
  int line;
};

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
        int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
        if (d < 0) throw Error("truncated escape in a string", line);
        v = v * 16 + static_cast<uint32_t>(d);
      }
      i += n;
      return v;
    };
    switch (c) {
      case '\n': break;
      case '\\': out.push_back('\\'); break;
      case '\'': out.push_back('\''); break;
      case '"': out.push_back('"'); break;
      case 'a': out.push_back('\a'); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 't': out.push_back('\t'); break;
      case 'v': out.push_back('\v'); break;
      case 'x': utf8_append(out, hex(2)); break;
      case 'u': utf8_append(out, hex(4)); break;
      case 'U': utf8_append(out, hex(8)); break;
      default:
        if (c >= '0' && c <= '7') {
          uint32_t v = static_cast<uint32_t>(c - '0');
          for (int k = 0; k < 2 && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '7'; ++k) v = v * 8 + static_cast<uint32_t>(s[++i] - '0');
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
        throw Error(fmt::format("unexpected end of template, the tag opened on line {} is not closed", begin_line), line_);
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
        const bool after_dot = !tokens_.empty() && tokens_.back().type == Tok::op && tokens_.back().value == ".";
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
        static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "/", "*", "%", "~", "[",
                                           "]", "(", ")", "{", "}", "<", ">", "=", ".", ":", "|", ",", ";"};
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

ExprPtr make_expr(ExprKind k, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = k;
  e->line = line;
  return e;
}

// Nesting limit for statements and expressions: the parser and the evaluator recurse per level.
constexpr int kMaxNesting = 256;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Body parse_template() {
    std::string end;
    Body body = parse_body({}, end);
    if (cur().type != Tok::eof) throw Error("unexpected tag", cur().line);
    return body;
  }

 private:
  struct DepthGuard {
    DepthGuard(Parser& p) : parser(p) {
      if (++parser.depth_ > kMaxNesting)
        throw Error(fmt::format("statements or expressions nested deeper than {}", kMaxNesting), parser.cur().line);
    }
    ~DepthGuard() { --parser.depth_; }
    Parser& parser;
  };

  const Token& cur() const { return t_[p_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().type == Tok::op && cur().value == op; }
  bool is_name(const char* n) const { return cur().type == Tok::name && cur().value == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    ++p_;
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    ++p_;
    return true;
  }
  [[noreturn]] void fail(const std::string& what) const {
    std::string got;
    switch (cur().type) {
      case Tok::eof: got = "end of template"; break;
      case Tok::block_end: got = "end of statement block"; break;
      case Tok::var_end: got = "end of print statement"; break;
      case Tok::data: got = "template data"; break;
      default: got = fmt::format("'{}'", cur().value);
    }
    throw Error(fmt::format("{}, got {}", what, got), cur().line);
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(fmt::format("expected '{}'", op));
  }
  std::string expect_name() {
    if (cur().type != Tok::name) fail("expected a name");
    return t_[p_++].value;
  }
  void expect_block_end() {
    if (cur().type != Tok::block_end) fail("expected end of statement block");
    ++p_;
  }

  // Statements until a block tag whose name is in `ends` (left unconsumed after the `{%`); `end`
  // receives that name.
  Body parse_body(std::initializer_list<const char*> ends, std::string& end) {
    Body body;
    for (;;) {
      const Token& tk = cur();
      if (tk.type == Tok::eof) {
        if (ends.size() > 0)
          throw Error(fmt::format("unexpected end of template, expected '{}'", *ends.begin()), tk.line);
        return body;
      }
      if (tk.type == Tok::data) {
        auto s = std::make_unique<Stmt>(StmtKind::text, tk.line);
        s->text = tk.value;
        body.push_back(std::move(s));
        ++p_;
      } else if (tk.type == Tok::var_begin) {
        ++p_;
        auto s = std::make_unique<Stmt>(StmtKind::output, tk.line);
        s->expr = parse_tuple(true);
        if (cur().type != Tok::var_end) fail("expected end of print statement");
        ++p_;
        body.push_back(std::move(s));
      } else if (tk.type == Tok::block_begin) {
        const Token& nm = peek();
        if (nm.type != Tok::name) {
          ++p_;
          fail("expected a statement name");
        }
        for (const char* e : ends)
          if (nm.value == e) {
            end = e;
            p_ += 2;
            return body;
          }
        p_ += 2;
        body.push_back(parse_statement(nm.value, nm.line));
      } else {
        fail("unexpected token");
      }
    }
  }

  StmtPtr parse_statement(const std::string& name, int line) {
    DepthGuard guard(*this);
    std::string end;
    if (name == "if") {
      auto s = std::make_unique<Stmt>(StmtKind::if_, line);
      ExprPtr cond = parse_tuple(true);
      for (;;) {
        expect_block_end();
        Body b = parse_body({"elif", "else", "endif"}, end);
        s->branches.emplace_back(std::move(cond), std::move(b));
        if (end == "elif") {
          cond = parse_tuple(true);
          continue;
        }
        if (end == "else") {
          expect_block_end();
          s->else_body = parse_body({"endif"}, end);
        }
        expect_block_end();
        return s;
      }
    }
    if (name == "for") {
      auto s = std::make_unique<Stmt>(StmtKind::for_, line);
      s->targets = parse_targets();
      if (!skip_name("in")) fail("expected 'in'");
      s->expr = parse_tuple(false);
      if (skip_name("if")) s->loop_filter = parse_expression(true);
      if (is_name("recursive")) fail("recursive loops are not supported");
      expect_block_end();
      s->body = parse_body({"endfor", "else"}, end);
      if (end == "else") {
        expect_block_end();
        s->else_body = parse_body({"endfor"}, end);
      }
      expect_block_end();
      return s;
    }
    if (name == "set") {
      if (cur().type == Tok::name && peek().type == Tok::op && peek().value == ".") {
        auto s = std::make_unique<Stmt>(StmtKind::set_attr, line);
        s->targets.push_back(expect_name());
        ++p_;
        s->targets.push_back(expect_name());
        expect_op("=");
        s->expr = parse_tuple(true);
        expect_block_end();
        return s;
      }
      std::vector<std::string> targets = parse_targets();
      if (skip_op("=")) {
        auto s = std::make_unique<Stmt>(StmtKind::set, line);
        s->targets = std::move(targets);
        s->expr = parse_tuple(true);
        expect_block_end();
        return s;
      }
      auto s = std::make_unique<Stmt>(StmtKind::set_block, line);
      s->targets = std::move(targets);
      if (skip_op("|")) s->expr = parse_filter_chain(nullptr);
      expect_block_end();
      s->body = parse_body({"endset"}, end);
      expect_block_end();
      return s;
    }
    if (name == "macro") {
      auto m = std::make_unique<MacroStmt>(line);
      m->name = expect_name();
      parse_params(*m);
      expect_block_end();
      m->body = parse_body({"endmacro"}, end);
      expect_block_end();
      return m;
    }
    if (name == "call") {
      auto m = std::make_unique<MacroStmt>(line);
      m->kind = StmtKind::call_block;
      m->name = "caller";
      if (is_op("(")) parse_params(*m);
      m->expr = parse_expression(true);
      if (m->expr->kind != ExprKind::call) fail("expected a call");
      expect_block_end();
      m->body = parse_body({"endcall"}, end);
      expect_block_end();
      return m;
    }
    if (name == "filter") {
      auto s = std::make_unique<Stmt>(StmtKind::filter_block, line);
      s->expr = parse_filter_chain(nullptr);
      expect_block_end();
      s->body = parse_body({"endfilter"}, end);
      expect_block_end();
      return s;
    }
    if (name == "generation") {  // transformers' AssistantTracker: a plain wrapper when rendering
      auto s = std::make_unique<Stmt>(StmtKind::scope, line);
      expect_block_end();
      s->body = parse_body({"endgeneration"}, end);
      expect_block_end();
      return s;
    }
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) throw Error(fmt::format("'{}' outside of a loop", name), line);
      expect_block_end();
      return std::make_unique<Stmt>(name == "break" ? StmtKind::break_ : StmtKind::continue_, line);
    }
    throw Error(fmt::format("encountered unknown tag '{}'", name), line);
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    const bool paren = skip_op("(");
    do {
      if (paren && is_op(")")) break;
      names.push_back(expect_name());
    } while (skip_op(","));
    if (paren) expect_op(")");
    return names;
  }

  void parse_params(MacroStmt& m) {
    expect_op("(");
    while (!is_op(")")) {
      if (!m.params.empty()) expect_op(",");
      if (is_op(")")) break;
      m.params.push_back(expect_name());
      m.defaults.push_back(skip_op("=") ? parse_expression(true) : nullptr);
    }
    ++p_;
  }

  // ---- expressions ----
  ExprPtr parse_tuple(bool with_condexpr) {
    const int line = cur().line;
    std::vector<ExprPtr> items;
    bool comma = false;
    for (;;) {
      if (!items.empty()) {
        if (!skip_op(",")) break;
        comma = true;
      }
      if (cur().type == Tok::block_end || cur().type == Tok::var_end || is_op(")") ||
          (is_name("if") && !with_condexpr) || (is_op("=") && !items.empty()))
        break;
      items.push_back(parse_expression(with_condexpr));
    }
    if (!comma && items.size() == 1) return std::move(items[0]);
    if (items.empty() && !comma) fail("expected an expression");
    auto e = make_expr(ExprKind::tuple, line);
    e->kids = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    const int line = cur().line;
    ExprPtr e = parse_or();
    while (skip_name("if")) {
      auto c = make_expr(ExprKind::cond, line);
      ExprPtr test = parse_or();
      ExprPtr other = skip_name("else") ? parse_condexpr() : nullptr;
      c->kids.push_back(std::move(e));
      c->kids.push_back(std::move(test));
      c->kids.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(ExprKind k, ExprPtr a, ExprPtr b, int line, std::string op = {}) {
    auto e = make_expr(k, line);
    e->name = std::move(op);
    e->kids.push_back(std::move(a));
    e->kids.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const int line = cur().line;
      ++p_;
      e = binary(ExprKind::or_, std::move(e), parse_and(), line);
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const int line = cur().line;
      ++p_;
      e = binary(ExprKind::and_, std::move(e), parse_not(), line);
    }
    return e;
  }
  ExprPtr parse_not() {
    DepthGuard guard(*this);
    if (is_name("not")) {
      const int line = cur().line;
      ++p_;
      auto e = make_expr(ExprKind::not_, line);
      e->kids.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    for (;;) {
      std::string op;
      if (cur().type == Tok::op && (cur().value == "==" || cur().value == "!=" || cur().value == "<" ||
                                    cur().value == ">" || cur().value == "<=" || cur().value == ">=")) {
        op = cur().value;
        ++p_;
      } else if (is_name("in")) {
        op = "in";
        ++p_;
      } else if (is_name("not") && peek().type == Tok::name && peek().value == "in") {
        op = "notin";
        p_ += 2;
      } else {
        break;
      }
      if (!cmp) {
        cmp = make_expr(ExprKind::compare, line);
        cmp->kids.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->kids.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = cur().value;
      const int line = cur().line;
      ++p_;
      e = binary(ExprKind::binary, std::move(e), parse_concat(), line, op);
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const int line = cur().line;
      ++p_;
      e = binary(ExprKind::binary, std::move(e), parse_math2(), line, "~");
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = cur().value;
      const int line = cur().line;
      ++p_;
      e = binary(ExprKind::binary, std::move(e), parse_pow(), line, op);
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const int line = cur().line;
      ++p_;
      e = binary(ExprKind::binary, std::move(e), parse_unary(true), line, "**");
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    const int line = cur().line;
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = make_expr(is_op("-") ? ExprKind::neg : ExprKind::pos, line);
      ++p_;
      e->kids.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& tk = cur();
    const int line = tk.line;
    if (tk.type == Tok::name) {
      ++p_;
      auto e = make_expr(ExprKind::literal, line);
      if (tk.value == "true" || tk.value == "True") {
        e->literal = Value::boolean(true);
      } else if (tk.value == "false" || tk.value == "False") {
        e->literal = Value::boolean(false);
      } else if (tk.value == "none" || tk.value == "None") {
        e->literal = Value::none();
      } else {
        e->kind = ExprKind::name;
        e->name = tk.value;
      }
      return e;
    }
    if (tk.type == Tok::string) {
      std::string s;
      while (cur().type == Tok::string) s += t_[p_++].value;
      auto e = make_expr(ExprKind::literal, line);
      e->literal = Value::string(std::move(s));
      return e;
    }
    if (tk.type == Tok::integer || tk.type == Tok::floating) {
      ++p_;
      auto e = make_expr(ExprKind::literal, line);
      try {
        e->literal = tk.type == Tok::integer ? Value::integer(std::stoll(tk.value)) : Value::floating(std::stod(tk.value));
      } catch (const std::exception&) {
        throw Error(fmt::format("number out of range: {}", tk.value), line);
      }
      return e;
    }
    if (skip_op("(")) {
      if (skip_op(")")) {
        auto e = make_expr(ExprKind::tuple, line);
        return e;
      }
      ExprPtr e = parse_tuple(true);
      expect_op(")");
      return e;
    }
    if (skip_op("[")) {
      auto e = make_expr(ExprKind::list, line);
      while (!is_op("]")) {
        if (!e->kids.empty()) expect_op(",");
        if (is_op("]")) break;
        e->kids.push_back(parse_expression(true));
      }
      ++p_;
      return e;
    }
    if (skip_op("{")) {
      auto e = make_expr(ExprKind::dict, line);
      while (!is_op("}")) {
        if (!e->kids.empty()) expect_op(",");
        if (is_op("}")) break;
        e->kids.push_back(parse_expression(true));
        expect_op(":");
        e->kids.push_back(parse_expression(true));
      }
      ++p_;
      return e;
    }
    fail("unexpected token in an expression");
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      const int line = cur().line;
      if (is_op(".")) {
        ++p_;
        if (cur().type == Tok::name) {
          auto a = make_expr(ExprKind::getattr, line);
          a->name = t_[p_++].value;
          a->kids.push_back(std::move(e));
          e = std::move(a);
        } else if (cur().type == Tok::integer) {
          auto idx = make_expr(ExprKind::literal, line);
          idx->literal = Value::integer(std::stoll(t_[p_++].value));
          e = binary(ExprKind::getitem, std::move(e), std::move(idx), line);
        } else {
          fail("expected a name after '.'");
        }
      } else if (is_op("[")) {
        ++p_;
        e = parse_subscript(std::move(e), line);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj, int line) {
    std::vector<ExprPtr> parts(3);
    bool is_slice = false;
    int part = 0;
    while (!is_op("]")) {
      if (is_op(":")) {
        is_slice = true;
        if (++part > 2) fail("too many ':' in a slice");
        ++p_;
        continue;
      }
      if (parts[static_cast<size_t>(part)]) fail("expected ']'");
      parts[static_cast<size_t>(part)] = parse_expression(true);
      if (is_op(",")) fail("tuple subscripts are not supported");
    }
    ++p_;
    if (!is_slice) {
      if (!parts[0]) fail("expected a subscript");
      return binary(ExprKind::getitem, std::move(obj), std::move(parts[0]), line);
    }
    auto e = make_expr(ExprKind::slice, line);
    e->kids.push_back(std::move(obj));
    for (auto& x : parts) e->kids.push_back(std::move(x));
    return e;
  }

  void parse_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (cur().type == Tok::name && peek().type == Tok::op && peek().value == "=") {
        std::string key = t_[p_].value;
        p_ += 2;
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (is_op("*") || is_op("**")) fail("*args and **kwargs are not supported");
        if (!e.kwargs.empty()) fail("positional argument after a keyword argument");
        e.kids.push_back(parse_expression(true));
      }
    }
    ++p_;
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = make_expr(ExprKind::call, cur().line);
    e->kids.push_back(std::move(callee));
    parse_args(*e);
    return e;
  }

  // `name(args) | name ...` after a `|` (the first name is next); `input` null for filter blocks.
  ExprPtr parse_filter_chain(ExprPtr input) {
    ExprPtr e = std::move(input);
    do {
      const int line = cur().line;
      auto f = make_expr(ExprKind::filter, line);
      f->name = expect_name();
      while (is_op(".")) {
        ++p_;
        f->name += "." + expect_name();
      }
      f->known = has_filter(f->name);
      f->kids.push_back(std::move(e));
      if (is_op("(")) parse_args(*f);
      e = std::move(f);
    } while (skip_op("|"));
    return e;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    for (;;) {
      if (is_op("|")) {
        ++p_;
        const int line = cur().line;
        auto f = make_expr(ExprKind::filter, line);
        f->name = expect_name();
        while (is_op(".")) {
          ++p_;
          f->name += "." + expect_name();
        }
        f->known = has_filter(f->name);
        f->kids.push_back(std::move(e));
        if (is_op("(")) parse_args(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        const int line = cur().line;
        ++p_;
        auto t = make_expr(ExprKind::test, line);
        t->negated = skip_name("not");
        t->name = expect_name();
        while (is_op(".")) {
          ++p_;
          t->name += "." + expect_name();
        }
        t->known = has_test(t->name);
        t->kids.push_back(std::move(e));
        if (is_op("(")) {
          parse_args(*t);
        } else if ((cur().type == Tok::name || cur().type == Tok::string || cur().type == Tok::integer ||
                    cur().type == Tok::floating || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) fail("you cannot chain multiple tests with is");
          t->kids.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

 public:
  int loop_depth_ = 0;  // not tracked across macros; Jinja checks break/continue the same way

 private:
  std::vector<Token> t_;
  size_t p_ = 0;
  int depth_ = 0;
};

// Jinja2 rejects an unknown filter or test when compiling, unless it sits inside an `if` or a
// conditional expression ("soft" frames), where it fails only when evaluated.
void check_expr(const Expr* e, bool soft) {
  if (!e) return;
  if (e->kind == ExprKind::cond) soft = true;
  if ((e->kind == ExprKind::filter || e->kind == ExprKind::test) && !e->known && !soft)
    throw Error(fmt::format("no {} named '{}'", e->kind == ExprKind::filter ? "filter" : "test", e->name), e->line);
  for (const auto& k : e->kids) check_expr(k.get(), soft);
  for (const auto& [k, v] : e->kwargs) check_expr(v.get(), soft);
}

void check_body(const Body& body, bool soft) {
  for (const auto& s : body) {
    check_expr(s->expr.get(), soft);
    switch (s->kind) {
      case StmtKind::if_:
        for (const auto& [c, b] : s->branches) {
          check_expr(c.get(), true);
          check_body(b, true);
        }
        check_body(s->else_body, true);
        break;
      case StmtKind::for_:
        check_expr(s->loop_filter.get(), false);
        check_body(s->body, false);
        check_body(s->else_body, false);
        break;
      case StmtKind::macro:
      case StmtKind::call_block:
        for (const auto& d : static_cast<const MacroStmt&>(*s).defaults) check_expr(d.get(), false);
        check_body(s->body, false);
        break;
      case StmtKind::set_block:
      case StmtKind::filter_block:
        check_body(s->body, false);
        break;
      case StmtKind::scope:
        check_body(s->body, soft);
        break;
      default:
        break;
    }
  }
}

}  // namespace

std::unique_ptr<Program> parse_program(std::string_view source, std::string name) {
  auto program = std::make_unique<Program>();
  program->name = std::move(name);
  Parser parser(Lexer(source).run());
  parser.loop_depth_ = 1;  // break/continue outside loops are reported when reached
  program->body = parser.parse_template();
  check_body(program->body, false);
  return program;
}

}  // namespace loom::jinja
