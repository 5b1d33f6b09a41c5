"""Request fields of Qwen3-Omni (thinker -> talker -> code2wav): a chat turn in, text and speech out.

TEXT is the user's new message. PARAMS ``messages`` (optional) is the conversation before it,
OpenAI-style ``{"role": "system" | "user" | "assistant", "content": str or a list of parts}`` (system
messages anywhere, rendered where they stand by the checkpoint's chat template); a part is ``{"type": "text", "text": ...}`` or, in user messages,
``{"type": "input_audio", "input_audio": {"data": <base64>, "format": "wav" | "mp3" | ...}}`` or
``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}``.
PARAMS ``content`` (optional) holds parts of the new message that come before TEXT (a recording,
then the question about it); with ``content``, TEXT may be empty (a spoken question alone).
``system`` is a system prompt, put before ``messages``. The thinker answers; ``return_audio: false`` skips the talker and code2wav (a
text-only stream). Sampling: the thinker's (``max_tokens``, ``do_sample``, ``temperature`` (0 =
greedy), ``top_k``, ``top_p``, ``repetition_penalty``, ``seed``) and the talker's (``talker_*``;
the code predictor follows the talker's ``do_sample`` as in the reference).

Validation renders the checkpoint's chat template over the messages, so a bad role or content is
rejected by the entry model, naming the field, before any stage is touched.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from omni_backend.adapters.base import MAX_PARAMS_BYTES, Param, TTSAdapter, check_string, decode_params, shown
from omni_backend.errors import InvalidRequest

from .config import SPEECHLESS
from .stop_strings import MAX_STOP_CHARS, MAX_STOP_STRINGS

if TYPE_CHECKING:
    from omni_backend.deploy import DeployConfig

DEFAULT_SPEAKER = "ethan"
# the conversation with its recordings (base64): several 30-s recordings fit
MAX_MESSAGES_BYTES = 48 * 1024 * 1024
TALKER_STAGES = frozenset({1})   # skipping the talker skips code2wav too (PipelineConfig.stages_run)
# the fields of the audio alone: refused with return_audio false, absent for a checkpoint that does not speak
AUDIO_ONLY = frozenset({"speaker", "talker_do_sample", "talker_temperature", "talker_top_k", "talker_top_p",
                        "talker_repetition_penalty", "talker_max_new_tokens", "initial_chunk_frames", "chunk_frames"})


def _blank(text: bytes | str) -> bool:
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            return False   # decode_text names the problem
    return isinstance(text, str) and not text.strip()


class Qwen3OmniAdapter(TTSAdapter):
    max_params_bytes = MAX_MESSAGES_BYTES + MAX_PARAMS_BYTES
    params = (
        Param("system", str, max_len=16384, help="system prompt"),
        Param("speaker", str, max_len=64, help="the talker's voice (case-insensitive)"),
        Param("return_audio", bool, default=True, help="false: the text answer only (no talker, no code2wav)"),
        Param("max_tokens", int, lo=1, hi=32768, help="the thinker's answer limit, in tokens"),
        Param("ignore_eos", bool, help="thinker: answer up to max_tokens, <|im_end|> never ends it (benchmarks)"),
        Param("do_sample", bool, help="thinker: sample (default: the deploy's, else greedy)"),
        Param("temperature", float, lo=0.0, hi=5.0, help="thinker; 0 = greedy"),
        Param("top_k", int, lo=0, hi=1000000),
        Param("top_p", float, lo=1e-3, hi=1.0),
        Param("repetition_penalty", float, lo=1.0, hi=5.0),
        Param("seed", int, lo=0, hi=2**63 - 1, help="sampling seed of both models; unset = random"),
        Param("talker_do_sample", bool, help="talker and code predictor: sample (reference default true)"),
        Param("talker_temperature", float, lo=1e-3, hi=5.0),
        Param("talker_top_k", int, lo=0, hi=100000),
        Param("talker_top_p", float, lo=1e-3, hi=1.0),
        Param("talker_repetition_penalty", float, lo=1.0, hi=5.0),
        Param("talker_max_new_tokens", int, lo=1, hi=32768, help="codec frame limit + 1 (12.5 frames per second)"),
        Param("initial_chunk_frames", int, lo=0, hi=300, help="frames in the first audio chunk (0: a regular chunk)"),
        Param("chunk_frames", int, lo=1, hi=300, help="frames per later chunk"),
    )

    def __init__(self, context: dict[str, Any] | None = None):
        super().__init__(context)
        self.builder = self.context.get("prompt_builder")
        if self.builder is not None and not self.speaks:   # a text answer is all it gives
            self.params = tuple(Param("return_audio", bool, default=False, help="false: the text answer (this "
                                      "checkpoint does not speak)") if p.name == "return_audio" else p
                                for p in self.params if p.name not in AUDIO_ONLY)

    @classmethod
    def from_model(cls, model_path: str | None, deploy: "DeployConfig | None" = None) -> "Qwen3OmniAdapter":
        from omni_backend.models.qwen3_omni.builtin import resolve_checkpoint
        from omni_backend.models.qwen3_omni.checkpoint import load_checkpoint

        if not model_path:
            raise ValueError("qwen3_omni needs a checkpoint folder (--model PATH)")
        path = resolve_checkpoint(model_path)
        checkpoint = load_checkpoint(path, parts=())   # config, tokenizer and chat template only
        return cls({"prompt_builder": checkpoint.prompt_builder(), "model_path": path})

    @property
    def speaks(self) -> bool:
        """False for a checkpoint without talker (config.json enable_audio_output: false)."""
        return self.builder.config.talker is not None

    @property
    def speakers(self) -> list[str]:
        return list(self.builder.config.talker.speakers) if self.speaks else []

    def default_speaker(self) -> str | None:
        if not self.speakers:
            return None
        return DEFAULT_SPEAKER if DEFAULT_SPEAKER in self.speakers else self.speakers[0]

    def describe(self) -> dict[str, Any]:
        params = [p.to_dict() for p in self.params]
        for d in params:   # the checkpoint's speakers are the voices
            if d["name"] == "speaker":
                d.update(choices=self.speakers, default=self.default_speaker())
        params.append({"name": "messages", "type": "list", "help": "the conversation before TEXT"})
        params.append({"name": "content", "type": "list",
                       "help": "parts of the new message before TEXT (text, input_audio, image_url)"})
        params.append({"name": "stop", "type": "list",
                       "help": f"up to {MAX_STOP_STRINGS} strings that end a text answer where one appears "
                               "(not part of the answer); with return_audio false"})
        # `chat`: TEXT is a user turn answered by the model (PARAMS `messages`: the turns before it)
        # `speaks`: false when the checkpoint answers in text only; `stage_sampling`: what a
        # client's per-stage sampling list (vLLM-Omni's) sets here
        return {"params": params, "voices": self.speakers, "default_voice": self.default_speaker(), "clones_voices": False,
                "chat": True, "speaks": self.speaks, "stage_sampling": self.stage_sampling()}

    def stage_sampling(self) -> list[dict[str, Any]]:
        """Per stage, in order: the request fields its vLLM sampling keys set, its stop tokens,
        whether it returns text (`detokenize`), whether only a spoken answer runs it; code2wav
        samples nothing."""
        config = self.builder.config
        thinker = {"stage": "thinker", "stop_token_ids": [config.im_end_token_id], "detokenize": True,
                   "fields": {"temperature": "temperature", "do_sample": "do_sample", "top_p": "top_p",
                              "top_k": "top_k", "max_tokens": "max_tokens", "repetition_penalty": "repetition_penalty",
                              "seed": "seed"}}
        talker = {"stage": "talker", "audio_only": True, "detokenize": False,
                  "stop_token_ids": [config.talker.codec_eos_token_id] if self.speaks else [],
                  "fields": {"temperature": "talker_temperature", "do_sample": "talker_do_sample",
                             "top_p": "talker_top_p", "top_k": "talker_top_k", "max_tokens": "talker_max_new_tokens",
                             "repetition_penalty": "talker_repetition_penalty", "seed": "seed"}}
        return [thinker, talker, {"stage": "code2wav"}]

    def validate(self, text: bytes | str, params: bytes | str | dict | None) -> dict[str, Any]:
        raw = params if isinstance(params, dict) else decode_params(params, self.max_params_bytes)
        raw = dict(raw)
        history = raw.pop("messages", None)
        content = raw.pop("content", None)
        stop = _stop_strings(raw.pop("stop", None))
        if content is not None and (not isinstance(content, list) or not content):
            raise InvalidRequest("content", "must be a non-empty list of content parts (the new message before TEXT)")
        if content is not None and _blank(text):   # a message of media alone: TEXT adds nothing
            request = self.validate_params("", raw)
        else:
            request = super().validate(text, raw)
        if history is not None and not isinstance(history, list):
            raise InvalidRequest("messages", "must be a list of {role, content} (the conversation before TEXT)")
        messages = list(history or [])
        if content is None:
            messages.append({"role": "user", "content": request["text"]})
        else:
            new = list(content) + ([{"type": "text", "text": request["text"]}] if request["text"] else [])
            messages.append({"role": "user", "content": new})
        # Renders and tokenizes the real prompt, decoding its recordings: raises InvalidRequest naming
        # messages[i].role / .content[j]
        try:
            self.builder.build_prompt(messages=messages, system=request.get("system"))
        except InvalidRequest as error:
            if content is not None and error.field.startswith(f"messages[{len(messages) - 1}].content"):
                raise InvalidRequest("content" + error.field[len(f"messages[{len(messages) - 1}].content"):],
                                     error.reason) from None
            raise
        request["messages"] = messages
        if stop:
            # a spoken answer would have to unsay what the talker already voiced past the stop
            if request["return_audio"]:
                raise InvalidRequest("stop", "ends text answers only; ask for the text answer (return_audio: false)")
            request["stop"] = stop
        return request

    def check(self, text: str, params: dict[str, Any]) -> dict[str, Any]:
        if not self.speaks:
            if params["return_audio"]:
                raise InvalidRequest("return_audio", f"{SPEECHLESS}; ask for the text answer only")
        else:
            speaker = (params.get("speaker") or self.default_speaker()).strip().lower()
            if speaker not in self.speakers:
                raise InvalidRequest("speaker", f"unknown speaker {speaker!r}; known: {', '.join(self.speakers)}")
            params["speaker"] = speaker
        if not params["return_audio"]:
            given = [p.name for p in self.params if p.name in AUDIO_ONLY - {"speaker"} and params.get(p.name) is not None]
            if given:
                raise InvalidRequest(given[0], "applies to the audio, which return_audio: false does not make")
        return params

    def unserved_stages(self) -> frozenset[int]:
        # the talker and code2wav of a checkpoint without them (PipelineConfig.stages_run drops
        # code2wav with the talker)
        return frozenset() if self.speaks else frozenset({1, 2})

    def skipped_stages(self, request: dict[str, Any]) -> frozenset[int]:
        return frozenset() if request["return_audio"] else TALKER_STAGES


def _stop_strings(value: Any) -> list[str]:
    """PARAMS ``stop``: a string or a list of up to MAX_STOP_STRINGS non-empty strings."""
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or len(stops) > MAX_STOP_STRINGS:
        raise InvalidRequest("stop", f"must be a string or a list of at most {MAX_STOP_STRINGS} strings, "
                                     f"got {shown(value)}")
    for i, stop in enumerate(stops):
        field = "stop" if isinstance(value, str) else f"stop[{i}]"
        if not isinstance(stop, str) or not stop:
            raise InvalidRequest(field, f"must be a non-empty string, got {shown(stop)}")
        if len(stop) > MAX_STOP_CHARS:
            raise InvalidRequest(field, f"must be at most {MAX_STOP_CHARS} characters, got {len(stop)}")
        check_string(field, stop)
    return list(stops)
