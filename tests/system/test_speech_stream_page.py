"""The web page's live mode in a real headless Chromium: Start opens `WS /v1/audio/speech/stream`,
text typed into the box goes out as it is typed (append, the tiny Qwen3-TTS), audio plays before
Done, and Done ends the utterance with session.done."""
from __future__ import annotations

import json
import os
import time

import pytest

from client.speech_api.process import ShimProcess
from tests.system.chromium_cdp import CHROMIUM, Chromium
from tests.system.streaming_text_fixtures import QWEN

pytest_plugins = ["tests.system.streaming_text_fixtures"]
pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def page_shim(text_triton, tmp_path_factory):
    """The speech API with its default session limits, as the page's users get it (the shared
    text_shim's 3 s idle timeout, there for the idle test, would cut a slow browser's session
    before its first word)."""
    server = ShimProcess([text_triton.grpc_url], log_path=tmp_path_factory.mktemp("page_shim") / "shim.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


LIVE_STATE = "JSON.stringify(window.omniSpeech.live)"


def _click(browser: Chromium, selector: str) -> None:
    browser.evaluate(f"document.querySelector({json.dumps(selector)}).scrollIntoView({{block: 'center'}})")
    browser.click(selector)


def test_live_mode_speaks_while_typing(page_shim, tmp_path):
    assert os.path.exists(CHROMIUM), "the browser test needs Debian's chromium (apt-get install -y chromium)"
    browser = Chromium().start()
    try:
        browser.navigate(f"{page_shim.url}/")
        browser.wait_for("window.omniSpeech && window.omniSpeech.ready", 15, LIVE_STATE)
        browser.evaluate(f"(() => {{ const m = document.getElementById('model'); m.value = {json.dumps(QWEN)};"
                         " m.dispatchEvent(new Event('change')); })()")
        browser.wait_for("document.getElementById('voice').options.length > 1", 5, LIVE_STATE)
        browser.evaluate("document.getElementById('live').open = true")
        _click(browser, "#live-start")
        browser.wait_for("!document.getElementById('live-text').disabled", 10, LIVE_STATE)
        for word in "Hello there, I am typing this sentence while it is being spoken aloud. ".split(" "):
            browser.evaluate("(() => { const t = document.getElementById('live-text');"
                             f" t.value += {json.dumps(word + ' ')}; t.dispatchEvent(new Event('input')); }})()")
            time.sleep(0.15)
        browser.wait_for("window.omniSpeech.live.bytes > 0", 20, LIVE_STATE)      # audio before Done
        _click(browser, "#live-done")
        browser.wait_for("window.omniSpeech.live.phase === 'done'", 60, LIVE_STATE)
        browser.screenshot(tmp_path / "live.png")
        live = json.loads(browser.evaluate("JSON.stringify(window.omniSpeech.live)"))
    finally:
        browser.stop()
    assert not live["errors"], live["errors"]
    kinds = [m["type"] for m in live["messages"]]
    assert kinds[0] == "audio.start" and kinds[-1] == "session.done", kinds
    assert live["bytes"] > 0 and live["firstAudioMs"] is not None
