#!/usr/bin/python3
"""Drives headless Chromium through the Chrome DevTools Protocol over --remote-debugging-pipe, with
only Python's standard library: no WebDriver, no websocket package, nothing to install beyond
Debian's chromium and python3.

    cdp_session.py CHROMIUM PROFILE_DIR URL STEPS.json RESULT.json

STEPS.json is a list of steps, run in order once the page has loaded:
    {"eval": "JS expression"}                 its value (awaited when a promise), by value
    {"wait": "JS expression", "timeout": s}   until it is truthy (default 10 s); fails past it
    {"click": "CSS selector", "fx": 0.5, "fy": 0.5}   a real mouse click at that fraction of the element
    {"hover": "CSS selector", "fx": 0.5, "fy": 0.5}   the mouse moved there
    {"screenshot": "file.png", "selector": "CSS selector" (optional: else the whole page),
     "max_height": pixels (optional)}
RESULT.json: {"results": [one per step], "exceptions": [...], "console": [...], "log": [...],
"requests": [every URL the page asked for]}. Exits 1 with a message on a failed step.
"""
import base64
import json
import os
import signal
import subprocess
import sys
import time


class Browser:
    def __init__(self, chromium, profile):
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def fds():  # the pipe's ends where Chromium looks for them: it reads 3, writes 4
            # Copies first: a pipe's end may already be 3 or 4, and dup2 onto itself would leave it
            # closed on exec.
            reads, writes = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(reads, 3)
            os.dup2(writes, 4)

        self.proc = subprocess.Popen(
            [chromium, "--headless", "--remote-debugging-pipe", "--disable-gpu", "--no-sandbox", "--no-first-run",
             "--hide-scrollbars", "--user-data-dir=" + profile, "--host-resolver-rules=MAP * ~NOTFOUND",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-default-apps", "--mute-audio", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=fds, close_fds=False)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next = 0
        self.events = []
        self.session = None

    def _read_message(self):
        while b"\0" not in self._buffer:
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise SystemExit("chromium closed the DevTools pipe (it exited: " + str(self.proc.poll()) + ")")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method, params=None, session=True):
        self._next += 1
        message = {"id": self._next, "method": method, "params": params or {}}
        if session and self.session:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read_message()
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise SystemExit(method + ": " + json.dumps(reply["error"]))
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def wait_event(self, method, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for i, e in enumerate(self.events):
                if e["method"] == method:
                    del self.events[i]
                    return e
            self.events.append(self._read_message())
        raise SystemExit("no " + method + " within " + str(timeout) + " s")

    def evaluate(self, expression):
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in r:
            raise SystemExit("JS error in " + expression + ": " + json.dumps(r["exceptionDetails"])[:2000])
        return r["result"].get("value")

    def close(self):
        try:
            self.call("Browser.close", session=False)
        except (SystemExit, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def centre(browser, selector, fx, fy):
    rect = browser.evaluate(
        "(() => { const e = document.querySelector(%s); if (!e) return null; e.scrollIntoView({block: 'center'});"
        " const r = e.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; })()" % json.dumps(selector))
    if rect is None:
        raise SystemExit("no element " + selector)
    return rect[0] + rect[2] * fx, rect[1] + rect[3] * fy


def main():
    chromium, profile, url, steps_file, result_file = sys.argv[1:6]
    signal.alarm(120)  # never hang a test run
    steps = json.load(open(steps_file))
    browser = Browser(chromium, profile)
    out = {"results": [], "exceptions": [], "console": [], "log": [], "requests": []}
    try:
        target = browser.call("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        browser.session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True},
                                       session=False)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            browser.call(domain + ".enable")
        browser.call("Emulation.setDeviceMetricsOverride",
                     {"width": 1360, "height": 1000, "deviceScaleFactor": 1, "mobile": False})
        browser.call("Page.navigate", {"url": url})
        browser.wait_event("Page.loadEventFired")
        for step in steps:
            if "eval" in step:
                out["results"].append(browser.evaluate(step["eval"]))
            elif "wait" in step:
                deadline = time.time() + step.get("timeout", 10)
                while not browser.evaluate(step["wait"]):
                    if time.time() > deadline:
                        raise SystemExit("timed out waiting for " + step["wait"])
                    time.sleep(0.1)
                out["results"].append(True)
            elif "click" in step or "hover" in step:
                x, y = centre(browser, step.get("click") or step.get("hover"), step.get("fx", 0.5), step.get("fy", 0.5))
                browser.call("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})
                if "click" in step:
                    for kind in ("mousePressed", "mouseReleased"):
                        browser.call("Input.dispatchMouseEvent",
                                     {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})
                out["results"].append([x, y])
            elif "screenshot" in step:
                if "selector" in step:
                    r = browser.evaluate(
                        "(() => { const e = document.querySelector(%s); window.scrollTo(0, 0);"
                        " const r = e.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; })()"
                        % json.dumps(step["selector"]))
                else:
                    r = browser.evaluate("[0, 0, document.documentElement.scrollWidth,"
                                         " document.documentElement.scrollHeight]")
                if "max_height" in step:
                    r[3] = min(r[3], step["max_height"])
                shot = browser.call("Page.captureScreenshot", {
                    "format": "png", "captureBeyondViewport": True,
                    "clip": {"x": r[0], "y": r[1], "width": r[2], "height": r[3], "scale": 1}})
                with open(step["screenshot"], "wb") as f:
                    f.write(base64.b64decode(shot["data"]))
                out["results"].append(step["screenshot"])
            else:
                raise SystemExit("unknown step " + json.dumps(step))
        # Whatever else arrived: console messages, uncaught exceptions, blocked loads, requests.
        browser.evaluate("0")
    finally:
        for e in browser.events:
            p = e.get("params", {})
            if e["method"] == "Runtime.exceptionThrown":
                out["exceptions"].append(json.dumps(p.get("exceptionDetails", {}))[:2000])
            elif e["method"] == "Runtime.consoleAPICalled":
                out["console"].append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif e["method"] == "Log.entryAdded":
                out["log"].append(p["entry"].get("text", ""))
            elif e["method"] == "Network.requestWillBeSent":
                out["requests"].append(p["request"]["url"])
        browser.close()
        with open(result_file, "w") as f:
            json.dump(out, f)


main()
