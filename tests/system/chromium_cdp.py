"""Headless Chromium driven over the DevTools protocol through `--remote-debugging-pipe`
(fd 3 in, fd 4 out): no websocket library, no browser download, just Debian's `chromium`."""
from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


class Chromium:
    """Headless Chromium controlled over `--remote-debugging-pipe` (fd 3 in, fd 4 out)."""

    FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--autoplay-policy=no-user-gesture-required", "--remote-debugging-pipe",
             # a microphone that plays a test tone, granted without a prompt (the chat box records)
             "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream"]

    def __init__(self, executable: str = CHROMIUM):
        self.executable = executable
        self.profile = tempfile.mkdtemp(prefix="omni-chromium-")
        self.proc: subprocess.Popen | None = None
        self._next_id = 0
        self._buf = b""
        self.session: str | None = None
        self.console: list[str] = []

    def start(self) -> "Chromium":
        to_browser_r, to_browser_w = os.pipe()
        from_browser_r, from_browser_w = os.pipe()

        def wire_fds():  # runs in the child before exec: the protocol wants fds 3 and 4
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        self.proc = subprocess.Popen([self.executable, *self.FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                                     pass_fds=(3, 4), preexec_fn=wire_fds, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._out = os.fdopen(to_browser_w, "wb", buffering=0)
        self._in_fd = from_browser_r
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable", session=True)
        self.call("Runtime.enable", session=True)
        return self

    def call(self, method: str, session: bool = False, timeout_s: float = 30.0, **params) -> dict:
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        self._out.write(json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout_s
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("method") == "Runtime.consoleAPICalled":
                    args = reply["params"].get("args", [])
                    self.console.append(" ".join(str(a.get("value", a.get("description", ""))) for a in args))
                if reply.get("id") == self._next_id:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply.get("result", {})
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no reply to {method}")
            ready, _, _ = select.select([self._in_fd], [], [], left)
            if ready:
                chunk = os.read(self._in_fd, 1 << 16)
                if not chunk:
                    raise RuntimeError("chromium closed the protocol pipe")
                self._buf += chunk

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", session=True, expression=expression,
                           returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float, state: str = "JSON.stringify(window.omniSpeech)"):
        """The value of `expression` once it is truthy (polled every 50 ms); past `timeout_s` an
        AssertionError with the page's `state`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"page never satisfied {expression}; state: {self.evaluate(state)}")

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", session=True, url=url)

    def click(self, selector: str) -> None:
        """A real mouse click (a user gesture, so the page may start audio)."""
        box = self.evaluate(f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
                            f".getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; }})()")
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", session=True, type=kind, x=box[0], y=box[1],
                      button="left", clickCount=1)

    def screenshot(self, path: str | Path) -> None:
        data = self.call("Page.captureScreenshot", session=True, format="png")["data"]
        Path(path).write_bytes(base64.b64decode(data))

    def stop(self) -> None:
        if self.proc is not None:
            try:
                self.call("Browser.close", timeout_s=5)
            except Exception:  # noqa: BLE001 - it is going away either way
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
            self.proc = None
            self._out.close()
            os.close(self._in_fd)
        shutil.rmtree(self.profile, ignore_errors=True)
