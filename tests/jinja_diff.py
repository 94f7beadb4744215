#!/usr/bin/env python3
"""Differential test of Loom's Jinja chat-template interpreter against Jinja2 (python3-jinja2),
configured as Hugging Face transformers renders chat templates (utils/chat_template_utils.py):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker,
loopcontrols]), its tojson (json.dumps with ensure_ascii=False, key order kept), raise_exception
and strftime_now, and render(messages=..., tools=... or None, documents=None,
add_generation_prompt=..., bos_token=..., eos_token=...).

Every template in the directory is rendered with the same conversations by both and compared byte
for byte; a template that fails in Jinja2 must fail in Loom too (the messages differ).

usage: jinja_diff.py LOOM_BINARY TEMPLATE_DIR [--verbose] [--only NAME]
"""
import json
import os
import subprocess
import sys
import tempfile
from datetime import datetime

try:
    import jinja2
    import jinja2.ext
    import jinja2.sandbox
    from jinja2 import nodes
except ImportError:
    print("jinja_diff: python3-jinja2 is missing; install it (scripts/deps.sh --tests)", file=sys.stderr)
    sys.exit(1)

NOW = 1767225600 + 3 * 86400 + 12 * 3600  # 2026-01-04 12:00 UTC: fixed for strftime_now on both sides


class AssistantTracker(jinja2.ext.Extension):
    """transformers' {% generation %} block; when not tracking assistant masks, a plain wrapper."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation_support(self, context, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.fromtimestamp(NOW).strftime(format)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "description": "How many days"},
            },
            "required": ["location"],
        },
    },
}, {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}]

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "Hello! What's 2 + 2?"}
A1 = {"role": "assistant", "content": "2 + 2 = 4."}
U2 = {"role": "user", "content": "And in French, \"s'il vous plaît\"?\nThanks."}
TOOL_TURNS = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temperature\": 21, \"sky\": \"clear\"}"},
    {"role": "assistant", "content": "It is 21 °C and clear in Paris."},
]
UNICODE = {"role": "user", "content": "  Grüße aus Köln — 東京 🌸 <tag> {{ not jinja }}  "}

THINKING = [
    {"role": "user", "content": "Think first: is 17 prime?"},
    {"role": "assistant", "content": "<think>\nCheck divisors up to 4.\n</think>\n\nYes, 17 is prime."},
    {"role": "user", "content": "And 21?"},
    {"role": "assistant", "reasoning_content": "21 = 3 * 7.", "content": "No: 21 = 3 × 7."},
]
MULTI_CALL = [
    {"role": "system", "content": "Use tools when useful."},
    {"role": "user", "content": "Weather in Oslo and news about it?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"location\": \"Oslo\", \"days\": 2}"}},
        {"id": "call_b", "type": "function", "function": {"name": "search", "arguments": {"query": "Oslo news"}}}]},
    {"role": "tool", "tool_call_id": "call_a", "name": "get_weather", "content": "-3 °C, snow"},
    {"role": "tool", "tool_call_id": "call_b", "name": "search", "content": "Nothing new."},
]
PARTS = [
    {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
    {"role": "user", "content": [{"type": "text", "text": "Describe this."}, {"type": "text", "text": "Please."}]},
]

CONVERSATIONS = [
    ("system+user", [SYSTEM, U1], None),
    ("multi-turn", [U1, A1, U2], None),
    ("system+multi-turn", [SYSTEM, U1, A1, U2], None),
    ("tools", [SYSTEM] + TOOL_TURNS + [U2], TOOLS),
    ("tools-no-system", TOOL_TURNS, TOOLS),
    ("unicode", [UNICODE], None),
    ("thinking", THINKING, None),
    ("multi-call", MULTI_CALL, TOOLS),
    ("content-parts", PARTS, None),
    ("assistant-last", [U1, A1], None),
    ("user-only", [U1], []),
]


def cases():
    out = []
    for name, messages, tools in CONVERSATIONS:
        for agp in (True, False):
            out.append({"name": f"{name} agp={agp}", "messages": messages, "tools": tools,
                        "add_generation_prompt": agp, "bos_token": "<s>", "eos_token": "</s>"})
    return out


def render_python(env, source, case):
    try:
        t = env.from_string(source)
        return t.render(messages=case["messages"], tools=case["tools"], documents=None,
                        add_generation_prompt=case["add_generation_prompt"],
                        bos_token=case["bos_token"], eos_token=case["eos_token"]), None
    except Exception as e:  # noqa: BLE001 - any failure is an outcome to compare
        return None, f"{type(e).__name__}: {e}"


def first_difference(a, b):
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return n, a[max(0, n - 40):n + 40], b[max(0, n - 40):n + 40]


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    verbose = "--verbose" in sys.argv
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    loom, tdir = args[0], args[1]
    env = make_env()
    all_cases = cases()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([{k: v for k, v in c.items() if k != "name"} for c in all_cases], f, ensure_ascii=False)
        cases_path = f.name
    names = sorted(n for n in os.listdir(tdir) if n.endswith(".jinja"))
    if only:
        names = [n for n in names if only in n]
    matched, failed = 0, []
    try:
        for name in names:
            path = os.path.join(tdir, name)
            with open(path, encoding="utf-8") as fh:
                source = fh.read()
            proc = subprocess.run([loom, "template", "--file", path, "--cases", cases_path, "--now", str(NOW)],
                                  capture_output=True)
            if proc.returncode != 0:
                failed.append((name, f"loom exited {proc.returncode}: {proc.stderr.decode(errors='replace')[:300]}"))
                continue
            results = json.loads(proc.stdout)
            problems = []
            both_errors = 0
            for case, got in zip(all_cases, results):
                want, err = render_python(env, source, case)
                if err is not None:
                    if "error" not in got:
                        problems.append(f"{case['name']}: Jinja2 fails ({err}) but Loom renders")
                    else:
                        both_errors += 1
                        if verbose:
                            print(f"  {name} {case['name']}: both fail: jinja2 {err!r} / loom {got['error']!r}")
                elif "error" in got:
                    problems.append(f"{case['name']}: Loom fails: {got['error']}")
                elif got["text"] != want:
                    n, w, g = first_difference(want, got["text"])
                    problems.append(f"{case['name']}: differs at {n}:\n    jinja2 {w!r}\n    loom   {g!r}")
            if problems:
                failed.append((name, "\n  ".join(problems)))
            else:
                matched += 1
                note = f" ({both_errors} of {len(all_cases)} cases fail in both)" if both_errors else ""
                print(f"ok    {name}{note}")
    finally:
        os.unlink(cases_path)
    for name, why in failed:
        print(f"FAIL  {name}\n  {why}")
    print(f"jinja_diff: {matched} of {len(names)} templates match Jinja2 byte for byte "
          f"({len(all_cases)} conversations each)")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
