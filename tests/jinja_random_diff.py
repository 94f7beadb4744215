#!/usr/bin/env python3
"""Random differential test of Loom's Jinja interpreter against Jinja2: small templates built from
random expressions (literals, filters, tests, operators, methods, slices, conditionals) and
statements (if/elif/else, for/else with loop variables, set, namespace attributes), rendered by
both (Jinja2 configured as transformers configures it, see jinja_diff.py); outputs must be equal
byte for byte, and a template that fails in Jinja2 must fail in Loom.

usage: jinja_random_diff.py LOOM_BINARY [SEED] [COUNT]
"""
import json
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jinja_diff  # noqa: E402  (exits with a message when python3-jinja2 is missing)

atoms = ["1", "2", "0", "-3", "2.5", "'a'", "'Hello World'", "' x y '", "''", "none", "true", "false", "[1, 2, 3]", "['b', 'a', 'B']", "[]",
         "{'k': 1, 'a': 'z'}", "{}", "m", "m.role", "m.content", "m['role']", "messages|length", "xs", "d", "s", "missing", "(1, 'a')", "ns.v"]
filters = ["length", "upper", "lower", "trim", "string", "list", "first", "last", "reverse|list", "sort|list", "unique|list", "tojson", "tojson(indent=2)",
           "default('D')", "d('x', true)", "join(',')", "join", "int", "float", "abs", "capitalize", "title", "items|list", "dictsort", "length > 1", "replace('a', 'o')",
           "indent(2)", "select|list", "map('string')|list", "wordcount", "round", "e", "safe", "count", "sum", "min", "max", "first|string"]
tests = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "iterable", "sequence", "boolean", "true", "false", "odd", "even", "lower", "upper", "in [1, 'a']", "eq 1", "sameas none", "callable"]
binops = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", ">", "<=", ">=", "in", "not in", "and", "or", "**"]
methods = ["strip()", "upper()", "lower()", "split()", "split('a')", "startswith('H')", "endswith('d')", "replace('l', 'L')", "title()", "find('o')", "count('l')", "get('k')", "items()|list", "keys()|list", "values()|list", "rstrip('d')", "lstrip(' ')", "capitalize()", "format(1)"]
SEQS = ['xs', 's', "'abcdef'", '[1,2,3,4]']
def expr(d=0):
    r = random.random()
    if d > 2 or r < 0.3: return random.choice(atoms)
    if r < 0.45: return f"{expr(d+1)} | {random.choice(filters)}"
    if r < 0.55: return f"({expr(d+1)} is {random.choice(['', 'not '])}{random.choice(tests)})"
    if r < 0.75: return f"({expr(d+1)} {random.choice(binops)} {expr(d+1)})"
    if r < 0.82: return f"({expr(d+1)} if {expr(d+1)} else {expr(d+1)})"
    if r < 0.9: return f"{random.choice(atoms)}.{random.choice(methods)}"
    if r < 0.95: return random.choice(SEQS) + "[" + random.choice(['0', '-1', '1:', ':2', '::-1', '::2', '5', '1:-1']) + "]"
    return f"not {expr(d+1)}"
def stmt():
    r = random.random()
    if r < 0.5: return "{{ " + expr() + " }}"
    if r < 0.65: return "{% if " + expr() + " %}T{% elif " + expr() + " %}E{% else %}F{% endif %}"
    if r < 0.8: return "{% for x in " + expr() + " %}[{{ loop.index }}{{ x }}{{ loop.last }}]{% else %}none{% endfor %}"
    if r < 0.9: return "{%- set t = " + expr() + " -%} {{ t }}\n  "
    return "{% set ns.v = " + expr() + " %}{{ ns.v }}"
pre = "{% set ns = namespace(v=1) %}{% set xs = [3, 1, 2] %}{% set d = {'b': 2, 'a': 1} %}{% set s = 'Hello World' %}{% set m = messages[0] %}"
case = {"messages": [{"role": "user", "content": "Hi there"}], "tools": None, "add_generation_prompt": True, "bos_token": "<s>", "eos_token": "</s>"}
env = jinja_diff.make_env()


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    loom = sys.argv[1]
    random.seed(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 300
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        case_path = os.path.join(tmp, "case.json")
        with open(case_path, "w") as f:
            json.dump([case], f)
        for i in range(n):
            bad += check_one(loom, tmp, case_path, pre + "\n".join(stmt() for _ in range(3)))
    print(f"jinja_random_diff: {n - bad} of {n} random templates match Jinja2")
    return 1 if bad else 0


def check_one(loom, tmp, case_path, src):
    path = os.path.join(tmp, "t.jinja")
    with open(path, "w") as f:
        f.write(src)
    want, err = jinja_diff.render_python(env, src, case)
    p = subprocess.run([loom, "template", "-f", path, "--cases", case_path, "--now", "0"], capture_output=True)
    got = json.loads(p.stdout)[0]
    bad = 0
    if err:
        if "error" not in got:
            bad = 1
            print("Loom renders, Jinja2 fails:", src[len(pre):], "|", err, "|", repr(got["text"])[:200])
    elif "error" in got:
        bad = 1
        print("Loom fails:", src[len(pre):], "|", got["error"], "| want", repr(want)[:200])
    elif got["text"] != want:
        bad = 1
        print("differs:", src[len(pre):], "\n  want", repr(want)[:300], "\n  got ", repr(got["text"])[:300])
    return bad


if __name__ == "__main__":
    sys.exit(main())
