// The Jinja parser: tokens (jinja_lexer.cpp) to a syntax tree (jinja_internal.h); operator
// precedence follows jinja2/parser.py.
#include <fmt/format.h>

#include "jinja_internal.h"

namespace loom::jinja {

namespace {

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
        throw Error(fmt::format("statements or expressions nested deeper than {}", kMaxNesting),
                    parser.cur().line);
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
      case Tok::eof:
        got = "end of template";
        break;
      case Tok::block_end:
        got = "end of statement block";
        break;
      case Tok::var_end:
        got = "end of print statement";
        break;
      case Tok::data:
        got = "template data";
        break;
      default:
        got = fmt::format("'{}'", cur().value);
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
        e->literal = tk.type == Tok::integer ? Value::integer(std::stoll(tk.value))
                                             : Value::floating(std::stod(tk.value));
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
      if (is_op(",") && part == 0 && !is_slice) {  // x[a, b]: a tuple key
        auto key = make_expr(ExprKind::tuple, line);
        key->kids.push_back(std::move(parts[0]));
        while (skip_op(",")) {
          if (is_op("]")) break;
          key->kids.push_back(parse_expression(true));
        }
        parts[0] = std::move(key);
        if (!is_op("]")) fail("expected ']'");
      }
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
        f->name += '.';
        f->name += expect_name();
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
          f->name += '.';
          f->name += expect_name();
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
          t->name += '.';
          t->name += expect_name();
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
    throw Error(fmt::format("no {} named '{}'", e->kind == ExprKind::filter ? "filter" : "test", e->name),
                e->line);
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
  Parser parser(lex(source));
  parser.loop_depth_ = 1;  // break/continue outside loops are reported when reached
  program->body = parser.parse_template();
  check_body(program->body, false);
  return program;
}

}  // namespace loom::jinja
