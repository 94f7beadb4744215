// The Jinja interpreter (loom/jinja.h) on small hand-written templates, one feature each. The
// expected outputs are Jinja2 3.1's, configured as transformers configures it (see
// tests/jinja_diff.py, which compares whole model templates against Jinja2 itself).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "loom/jinja.h"

namespace {

struct Case {
  const char* name;
  const char* source;
  const char* context;  // JSON object
  bool ok;              // false: Jinja2 raises, Loom must return an error
  const char* expected;
};

const Case kCases[] = {
    {"literals",
     "{{ 1 }}|{{ 1.5 }}|{{ 'a' }}|{{ \"b\" }}|{{ true }}|{{ True }}|{{ none }}|{{ None }}|{{ [1, 'x', none] "
     "}}|{{ {'k': 'v', 'n': 2} }}|{{ (1, 2) }}|{{ 1e3 }}|{{ 'a' 'b' }}",
     "{}", true, "1|1.5|a|b|True|True|None|None|[1, 'x', None]|{'k': 'v', 'n': 2}|(1, 2)|1000.0|ab"},  //
    {"arith",
     "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 + 2 * 3 }} {{ 'ab' "
     "* 2 }} {{ [1] + [2] }} {{ 0.1 + 0.2 }} {{ -3 }}",
     "{}", true, "3 -4 1 2 3.5 1024 7 abab [1, 2] 0.30000000000000004 -3"},           //
    {"concat", "{{ 'a' ~ 1 ~ none ~ x }}|{{ 'x' + 'y' }}", "{}", true, "a1None|xy"},  //
    {"compare",
     "{{ 1 < 2 < 3 }} {{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': "
     "1} }} {{ 3 not in [1] }} {{ not 1 }} {{ 1 and 'x' }} {{ 0 or 'y' }} {{ none or [] }}",
     "{}", true, "True True True True True True True False x y []"},  //
    {"cond-expr", "{{ 'yes' if flag else 'no' }}|{{ 'only' if not flag }}|", "{\"flag\": true}", true,
     "yes||"},  //
    {"subscript-slice",
     "{{ xs[0] }} {{ xs[-1] }} {{ xs[1:] }} {{ xs[:2] }} {{ xs[::-1] }} {{ xs[::2] }} {{ s[1:3] }} {{ "
     "s[::-1] }} {{ d.a }} {{ d['b'] }} {{ d.missing }}|{{ xs[10] }}|{{ xs.0 }}",
     "{\"xs\": [1, 2, 3, 4], \"s\": \"héllo\", \"d\": {\"a\": 1, \"b\": 2}}", true,
     "1 4 [2, 3, 4] [1, 2] [4, 3, 2, 1] [1, 3] él olléh 1 2 ||1"},  //
    {"tests",
     "{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ n is none }} {{ s is string }} {{ 1 is "
     "number }} {{ 1 is integer }} {{ 1.0 is float }} {{ d is mapping }} {{ xs is iterable }} {{ xs is "
     "sequence }} {{ true is boolean }} {{ s is not string }} {{ 4 is divisibleby 2 }} {{ 3 is odd }} {{ 2 "
     "is even }} {{ 'a' is lower }} {{ x is equalto 1 }} {{ x is eq 1 }} {{ false is false }} {{ n is sameas "
     "none }}",
     "{\"x\": 1, \"n\": null, \"s\": \"a\", \"d\": {}, \"xs\": [1]}", true,
     "True False True True True True True True True True True True False True True True True True True True "
     "True"},  //
    {"filters-str",
     "{{ '  a b  ' | trim }}|{{ 'xxaxx' | trim('x') }}|{{ 'ab' | upper }}|{{ 'AB' | lower }}|{{ 'hello "
     "world' | capitalize }}|{{ 'hello wORLD-x' | title }}|{{ 'aXbX' | replace('X', '-') }}|{{ 'aXbX' | "
     "replace('X', '-', 1) }}|{{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}|{{ 'a\n\nb' | "
     "indent(width=3, first=true, blank=true) }}|{{ '<&>' | e }}|{{ 5 | string }}",
     "{}", true,
     "a b|a|AB|ab|Hello world|Hello World-X|a-b-|a-bX|a\n  b\n\n  c|  a\n  b|   a\n   \n   "
     "b|&lt;&amp;&gt;|5"},  //
    {"filters-seq",
     "{{ xs | length }} {{ xs | count }} {{ 'héllo' | length }} {{ xs | first }} {{ xs | last }} {{ xs | "
     "join(', ') }} {{ xs | join }} {{ xs | reverse | list }} {{ xs | sort | list }} {{ [3, 1, 2] | "
     "sort(reverse=true) }} {{ [1, 2, 1, 3] | unique | list }} {{ xs | sum }} {{ xs | max }} {{ xs | min }} "
     "{{ 'ab' | list }} {{ d | list }} {{ [] | first }}|",
     "{\"xs\": [3, 1, 2], \"d\": {\"k\": 1, \"j\": 2}}", true,
     "3 3 5 3 2 3, 1, 2 312 [2, 1, 3] [1, 2, 3] [3, 2, 1] [1, 2, 3] 6 3 1 ['a', 'b'] ['k', 'j'] |"},  //
    {"filters-dict",
     "{% for k, v in d | items %}{{ k }}={{ v }};{% endfor %}|{% for k, v in d | dictsort %}{{ k }}={{ v "
     "}};{% endfor %}|{% for k, v in d.items() %}{{ k }}{% endfor %}|{{ d.keys() | list }}|{{ d.values() | "
     "list }}|{{ d.get('b') }}|{{ d.get('zz', 'dflt') }}|{{ d.get('zz') }}",
     "{\"d\": {\"b\": 2, \"a\": 1, \"C\": 3}}", true,
     "b=2;a=1;C=3;|a=1;b=2;C=3;|baC|['b', 'a', 'C']|[2, 1, 3]|2|dflt|None"},  //
    {"filters-attr",
     "{{ tools | selectattr('type', 'equalto', 'function') | map(attribute='name') | join(',') }}|{{ tools | "
     "rejectattr('type', 'equalto', 'function') | map(attribute='name') | list }}|{{ tools | "
     "selectattr('enabled') | list | length }}|{{ [1, 0, 2] | select | list }}|{{ [1, 2, 3] | reject('odd') "
     "| list }}|{{ ['a', 'b'] | map('upper') | join }}|{{ tools | map(attribute='name') | first }}",
     "{\"tools\": [{\"type\": \"function\", \"name\": \"f\", \"enabled\": true}, {\"type\": \"code\", "
     "\"name\": \"c\"}, {\"type\": \"function\", \"name\": \"g\"}]}",
     true, "f,g|['c']|1|[1, 2]|[2]|AB|f"},  //
    {"filters-num",
     "{{ '42' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ '1.5' | float }} {{ -3 | abs }} "
     "{{ 2.567 | round(2) }} {{ 2 | round }}",
     "{}", true, "42 0 7 3 1.5 3 2.57 2"},  //
    {"default",
     "{{ x | default('d') }}|{{ y | default('d') }}|{{ '' | default('d') }}|{{ '' | default('d', true) }}|{{ "
     "none | d('n') }}",
     "{\"y\": \"set\"}", true, "d|set||d|None"},  //
    {"tojson",
     "{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ 'é\"\n' | tojson }}|{{ [1, 2.5, none, true] | tojson "
     "}}|{{ {} | tojson }}|{{ [] | tojson(indent=2) }}",
     "{\"d\": {\"z\": 1, \"a\": [\"x\", {\"k\": null}], \"u\": \"東京\"}}", true,
     "{\"z\": 1, \"a\": [\"x\", {\"k\": null}], \"u\": \"東京\"}|{\n  \"z\": 1,\n  \"a\": [\n    \"x\",\n    "
     "{\n      \"k\": null\n    }\n  ],\n  \"u\": \"東京\"\n}|\"é\\\"\\n\"|[1, 2.5, null, true]|{}|[]"},  //
    {"for-loop",
     "{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ "
     "loop.length }}/{{ loop.first }}/{{ loop.last }}/{{ loop.previtem }}/{{ loop.nextitem }};{% endfor %}",
     "{\"xs\": [\"a\", \"b\", \"c\"]}", true,
     "1/0/3/2/3/True/False//b;2/1/2/1/3/False/False/a/c;3/2/1/0/3/False/True/b/;"},  //
    {"for-else-filter",
     "{% for x in xs if x > 1 %}{{ x }}{{ ',' if not loop.last }}{% else %}none{% endfor %}|{% for x in [] "
     "%}x{% else %}empty{% endfor %}",
     "{\"xs\": [1, 2, 3]}", true, "2,3|empty"},  //
    {"for-break-continue",
     "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 4 %}{% break %}{% endif %}{{ "
     "x }}{% endfor %}",
     "{}", true, "0134"},  //
    {"for-unpack-nested",
     "{% for a, b in [[1, 2], [3, 4]] %}{% for c in 'xy' %}{{ a }}{{ b }}{{ c }}{{ loop.index }} {% endfor "
     "%}{% endfor %}",
     "{}", true, "12x1 12y2 34x1 34y2 "},  //
    {"scoping",
     "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = x + 10 %}{{ x }},{% endfor %}{{ x }}|{% if true "
     "%}{% set y = 5 %}{% endif %}{{ y }}",
     "{}", true, "111,111,1|5"},  //
    {"namespace",
     "{% set ns = namespace(count=0, found=false) %}{% for i in [1, 2, 3] %}{% set ns.count = ns.count + i "
     "%}{% if i == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }}",
     "{}", true, "6 True"},  //
    {"set-block", "{% set body %}Hello {{ name }}!{% endset %}[{{ body }}] {% set a, b = 1, 2 %}{{ a + b }}",
     "{\"name\": \"W\"}", true, "[Hello W!] 3"},  //
    {"macro",
     "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', "
     "'?') }} {{ greet(name='C', punct='.') }}",
     "{}", true, "Hi A! Hi B? Hi C."},  //
    {"macro-call",
     "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}inner {{ 1 "
     "+ 1 }}{% endcall %}",
     "{}", true, "<b>inner 2</b>"},  //
    {"macro-recursion",
     "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * (fact(n - 1) | int) }}{% endif %}{% endmacro %}{{ "
     "fact(5) }}",
     "{}", true, "120"},  //
    {"whitespace",
     "a\n  {% if true %}\n    b\n  {% endif %}\nc {{- ' d ' -}} e\n{%- if true %} f{% endif -%}\n  g{# "
     "comment #}\n  {# line comment #}\nh",
     "{}", true, "a\n    b\nc d e fgh"},  //
    {"whitespace-lstrip", "<ul>\n    {% for x in xs %}\n    <li>{{ x }}</li>\n    {% endfor %}\n</ul>\n",
     "{\"xs\": [1, 2]}", true, "<ul>\n    <li>1</li>\n    <li>2</li>\n</ul>"},  //
    {"string-methods",
     "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xyx'.strip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ "
     "' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a.b.c'.rsplit('.', 1) }}|{{ 'abc'.startswith('ab') "
     "}}|{{ 'abc'.endswith(('x', 'c')) }}|{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}|{{ 'a-b'.replace('-', '+') "
     "}}|{{ 'hello'.find('l') }}|{{ 'hello'.count('l') }}|{{ '{} and {}'.format(1, 'two') }}|{{ ', "
     "'.join(['x', 'y']) }}|{{ 'hello world'.title() }}|{{ 'hello'.capitalize() }}",
     "{\"s\": \"  pad  \"}", true,
     "pad|pad  |  pad|y|['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']|['a.b', 'c']|True|True|ABab|a+b|2|2|1 "
     "and two|x, y|Hello World|Hello"},  //
    {"generation",
     "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration "
     "%}{% else %}{{ m.content }}{% endif %}\n{% endfor %}",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"assistant\", \"content\": "
     "\"a\"}]}",
     true, "ua"},  //
    {"strftime", "{{ strftime_now('%Y-%m-%d') }} {{ strftime_now('%d %B %Y') }}", "{}", true,
     "2026-01-04 04 January 2026"},  //
    {"safe-markup", "{{ '<b>' | safe + '<i>' }}|{{ '<b>' ~ '<i>' | safe }}", "{}", true,
     "<b>&lt;i&gt;|<b><i>"},  //
    {"raise", "{% if messages | length == 0 %}{{ raise_exception('need messages') }}{% endif %}ok",
     "{\"messages\": []}", false, ""},  // Jinja2: TemplateError: need messages
    {"undefined-attr", "{{ missing.attr }}", "{}", false,
     ""},  // Jinja2: UndefinedError: 'missing' is undefined
    {"unknown-filter", "{{ x | nosuchfilter }}", "{}", false,
     ""},  // Jinja2: TemplateAssertionError: No filter named 'nosuchfilter'.
    {"syntax-error", "{% if x %}unclosed", "{}", false,
     ""},  // Jinja2: TemplateSyntaxError: Unexpected end of template. Jinja was looking for the following
           // tags: 'elif' or 'else' or 'endif'. The innermost block that needs to be closed is 'if'.
    {"type-error", "{{ 'a' + 1 }}", "{}", false,
     ""},  // Jinja2: TypeError: can only concatenate str (not "int") to str
    {"percent-format", "{{ '%s is %d' % ('x', 3) }}|{{ '%s!' | format('hi') }}", "{}", true,
     "x is 3|hi!"},  //
    {"tojson-generator", "{{ xs | map('upper') | tojson }}", "{\"xs\": [\"a\"]}", false,
     ""},  // Jinja2: TypeError: Object of type generator is not JSON serializable
    {"immutable", "{% set xs = [1] %}{{ xs.append(2) }}", "{}", false,
     ""},  // Jinja2: SecurityError: access to attribute 'append' of 'list' object is unsafe.
};

constexpr int64_t kNow = 1767225600 + 3 * 86400 + 12 * 3600;  // 2026-01-04 12:00 UTC, as jinja_diff.py

TEST(Jinja, MatchesJinja2OnEachFeature) {
  setenv("TZ", "UTC", 1);
  loom::JinjaRenderOptions options;
  options.now = kNow;
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    auto ctx = nlohmann::ordered_json::parse(c.context);
    auto t = loom::JinjaTemplate::parse(c.source, c.name);
    if (!t) {
      EXPECT_FALSE(c.ok) << t.status().message();
      continue;
    }
    auto out = t->render(ctx, options);
    if (c.ok) {
      ASSERT_TRUE(out.ok()) << out.status().message();
      EXPECT_EQ(*out, c.expected);
    } else {
      EXPECT_FALSE(out.ok()) << "rendered: " << *out;
    }
  }
}

