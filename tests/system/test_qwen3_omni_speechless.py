"""A Qwen3-Omni checkpoint that does not speak (config.json `enable_audio_output: false`, no talker
or code2wav weights, as the released Thinking and Captioner checkpoints) served by a real
tritonserver and the speech API: it answers in text, equal to the reference's answer of the same
thinker, for conversations, recordings and images; audio is refused naming the field.

The checkpoint is the parity checkpoint with its talker and code2wav removed (and its
`talker_config` too), so the reference's answers of the full checkpoint are this one's.
"""
from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml

from client.triton_stream import TritonStreamError
from ensemble_builder.build import build
from tests.oracle.qwen3_omni_reference import job_messages
from tests.system.speech_api_fixtures import served_stack
from tests.system.test_qwen3_omni_pipeline import MEDIA_JOBS, Served, _audio_job_request, _job_request

pytestmark = pytest.mark.system
ROOT = Path(__file__).resolve().parents[2]
MODEL = "qwen3_omni"
AUDIO_ONLY = ("speaker", "talker_do_sample", "talker_max_new_tokens", "talker_repetition_penalty")


def _speechless_copy(checkpoint: Path, out: Path) -> Path:
    from safetensors.torch import load_file, save_file

    shutil.copytree(checkpoint, out)
    config = json.loads((out / "config.json").read_text())
    config["enable_audio_output"] = False
    config.pop("talker_config")
    (out / "config.json").write_text(json.dumps(config))
    weights = load_file(str(out / "model.safetensors"))
    save_file({k: v for k, v in weights.items() if not k.startswith(("talker.", "code2wav."))},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def speechless(qwen3_omni_reference, tmp_path_factory):
    base = tmp_path_factory.mktemp("omni_speechless")
    model = _speechless_copy(Path(qwen3_omni_reference["tiny"]["checkpoint"]), base / "thinking")
    deploy = yaml.safe_load((ROOT / "deploy" / "qwen3_omni_tiny_random.yaml").read_text())
    deploy.update(pipeline=MODEL, model=str(model))
    deploy["stages"][0]["default_sampling_params"]["max_new_tokens"] = 512
    (base / "deploy.yaml").write_text(yaml.safe_dump(deploy))
    build(MODEL, base / "model_repository", base / "deploy.yaml")
    with served_stack(base / "model_repository", base) as (server, shim):
        yield server, shim


def test_only_the_entry_and_the_thinker_are_served(speechless):
    """No talker or code2wav model, so no stub process for them: the server's models and its
    stubs are the entry's and the thinker's alone, and the pipeline is ready (its pings and
    readiness ask the thinker alone)."""
    from omni_backend.stubs import server_stubs

    server, shim = speechless
    index = httpx.post(f"{server.http_url}/v2/repository/index", timeout=10).json()
    assert sorted((m["name"], m.get("state")) for m in index) == [(MODEL, "READY"), (f"{MODEL}__thinker", "READY")]
    assert server.server_pid is not None
    assert {s.model for s in server_stubs.stubs_of(server.server_pid)} == {MODEL, f"{MODEL}__thinker"}
    assert httpx.get(f"{shim.url}/health", timeout=10).status_code == 200


def _text_only(request: tuple[str, dict]) -> tuple[str, dict]:
    text, params = request
    return text, {k: v for k, v in params.items() if k not in AUDIO_ONLY and k != "return_audio"}


def _reference_text(ref: dict, tokenizer) -> str:
    return tokenizer.decode(ref["sequences"].tolist()[len(ref["input_ids"]):])


@pytest.fixture(scope="module")
def tokenizer(qwen3_omni_reference):
    from omni_backend.models.qwen3_common.tokenizer import QwenTextTokenizer

    return QwenTextTokenizer(str(qwen3_omni_reference["tiny"]["checkpoint"]))


def test_answers_in_text_equal_to_the_reference(speechless, qwen3_omni_reference, qwen3_omni_audio_reference,
                                                tokenizer):
    """Every parity conversation and every recording and image question, all at once: the
    reference's answer text, no audio."""
    server, _ = speechless
    jobs = {job_id: _text_only(_job_request(ref["job"])) for job_id, ref in qwen3_omni_reference["tiny"]["jobs"].items()}
    jobs |= {job["id"]: _text_only(_audio_job_request(job)) for job in MEDIA_JOBS}
    refs = qwen3_omni_reference["tiny"]["jobs"] | qwen3_omni_audio_reference["tiny"]["jobs"]
    with ThreadPoolExecutor(4) as pool:
        served = dict(zip(jobs, pool.map(lambda request: Served(server, MODEL, *request), jobs.values())))
    for job_id, answer in served.items():
        assert answer.text == _reference_text(refs[job_id], tokenizer), job_id
        assert not answer.chunks and answer.finish_reason in ("stop", "length"), job_id


@pytest.mark.parametrize("params,field", [
    ({"return_audio": True}, "return_audio"), ({"speaker": "ethan"}, "speaker"),
    ({"talker_max_new_tokens": 5}, "talker_max_new_tokens"),
])
def test_audio_is_refused_naming_the_field(speechless, params, field):
    server, _ = speechless
    with pytest.raises(TritonStreamError, match=f"invalid_request: {field}"):
        Served(server, MODEL, "Hello?", params)


def test_the_speech_api_chats_in_text_and_refuses_audio(speechless, qwen3_omni_reference, tokenizer):
    import openai

    _, shim = speechless
    client = openai.OpenAI(base_url=f"{shim.url}/v1", api_key="not-needed", max_retries=0, timeout=120)
    described = httpx.get(f"{shim.url}/v1/models/{MODEL}", timeout=30).json()
    assert described["chat"] is True and described["speaks"] is False and described["voices"] == []
    job_id, ref = next((i, r) for i, r in qwen3_omni_reference["tiny"]["jobs"].items()
                       if len(job_messages(r["job"])) == 1 and r["ended_with_im_end"])
    messages = job_messages(ref["job"])
    answer = client.chat.completions.create(model=MODEL, messages=messages, temperature=0,
                                            max_tokens=int(ref["job"]["thinker_max_new_tokens"]))
    assert answer.choices[0].message.content == _reference_text(ref, tokenizer), job_id
    assert answer.choices[0].message.audio is None
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=messages, modalities=["text", "audio"],
                                       audio={"voice": "ethan", "format": "wav"})
    assert e.value.body["param"] == "modalities" and "does not speak" in e.value.body["message"]


