"""Request fields of VoxCPM2, as the reference's ``generate``: ``cfg_value``,
``inference_timesteps``, ``min_len`` / ``max_len`` (patches), ``seed`` (the diffusion noise), and
voice cloning from a recording ``ref_audio`` in the reference's three modes (``clone_mode``):
``continuation`` (the default with its transcript ``ref_text``: the transcript before the text, the
recording's latents after it, so the speech goes on from it), ``reference`` (the default without a
transcript: the recording between the reference-audio tokens before the text, its voice without
its words) and ``ref_continuation`` (both, the reference's "ultimate cloning"). ``instructions``
describes the voice (the reference's voice design, or a style for a reference clone): the model
reads ``(description)text``, as the package's CLI builds it."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from omni_backend.adapters.base import MAX_PARAMS_BYTES, Param, TTSAdapter
from omni_backend.errors import InvalidRequest

from .family import OUTPUT_RATE
from .prompt import CLONE_MODES

if TYPE_CHECKING:
    from omni_backend.deploy import DeployConfig

REF_AUDIO_MAX_BYTES = 10 * 1024 * 1024
REF_AUDIO_MAX_CHARS = REF_AUDIO_MAX_BYTES * 4 // 3 + 256   # base64 of 10 MiB plus a data-URL header
# the defaults of the package's public VoxCPM.generate; seed: the noise of request 0 unless given
DEFAULTS = {"cfg_value": 2.0, "inference_timesteps": 10, "min_len": 2, "max_len": 4096, "seed": 0}


class VoxCPM2Adapter(TTSAdapter):
    max_params_bytes = REF_AUDIO_MAX_CHARS + MAX_PARAMS_BYTES
    params = (
        Param("cfg_value", float, default=DEFAULTS["cfg_value"], lo=0.0, hi=10.0,
              help="classifier-free guidance of the diffusion head"),
        Param("inference_timesteps", int, default=DEFAULTS["inference_timesteps"], lo=1, hi=100,
              help="flow-matching solver steps per patch"),
        Param("min_len", int, default=DEFAULTS["min_len"], lo=0, hi=4096,
              help="patches before the stop head may end the speech"),
        Param("max_len", int, default=DEFAULTS["max_len"], lo=1, hi=4096,
              help="patch limit (also at most 6 per text token + 10, as the reference)"),
        Param("seed", int, default=DEFAULTS["seed"], lo=0, hi=2**63 - 1, help="seed of the diffusion noise"),
        Param("ignore_eos", bool, help="the stop head never ends the speech: up to the patch limit (benchmarks)"),
        Param("ref_audio", str, max_len=REF_AUDIO_MAX_CHARS,
              help="voice to clone: data URL or base64 of wav/flac/mp3 (1-30 s, <= 10 MiB)"),
        Param("ref_text", str, max_len=4096, help="the transcript of ref_audio (for the continuation modes)"),
        Param("instructions", str, max_len=4096,
              help="voice design: a description of the voice (gender, age, tone, emotion, pace), read as "
                   "\"(description)text\"; also steers a reference clone; not with ref_text"),
        Param("clone_mode", str, choices=CLONE_MODES,
              help="how ref_audio is used: continuation (default with ref_text), reference (its voice only; "
                   "default without ref_text) or ref_continuation (both)"),
    )

    @classmethod
    def from_model(cls, model_path: str | None, deploy: "DeployConfig | None" = None) -> "VoxCPM2Adapter":
        """Reads the checkpoint's config, so that a folder of another model is refused when the
        repository is built, not when the server loads it."""
        from omni_backend.models.voxcpm2.builtin import resolve_checkpoint
        from omni_backend.models.voxcpm2.config import load_config

        if not model_path:
            raise ValueError("voxcpm2 needs a checkpoint folder (--model PATH)")
        path = resolve_checkpoint(model_path)
        try:
            rate = load_config(path).audio_vae_config.out_sample_rate
        except (KeyError, TypeError) as e:
            raise ValueError(f"{path}/config.json: not a VoxCPM2 config ({type(e).__name__}: {e})") from None
        if rate != OUTPUT_RATE:   # the responses are labelled with the pipeline's rate
            raise ValueError(f"{path}/config.json: audio_vae_config.out_sample_rate is {rate}; this pipeline "
                             f"serves {OUTPUT_RATE} Hz, as the released VoxCPM2")
        return cls({"model_path": path})

    def check(self, text: str, params: dict[str, Any]) -> dict[str, Any]:
        mode = clone_mode(params)
        if mode is None:
            for name in ("ref_text", "clone_mode"):
                if params.get(name) is not None:
                    raise InvalidRequest(name, "only with ref_audio (the recording to clone)")
        else:
            has_text = bool((params.get("ref_text") or "").strip())
            if mode == "reference" and params.get("ref_text") is not None:
                raise InvalidRequest("ref_text", "not used by clone_mode reference (the recording's voice only)")
            if mode != "reference" and not has_text:
                raise InvalidRequest("ref_text", f"required with clone_mode {mode} (the transcript of ref_audio)")
            if mode != "reference" and (params.get("instructions") or "").strip():
                # as the package's CLI: the speech continues the recording's, a description would break in
                raise InvalidRequest("instructions", f"not with clone_mode {mode} (ref_text): a description "
                                                     "steers a designed voice or a reference clone")
            from omni_backend.reference_audio import decode_reference_audio

            decode_reference_audio(params["ref_audio"], "ref_audio")   # readable, within limits
        if params["min_len"] >= params["max_len"]:
            raise InvalidRequest("min_len", f"must be below max_len ({params['max_len']})")
        return params


def clone_mode(params: dict[str, Any]) -> str | None:
    """The cloning mode of a request: none without ``ref_audio``; else ``clone_mode``, by default
    ``continuation`` with ``ref_text`` and ``reference`` without."""
    if params.get("ref_audio") is None:
        return None
    if params.get("clone_mode") is not None:
        return params["clone_mode"]
    return "continuation" if params.get("ref_text") is not None else "reference"