TEST(Jinja, ErrorsNameTheTemplateAndLine) {
  auto t = loom::JinjaTemplate::parse("line one\n{{ 'a' }}\n{{ raise_exception('bad turn') }}", "chat.jinja");
  ASSERT_TRUE(t.ok());
  auto out = t->render(nlohmann::ordered_json::object());
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(), "chat.jinja: line 3: bad turn");

  auto bad = loom::JinjaTemplate::parse("ok\n\n{% for x in %}", "broken.jinja");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), loom::StatusCode::format_error);
  EXPECT_NE(bad.status().message().find("broken.jinja: line 3:"), std::string::npos)
      << bad.status().message();
}

TEST(Jinja, UnknownFilterInsideIfFailsOnlyWhenReached) {
  // Jinja2 compiles unknown filters inside `if` (templates probe for them) and fails at run time.
  auto t = loom::JinjaTemplate::parse("{% if x %}{{ x | from_json }}{% endif %}ok", "t");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(*t->render({{"x", false}}), "ok");
  EXPECT_FALSE(t->render({{"x", true}}).ok());
  EXPECT_FALSE(loom::JinjaTemplate::parse("{{ x | from_json }}", "t").ok());
}

TEST(Jinja, GuardsOutputSizeAndRecursion) {
  auto loop = loom::JinjaTemplate::parse("{% for i in range(100000) %}{{ 'xxxxxxxxxx' }}{% endfor %}", "big");
  ASSERT_TRUE(loop.ok());
  loom::JinjaRenderOptions small;
  small.max_output_bytes = 1000;
  auto out = loop->render(nlohmann::ordered_json::object(), small);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("exceeds 1000 bytes"), std::string::npos);

  auto rec = loom::JinjaTemplate::parse("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "rec");
  ASSERT_TRUE(rec.ok());
  auto r = rec->render(nlohmann::ordered_json::object());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("nested deeper"), std::string::npos);

  std::string deep(5000, '(');
  EXPECT_FALSE(loom::JinjaTemplate::parse("{{ " + deep + "1" + std::string(5000, ')') + " }}", "deep").ok());
}

TEST(Jinja, ChatInputsAsTransformersPassesThem) {
  auto t = loom::JinjaTemplate::parse(
      "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ eos_token }}{% endfor %}"
      "{% if tools is not none %}T{{ tools | length }}{% endif %}{% if add_generation_prompt %}<assistant>{% "
      "endif %}",
      "chat");
  ASSERT_TRUE(t.ok());
  nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([{"role":"user","content":"hi"}])");
  nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([{"type":"function"}])");
  loom::JinjaChatInputs in;
  in.messages = &messages;
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  EXPECT_EQ(*loom::render_jinja_chat(*t, in), "<s><user>hi</s><assistant>");
  in.tools = &tools;
  in.add_generation_prompt = false;
  EXPECT_EQ(*loom::render_jinja_chat(*t, in), "<s><user>hi</s>T1");
}

}  // namespace
