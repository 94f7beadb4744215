#!/usr/bin/env python3
"""The chat page (GET /) in headless Chromium, driven through WebDriver with the standard library.

usage: chat_page_webdriver.py PORT SCREENSHOT.png
Run by tests/serve_chat_page_chromium.sh, which starts `loom serve` on PORT. It starts chromedriver
(CHROMEDRIVER, default `chromedriver`; CHROMIUM names the browser when chromedriver can't find it),
opens the page in a 1000x700 viewport, sets temperature 0 and max tokens 40, types a message, sends it,
waits until the streamed answer stops growing and the page shows tokens/s, and checks the answer
against what /v1/chat/completions returns for the same request; then a second turn sent with Enter,
checked against the API with the whole conversation. It saves a screenshot at the end.
"""
import base64
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C WebDriver element reference key
MAX_TOKENS = 40


def http(method, url, body=None, timeout=60):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"{method} {url}: HTTP {e.code}: {e.read().decode(errors='replace')}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    def __init__(self, driver_port):
        self.base = f"http://127.0.0.1:{driver_port}"
        args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1000,700", "--hide-scrollbars"]
        options = {"args": args}
        if os.environ.get("CHROMIUM"):
            options["binary"] = os.environ["CHROMIUM"]
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome",
                                                 "goog:chromeOptions": options}}}
        self.session = http("POST", self.base + "/session", caps)["value"]["sessionId"]

    def cmd(self, method, path, body=None):
        return http(method, f"{self.base}/session/{self.session}{path}", body)["value"]

    def js(self, script, *args):
        return self.cmd("POST", "/execute/sync", {"script": script, "args": list(args)})

    def find(self, css):
        return self.cmd("POST", "/element", {"using": "css selector", "value": css})[ELEMENT]

    def type(self, css, text, clear=True):
        el = self.find(css)
        if clear:
            self.cmd("POST", f"/element/{el}/clear", {})
        self.cmd("POST", f"/element/{el}/value", {"text": text})

    def click(self, css):
        self.cmd("POST", f"/element/{self.find(css)}/click", {})

    def quit(self):
        try:
            http("DELETE", f"{self.base}/session/{self.session}", timeout=10)
        except Exception:
            pass


def wait_for(what, predicate, timeout=60, interval=0.1):
    end = time.time() + timeout
    while time.time() < end:
        v = predicate()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


# The page's state, read in one script: the last answer, the line under it, the buttons.
STATE = """
const answers = document.querySelectorAll('#log .msg.assistant, #log .msg.error');
const metas = document.querySelectorAll('#log .meta');
const stop = document.getElementById('stop'), send = document.getElementById('send');
return {answers: answers.length,
        answer: answers.length ? answers[answers.length - 1].textContent : null,
        answer_class: answers.length ? answers[answers.length - 1].className : null,
        meta: metas.length ? metas[metas.length - 1].textContent : null,
        send_disabled: send ? send.disabled : null,
        stop: stop ? {text: stop.textContent, disabled: stop.disabled,
                      visible: stop.offsetWidth > 0 && stop.offsetHeight > 0} : null};
"""


def turn(b, text, n_answers, use_enter):
    b.type("#input", text)
    if use_enter:
        b.type("#input", "\ue007", clear=False)  # WebDriver's Enter key: the page's keydown handler
    else:
        b.click("#send")
    wait_for("the answer element", lambda: b.js(STATE)["answers"] == n_answers)
    # Streamed: wait until the text stops growing and the request has finished (Send enabled again).
    last, stable_since = None, time.time()
    while True:
        s = b.js(STATE)
        if s["answer"] != last:
            last, stable_since = s["answer"], time.time()
        elif not s["send_disabled"] and time.time() - stable_since > 0.5:
            return s
        if time.time() - stable_since > 60:
            raise AssertionError(f"the answer stopped growing but the request did not finish: {s}")
        time.sleep(0.05)


def main():
    port, shot = int(sys.argv[1]), sys.argv[2]
    api = f"http://127.0.0.1:{port}"
    driver_port = free_port()
    driver = subprocess.Popen([os.environ.get("CHROMEDRIVER", "chromedriver"), f"--port={driver_port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    b = None
    try:
        wait_for("chromedriver", lambda: _ready(driver_port), timeout=20)
        b = Browser(driver_port)
        # --window-size counts the (invisible) browser frame: grow the window to a 1000x700 page.
        dw, dh = b.js("return [outerWidth - innerWidth, outerHeight - innerHeight]")
        b.cmd("POST", "/window/rect", {"width": 1000 + dw, "height": 700 + dh})
        b.cmd("POST", "/url", {"url": api + "/"})
        assert b.cmd("GET", "/title") == "Loom chat", "page title"
        model = http("GET", api + "/v1/models")["data"][0]["id"]
        wait_for("the model name in the header",
                 lambda: b.js("return document.getElementById('model').textContent") == model)
        b.type("#temp", "0")
        b.type("#max", str(MAX_TOKENS))

        s = b.js(STATE)
        assert s["stop"] is not None, "no #stop button"
        assert s["stop"]["visible"] and s["stop"]["text"] == "Stop", f"stop button: {s['stop']}"
        assert s["stop"]["disabled"], "stop is enabled before anything was sent"

        messages = []
        for i, (text, use_enter) in enumerate([("Good morrow, who art thou?", False),
                                               ("And whither goest thou?", True)]):
            s = turn(b, text, i + 1, use_enter)
            messages.append({"role": "user", "content": text})
            want = http("POST", api + "/v1/chat/completions",
                        {"messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0})
            want = want["choices"][0]["message"]["content"]
            messages.append({"role": "assistant", "content": want})
            got = s["answer"]
            assert s["answer_class"] == "msg assistant", f"turn {i + 1}: the page shows an error: {got!r}"
            assert got, f"turn {i + 1}: empty answer"
            assert got == want, f"turn {i + 1}: the page's answer differs from the API's\n page: {got!r}\n api:  {want!r}"
            m = re.fullmatch(r"(\d+) tokens, ([\d.]+) tokens/s, first token after ([\d.]+) s", s["meta"] or "")
            assert m, f"turn {i + 1}: no tokens/s line under the answer: {s['meta']!r}"
            assert int(m.group(1)) > 0 and float(m.group(2)) > 0, f"turn {i + 1}: {s['meta']!r}"
            assert s["stop"] and s["stop"]["disabled"], f"turn {i + 1}: stop still enabled after the answer"
            print(f"chat_page: turn {i + 1}: {len(got)} chars, {s['meta']}; equal to the API's answer")

        png = base64.b64decode(b.cmd("GET", "/screenshot"))
        with open(shot, "wb") as f:
            f.write(png)
        print(f"chat_page: screenshot {shot} ({len(png)} bytes)")
    finally:
        if b:
            b.quit()
        driver.terminate()
        try:
            driver.wait(10)
        except subprocess.TimeoutExpired:
            driver.kill()


def _ready(driver_port):
    try:
        return http("GET", f"http://127.0.0.1:{driver_port}/status", timeout=2)["value"]["ready"]
    except Exception:
        return False


if __name__ == "__main__":
    main()
