"""The events of OpenAI's Realtime API that `WS /v1/realtime` sends to an OpenAI client: one
response's sequence, a conversation item's echo, and the session's description.

Two spellings: the GA API's (`response.output_audio.delta`, `response.output_audio_transcript.delta`,
`conversation.item.added`, ...), and the beta's (`response.audio.delta`,
`response.audio_transcript.delta`, `conversation.item.created`, ...), which a client that sends
`OpenAI-Beta: realtime=v1` (the SDK's `client.beta.realtime`) reads.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


@dataclass
class ResponseEvents:
    """One response: an assistant message whose one content part is audio (with its transcript)
    or text."""
    beta: bool
    audio: bool
    response_id: str = field(default_factory=lambda: new_id("resp"))
    item_id: str = field(default_factory=lambda: new_id("item"))

    @property
    def _part_type(self) -> str:
        if self.audio:
            return "audio" if self.beta else "output_audio"
        return "text" if self.beta else "output_text"

    def _name(self, ga: str, beta: str) -> str:
        return beta if self.beta else ga

    def _where(self) -> dict[str, Any]:
        return {"response_id": self.response_id, "item_id": self.item_id, "output_index": 0, "content_index": 0}

    def item(self, status: str, text: str | None) -> dict[str, Any]:
        content = [] if text is None else [{"type": self._part_type,
                                            ("transcript" if self.audio else "text"): text}]
        return {"id": self.item_id, "object": "realtime.item", "type": "message", "role": "assistant",
                "status": status, "content": content}

    def _response(self, status: str, output: list[dict], usage: dict | None = None,
                  reason: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"id": self.response_id, "object": "realtime.response", "status": status,
                                "status_details": None if reason is None else {"type": status, "reason": reason},
                                "output": output, "usage": usage}
        body["modalities" if self.beta else "output_modalities"] = ["audio", "text"] if self.audio and self.beta \
            else (["audio"] if self.audio else ["text"])
        return body

    def started(self) -> list[dict[str, Any]]:
        part = {"type": self._part_type, ("transcript" if self.audio else "text"): ""}
        return [{"type": "response.created", "response": self._response("in_progress", [])},
                {"type": "response.output_item.added", "response_id": self.response_id, "output_index": 0,
                 "item": self.item("in_progress", None)},
                {"type": "response.content_part.added", **self._where(), "part": part}]

    def text_delta(self, delta: str) -> dict[str, Any]:
        if self.audio:
            kind = self._name("response.output_audio_transcript.delta", "response.audio_transcript.delta")
        else:
            kind = self._name("response.output_text.delta", "response.text.delta")
        return {"type": kind, **self._where(), "delta": delta}

    def audio_delta(self, data: str) -> dict[str, Any]:
        return {"type": self._name("response.output_audio.delta", "response.audio.delta"), **self._where(),
                "delta": data}

    def finished(self, text: str, usage: dict[str, Any], status: str = "completed",
                 reason: str | None = None) -> list[dict[str, Any]]:
        """The closing events; ``status``: completed, cancelled (``reason`` client_cancelled) or
        incomplete (``reason`` max_output_tokens)."""
        events = []
        if self.audio:
            events.append({"type": self._name("response.output_audio.done", "response.audio.done"), **self._where()})
            events.append({"type": self._name("response.output_audio_transcript.done",
                                              "response.audio_transcript.done"), **self._where(), "transcript": text})
        else:
            events.append({"type": self._name("response.output_text.done", "response.text.done"), **self._where(),
                           "text": text})
        part = {"type": self._part_type, ("transcript" if self.audio else "text"): text}
        item = self.item("completed" if status == "completed" else "incomplete", text)
        events += [{"type": "response.content_part.done", **self._where(), "part": part},
                   {"type": "response.output_item.done", "response_id": self.response_id, "output_index": 0,
                    "item": item},
                   {"type": "response.done", "response": self._response(status, [item], usage, reason)}]
        return events

    def failed(self, error: dict[str, Any]) -> dict[str, Any]:
        response = self._response("failed", [])
        response["status_details"] = {"type": "failed", "error": error}
        return {"type": "response.done", "response": response}


def item_echo(item: dict[str, Any], previous_item_id: str | None, beta: bool) -> list[dict[str, Any]]:
    """A conversation item the client added (or committed audio), as the API echoes it."""
    if beta:
        return [{"type": "conversation.item.created", "previous_item_id": previous_item_id, "item": item}]
    return [{"type": "conversation.item.added", "previous_item_id": previous_item_id, "item": item},
            {"type": "conversation.item.done", "previous_item_id": previous_item_id, "item": item}]


def usage(chat_usage: dict[str, Any]) -> dict[str, Any]:
    """A chat completion's usage as the Realtime API counts it."""
    details = chat_usage.get("completion_tokens_details") or {}
    audio = int(details.get("audio_tokens", 0))
    return {"total_tokens": chat_usage["total_tokens"], "input_tokens": chat_usage["prompt_tokens"],
            "output_tokens": chat_usage["completion_tokens"],
            "input_token_details": {"text_tokens": chat_usage["prompt_tokens"], "audio_tokens": 0, "cached_tokens": 0},
            "output_token_details": {"text_tokens": chat_usage["completion_tokens"] - audio, "audio_tokens": audio}}