def test_the_page_chats_in_text_with_speaking_off(speechless, tmp_path):
    """In the page (headless Chromium) the model's 'speak the answers' box is off and disabled,
    and a turn's answer streams as text."""
    import os

    from tests.system.chromium_cdp import CHROMIUM, Chromium

    assert os.path.exists(CHROMIUM), "the page test needs Debian's chromium (apt-get install -y chromium)"
    _, shim = speechless
    listed = httpx.get(f"{shim.url}/v1/models", timeout=30).json()["data"]
    assert [(m["chat"], m.get("speaks")) for m in listed if m["pipeline"] == MODEL] == [(True, False)]
    browser = Chromium().start()
    try:
        browser.navigate(f"{shim.url}/")
        browser.wait_for("window.omniSpeech && window.omniSpeech.ready", 15)
        browser.evaluate(f"(() => {{ const m = document.getElementById('model'); m.value = {json.dumps(MODEL)};"
                         " m.dispatchEvent(new Event('change')); })()")
        browser.wait_for("window.omniSpeech.mode === 'chat'", 5)
        box = json.loads(browser.evaluate("JSON.stringify([document.getElementById('chat-speak').checked,"
                                          " document.getElementById('chat-speak').disabled])"))
        assert box == [False, True]
        browser.evaluate("document.getElementById('chat-input').value = 'Hello there.'")
        browser.click("#chat-send")
        browser.wait_for("window.omniSpeech.chat.history.length === 2 || window.omniSpeech.chat.phase === 'error'", 60)
        state = json.loads(browser.evaluate("JSON.stringify(window.omniSpeech.chat)"))
        assert state["phase"] == "done", state["error"]
        assert state["answer"] and not state["audioSeconds"]
        browser.screenshot(tmp_path / "text_only_chat.png")
    finally:
        browser.stop()


def test_stop_sequences_end_the_answer_before_them(speechless, qwen3_omni_reference, tokenizer):
    """OpenAI's `stop`: the greedy answer is the reference's, cut where a stop string first
    appears (without it), whole or streamed, finish_reason `stop`; a stop string that never
    appears leaves the answer whole."""
    import openai

    _, shim = speechless
    client = openai.OpenAI(base_url=f"{shim.url}/v1", api_key="not-needed", max_retries=0, timeout=120)
    checked = 0
    for job_id, ref in qwen3_omni_reference["tiny"]["jobs"].items():
        whole = _reference_text(ref, tokenizer)
        if len(whole.strip()) < 6 or "\ufffd" in whole:
            continue
        stop = whole[len(whole) // 2:len(whole) // 2 + 2]
        expected = whole[:whole.find(stop)]
        kwargs = dict(model=MODEL, messages=job_messages(ref["job"]), temperature=0,
                      max_tokens=int(ref["job"]["thinker_max_new_tokens"]))
        answer = client.chat.completions.create(stop=[stop, "never in it \u2603"], **kwargs)
        assert (answer.choices[0].message.content, answer.choices[0].finish_reason) == (expected, "stop"), job_id
        deltas = [c.choices[0].delta.content or "" for c in client.chat.completions.create(stop=stop, stream=True,
                                                                                           **kwargs) if c.choices]
        assert "".join(deltas) == expected, job_id
        untouched = client.chat.completions.create(stop="never in it \u2603", **kwargs)
        assert untouched.choices[0].message.content == whole, job_id
        checked += 1
    assert checked >= 2
