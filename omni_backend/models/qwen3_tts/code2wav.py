"""Qwen3-TTS 12 Hz speech-tokenizer decoder ("code2wav"): 16 codebooks per frame -> 24 kHz audio.

Pipeline (maths of the reference ``qwen-tts==0.1.1``, always Float32)::

    codes [B, 16, T]
      -> split RVQ dequantisation (codebook 0 semantic, 1..15 acoustic)   [B, codebook_dim, T]
      -> pre_conv (causal, k=3)                                           [B, latent, T]
      -> pre_transformer (causal, sliding window 72, RoPE from 0)          [B, latent, T]
      -> upsample: 2 x (transposed conv x2 + ConvNeXt)                    [B, latent, 4T]
      -> decoder: conv k=7, 4 blocks (rates 8,5,4,3), SnakeBeta, conv     [B, 1, 1920 T]
      -> clamp to [-1, 1]

Streaming contract (stateless windows)
--------------------------------------
A window is ``left_context + new`` consecutive frames. :meth:`Code2Wav.decode_window` decodes
it and returns only the audio of the ``new`` frames (the first ``left_context * hop_length``
samples are dropped). The transformer runs over the whole window; the convolutional vocoder
after it only over the last ``new + vocoder_context_frames`` frames (10: its receptive field,
computed from the layers), which gives the same kept audio up to kernel rounding (~1e-6) at
about a third of the cost of a 72 + 25 window.

Windows carry no state, so windows of different requests batch freely:

* :meth:`Code2Wav.decode_window` takes a batch of windows of the same total length and context;
* :meth:`Code2Wav.decode_windows` takes windows of any lengths and contexts.

How a batch is computed depends on :attr:`Code2Wav.batch_invariant`:

* ``True`` (the default on CPU): every window runs its own forward pass, so its audio is
  bit-identical to decoding it alone, whatever else is in the batch. (CPU GEMM and oneDNN
  convolution kernels pick their blocking from the batch size, which changes the rounding by
  ~1e-6; on CPU a real-size decoder is compute-bound, so the loop costs little.)
* ``False`` (the default on CUDA): ONE forward pass for the whole batch. Windows of different
  lengths are RIGHT-padded with code 0 to the longest. The decoder is causal end to end (every
  convolution pads on the left only, the transposed convolutions drop their right overhang,
  attention is causal), so the padding lies in the future of every real frame and cannot change
  its audio; each window equals its decode alone up to float rounding (a few 1e-6 on CPU).

:class:`CodecChunkSchedule` (torch-free, in ``omni_backend.chunking``; re-exported here) plans a
stream into windows: a first chunk of ``initial_chunk_frames``, then chunks of
``chunk_frames``, each window carrying up to ``left_context_frames`` frames before it, the last
partial chunk flushed at the end. The audio of the windows, concatenated, has exactly
``frames * hop_length`` samples.

While a stream is shorter than the sliding window (72 frames) every window sees the whole
prefix, and the streamed audio equals the full decode up to float rounding. Beyond that, a
window's left context truncates what the stacked sliding-window layers would have seen, so
streamed and full decodes differ (the reference's own ``decode`` has the same property: it
decodes in chunks of 300 frames with 25 frames of context). With a random tiny checkpoint the
difference is large (0.37 max abs for 10 frames of context); how audible it is with the
released weights has not been measured here.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Sequence

import torch
from torch import nn

from omni_backend.chunking import CodecChunkSchedule, CodecWindow, plan_stream_windows
from omni_backend.models.qwen3_common.code2wav_layers import (
    CausalConv1d,
    SlidingWindowTransformer,
    SplitResidualVectorQuantizer,
    causal_history_frames,
    total_upsampling,
    vocoder,
)

logger = logging.getLogger(__name__)

__all__ = [
    "Code2Wav",
    "Code2WavGraphs",
    "captured_window_decoder",
    "Code2WavConfig",
    "CodecChunkSchedule",
    "CodecWindow",
    "plan_stream_windows",
    "REFERENCE_DECODE_CHUNK_FRAMES",
    "REFERENCE_DECODE_LEFT_CONTEXT_FRAMES",
]

# The reference ``Qwen3TTSTokenizerV2Model.decode`` decodes in chunks of 300 frames, each with
# 25 frames of left context; :meth:`Code2Wav.decode` does the same by default.
REFERENCE_DECODE_CHUNK_FRAMES = 300
REFERENCE_DECODE_LEFT_CONTEXT_FRAMES = 25

CHECKPOINT_PREFIX = "decoder."


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class Code2WavConfig:
    """Decoder hyper-parameters; the defaults are the released Qwen3-TTS-Tokenizer-12Hz."""

    codebook_size: int = 2048
    codebook_dim: int = 512
    num_quantizers: int = 16
    num_semantic_quantizers: int = 1
    latent_dim: int = 1024
    hidden_size: int = 512
    num_hidden_layers: int = 8
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 64
    intermediate_size: int = 1024
    hidden_act: str = "silu"
    attention_bias: bool = False
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    sliding_window: int = 72
    upsampling_ratios: tuple[int, ...] = (2, 2)
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    decoder_dim: int = 1536
    sample_rate: int = 24000
    hop_length: int = 1920

    def __post_init__(self) -> None:
        product = total_upsampling(self.upsampling_ratios) * total_upsampling(self.upsample_rates)
        if product != self.hop_length:
            raise ValueError(f"upsampling_ratios x upsample_rates = {product}, but decode_upsample_rate is "
                             f"{self.hop_length}")
        if self.decoder_dim % (2 ** len(self.upsample_rates)):
            raise ValueError("decoder_dim must be divisible by 2 ** len(upsample_rates)")

    @classmethod
    def from_speech_tokenizer_config(cls, config: Mapping) -> "Code2WavConfig":
        """From the ``speech_tokenizer/config.json`` dictionary (model_type qwen3_tts_tokenizer_12hz).

        A key missing from ``decoder_config`` takes the default of the reference's config class
        (as the reference itself would), not the released value this dataclass defaults to.
        """
        if config.get("model_type") != "qwen3_tts_tokenizer_12hz":
            raise ValueError(f"expected model_type qwen3_tts_tokenizer_12hz, got {config.get('model_type')!r}")
        dec = dict(config.get("decoder_config") or {})
        if "codebook_dim" not in dec:  # the reference config class has no default for it
            raise ValueError("decoder_config.codebook_dim is missing")
        hidden_size = int(dec.get("hidden_size", 1024))
        heads = int(dec.get("num_attention_heads", 16))
        return cls(
            codebook_size=int(dec.get("codebook_size", 2048)),
            codebook_dim=int(dec["codebook_dim"]),
            num_quantizers=int(dec.get("num_quantizers", 16)),
            num_semantic_quantizers=1,  # the reference decoder hard-codes one semantic codebook
            latent_dim=int(dec.get("latent_dim", 1024)),
            hidden_size=hidden_size,
            num_hidden_layers=int(dec.get("num_hidden_layers", 8)),
            num_attention_heads=heads,
            num_key_value_heads=int(dec.get("num_key_value_heads", 16)),
            head_dim=int(dec.get("head_dim") or hidden_size // heads),
            intermediate_size=int(dec.get("intermediate_size", 3072)),
            hidden_act=str(dec.get("hidden_act", "silu")),
            attention_bias=bool(dec.get("attention_bias", False)),
            rms_norm_eps=float(dec.get("rms_norm_eps", 1e-5)),
            rope_theta=float(dec.get("rope_theta", 10000.0)),
            sliding_window=int(dec.get("sliding_window", 72)),
            upsampling_ratios=tuple(int(r) for r in dec.get("upsampling_ratios", (2, 2))),
            upsample_rates=tuple(int(r) for r in dec.get("upsample_rates", (8, 5, 4, 3))),
            decoder_dim=int(dec.get("decoder_dim", 1536)),
            sample_rate=int(config.get("output_sample_rate", 24000)),
            hop_length=int(config.get("decode_upsample_rate", 1920)),
        )


# --------------------------------------------------------------------------- the decoder


class Code2Wav(nn.Module):
    """The speech-tokenizer decoder. Attribute names are the checkpoint's ``decoder.*`` keys."""

    def __init__(self, config: Code2WavConfig) -> None:
        super().__init__()
        self.config = config
        self.quantizer = SplitResidualVectorQuantizer(config.num_quantizers, config.num_semantic_quantizers,
                                                      config.codebook_dim, config.codebook_size)
        self.pre_conv = CausalConv1d(config.codebook_dim, config.latent_dim, kernel_size=3)
        self.pre_transformer = SlidingWindowTransformer(
            latent_dim=config.latent_dim, hidden_size=config.hidden_size,
            num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
            num_key_value_heads=config.num_key_value_heads, head_dim=config.head_dim,
            intermediate_size=config.intermediate_size, hidden_act=config.hidden_act,
            rms_norm_eps=config.rms_norm_eps, rope_theta=config.rope_theta,
            sliding_window=config.sliding_window, attention_bias=config.attention_bias,
        )
        self.upsample, self.decoder = vocoder(config.latent_dim, config.decoder_dim, config.upsampling_ratios,
                                              config.upsample_rates)
        # True: a batch is decoded item by item, each bit-identical to its decode alone.
        self.batch_invariant = True
        history, steps = causal_history_frames([self.upsample, self.decoder])
        if steps != config.hop_length:
            raise ValueError(f"the vocoder makes {steps} samples per frame, config says {config.hop_length}")
        # frames of context the vocoder (everything after the transformer) needs for exact output
        self.vocoder_context_frames = math.ceil(history)

    # ---------------------------------------------------------------- loading

    @classmethod
    def from_checkpoint(cls, speech_tokenizer_dir: str | os.PathLike, device: str | torch.device = "cpu",
                        batch_invariant: bool | None = None) -> "Code2Wav":
        """Load ``config.json`` and the ``decoder.*`` tensors of ``model.safetensors`` (strictly: a
        missing or extra decoder tensor is an error; ``encoder.*`` tensors are ignored).

        ``batch_invariant`` defaults to True on CPU and False elsewhere (see the module docstring)."""
        from safetensors import safe_open

        directory = os.fspath(speech_tokenizer_dir)
        with open(os.path.join(directory, "config.json"), encoding="utf-8") as handle:
            config = Code2WavConfig.from_speech_tokenizer_config(json.load(handle))
        state: dict[str, torch.Tensor] = {}
        with safe_open(os.path.join(directory, "model.safetensors"), framework="pt", device="cpu") as weights:
            for key in weights.keys():
                if key.startswith(CHECKPOINT_PREFIX):
                    state[key[len(CHECKPOINT_PREFIX):]] = weights.get_tensor(key).to(torch.float32)
        with torch.device("meta"):  # no throw-away initialisation of the weights
            model = cls(config)
        model.load_state_dict(state, strict=True, assign=True)
        model.requires_grad_(False)
        model = model.to(device).eval()
        model.batch_invariant = model.device.type == "cpu" if batch_invariant is None else bool(batch_invariant)
        return model

    # ---------------------------------------------------------------- properties

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    @property
    def hop_length(self) -> int:
        """Audio samples per codec frame (1920 at 24 kHz, 12.5 frames per second)."""
        return self.config.hop_length

    @property
    def num_quantizers(self) -> int:
        return self.config.num_quantizers

    @property
    def device(self) -> torch.device:
        return self.pre_conv.conv.weight.device

    # ---------------------------------------------------------------- core

    def _check_codes(self, codes: torch.Tensor) -> torch.Tensor:
        if codes.dim() != 3 or codes.shape[1] != self.num_quantizers:
            raise ValueError(f"codes must be [batch, {self.num_quantizers}, frames], got {tuple(codes.shape)}")
        if codes.dtype.is_floating_point or codes.dtype == torch.bool:
            raise ValueError(f"codes must be integers, got {codes.dtype}")
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.config.codebook_size):
            raise ValueError(f"codes must lie in [0, {self.config.codebook_size})")
        if self.pre_conv.conv.weight.dtype != torch.float32:
            raise TypeError("the codec decoder runs in Float32; do not cast it to another dtype")
        # contiguous: a strided view (a window sliced out of a stream) picks other kernels
        return codes.to(device=self.device, dtype=torch.long).contiguous()

    def forward(self, codes: torch.Tensor, skip_frames: int = 0) -> torch.Tensor:
        """``codes [B, num_quantizers, T]`` (long, validated) -> audio of frames ``skip_frames..T-1``,
        ``[B, (T - skip_frames) * hop_length]``.

        The transformer sees all ``T`` frames (its sliding window needs them). The vocoder after
        it (upsampling convs, decoder blocks) looks at most :attr:`vocoder_context_frames` frames
        back, so it runs only from ``skip_frames - vocoder_context_frames``: the kept audio is
        the same as running it on the whole window (up to kernel rounding), at a fraction of
        the cost for a streaming window (35 instead of 97 frames by default).
        """
        hidden = self.quantizer.dequantize(codes)
        hidden = self.pre_conv(hidden).transpose(1, 2)
        hidden = self.pre_transformer(hidden).transpose(1, 2)
        start = max(0, skip_frames - self.vocoder_context_frames)
        if start:
            hidden = hidden[..., start:]
        for stage in self.upsample:
            for layer in stage:
                hidden = layer(hidden)
        for layer in self.decoder:
            hidden = layer(hidden)
        audio = hidden.clamp(min=-1.0, max=1.0).squeeze(1)
        return audio[:, (skip_frames - start) * self.hop_length:]

    def _run(self, codes: torch.Tensor, skip_frames: int) -> torch.Tensor:
        """``forward`` over a batch, item by item when :attr:`batch_invariant`."""
        if self.batch_invariant and codes.shape[0] > 1:
            return torch.cat([self(codes[i: i + 1], skip_frames) for i in range(codes.shape[0])])
        return self(codes, skip_frames)

    # ---------------------------------------------------------------- public decoding

    @torch.inference_mode()
    def decode_window(self, codes: torch.Tensor, left_context_frames: int) -> torch.Tensor:
        """Decode same-length windows ``codes [B, 16, left + new]`` and return the audio of the new
        frames only, ``[B, new * hop_length]`` (the first ``left * hop_length`` samples dropped)."""
        codes = self._check_codes(codes)
        if not 0 <= left_context_frames <= codes.shape[-1]:
            raise ValueError(f"left_context_frames {left_context_frames} outside [0, {codes.shape[-1]}]")
        if codes.shape[-1] == 0:
            return torch.zeros(codes.shape[0], 0, device=self.device)
        return self._run(codes, left_context_frames)

    @torch.inference_mode()
    def decode_windows(self, windows: Sequence[torch.Tensor], left_context_frames: Sequence[int]) -> list[torch.Tensor]:
        """Decode windows of different requests together, whatever their lengths and contexts.

        ``windows[i]`` is ``[16, n_i]`` (or ``[1, 16, n_i]``), ``left_context_frames[i]`` its
        context. Returns, per window, its new audio ``[(n_i - left_i) * hop_length]``.
        With :attr:`batch_invariant` each window runs alone (bit-identical to
        :meth:`decode_window` of that window); otherwise the windows are right-padded with code 0
        to the longest and run as ONE batch (causality keeps the padding out of the real frames).
        """
        if len(windows) != len(left_context_frames):
            raise ValueError("need one left_context_frames value per window")
        flat = [w[0] if w.dim() == 3 and w.shape[0] == 1 else w for w in windows]
        for window, left in zip(flat, left_context_frames):
            if window.dim() != 2 or window.shape[0] != self.num_quantizers:
                raise ValueError(f"each window must be [{self.num_quantizers}, frames], got {tuple(window.shape)}")
            if not 0 <= left <= window.shape[-1]:
                raise ValueError(f"left_context_frames {left} outside [0, {window.shape[-1]}]")
        if self.batch_invariant:
            return [self.decode_window(w[None], left)[0] for w, left in zip(flat, left_context_frames)]
        if not flat:
            return []
        longest = max(w.shape[-1] for w in flat)
        batch = torch.zeros(len(flat), self.num_quantizers, longest, dtype=torch.long, device=flat[0].device)
        for index, window in enumerate(flat):
            batch[index, :, : window.shape[-1]] = window
        batch = self._check_codes(batch)
        skip = min(left_context_frames)
        audio = self(batch, skip) if longest else torch.zeros(len(flat), 0, device=self.device)
        hop = self.hop_length
        return [audio[i, (left - skip) * hop: (w.shape[-1] - skip) * hop]
                for i, (w, left) in enumerate(zip(flat, left_context_frames))]

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor, chunk_frames: int = REFERENCE_DECODE_CHUNK_FRAMES,
               left_context_frames: int = REFERENCE_DECODE_LEFT_CONTEXT_FRAMES) -> torch.Tensor:
        """Non-streaming decode: ``codes [B, 16, T]`` -> ``[B, T * hop_length]``.

        Like the reference ``Qwen3TTSTokenizerV2Model.decode``, sequences longer than
        ``chunk_frames`` are decoded in chunks with ``left_context_frames`` of context (memory
        stays bounded); up to ``chunk_frames`` frames it is one forward pass.
        """
        codes = self._check_codes(codes)
        schedule = CodecChunkSchedule(chunk_frames, chunk_frames, left_context_frames)
        pieces = [self._run(codes[..., w.start_frame: w.end_frame], w.left_context_frames)
                  for w in schedule.plan(codes.shape[-1])]
        if not pieces:
            return torch.zeros(codes.shape[0], 0, device=self.device)
        return torch.cat(pieces, dim=-1)

    def decode_stream(self, codes: torch.Tensor, schedule: CodecChunkSchedule | None = None) -> Iterator[torch.Tensor]:
        """Decode finished ``codes [B, 16, T]`` window by window as a stream would: yields the audio
        of each window's new frames, ``[B, new * hop_length]``; the pieces concatenate to
        ``T * hop_length`` samples."""
        schedule = schedule or CodecChunkSchedule()
        for window in schedule.plan(codes.shape[-1]):
            yield self.decode_window(codes[..., window.start_frame: window.end_frame], window.left_context_frames)


class Code2WavGraphs:
    """CUDA graphs of :meth:`Code2Wav.forward` per (batch, frames, skip) bucket (GPU only, optional).

    A streaming schedule makes few window shapes: the first window (``initial_chunk_frames``, no
    context) and the steady window (``left_context + chunk`` frames, skipping ``left_context``).
    For each ``(frames, skip)`` in ``windows`` and each batch size in ``batch_sizes`` the decoder
    is captured over a static code buffer; :meth:`decode_window` pads a batch up to the next
    captured size with code 0 (padding rows are separate batch items: they cannot touch the real
    rows) and replays, and falls back to the eager decoder for any other shape. Replays equal
    the eager decoder run on the same padded batch. With ``enabled=False`` (or on CPU) nothing is
    captured and every call is eager.
    """

    def __init__(self, model: Code2Wav, windows: Sequence[tuple[int, int]] = ((2, 0), (97, 72)),
                 batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64), enabled: bool | None = None,
                 warmup: int = 2) -> None:
        self.model = model
        self.windows = [(int(f), int(s)) for f, s in windows]
        self.batch_sizes = sorted({int(b) for b in batch_sizes})
        self.enabled = model.device.type == "cuda" if enabled is None else bool(enabled)
        self.warmup = warmup
        self.graphs: dict[tuple[int, int, int], tuple] = {}

    def capture(self) -> None:
        if not self.enabled:
            return
        from omni_backend.engine.cuda_graphs import capture_graph

        largest = self.batch_sizes[-1]
        with torch.inference_mode(), torch.cuda.device(self.model.device):
            pool = torch.cuda.graph_pool_handle()
            stream = torch.cuda.Stream()
            for frames, skip in self.windows:
                codes = torch.zeros(largest, self.model.num_quantizers, frames, dtype=torch.long,
                                    device=self.model.device)
                for size in reversed(self.batch_sizes):
                    graph, audio = capture_graph(lambda: self.model(codes[:size], skip), pool, stream, self.warmup)
                    self.graphs[(size, frames, skip)] = (graph, codes, audio)
            torch.cuda.synchronize()

    @torch.inference_mode()
    def decode_window(self, codes: torch.Tensor, left_context_frames: int) -> torch.Tensor:
        """As :meth:`Code2Wav.decode_window`; replays a graph when the shape has one."""
        codes = self.model._check_codes(codes)
        batch, frames = codes.shape[0], codes.shape[-1]
        size = next((b for b in self.batch_sizes if b >= batch), None)
        entry = self.graphs.get((size, frames, left_context_frames)) if size is not None else None
        if entry is None:
            return self.model.decode_window(codes, left_context_frames)
        graph, buffer, audio = entry
        buffer[:batch].copy_(codes)
        if size > batch:
            buffer[batch:size].zero_()
        with torch.cuda.device(self.model.device):
            graph.replay()
        return audio[:batch].clone()


def captured_window_decoder(model: Code2Wav, windows: Sequence[tuple[int, int]],
                            batch_sizes: Sequence[int]) -> Callable[[torch.Tensor, int], torch.Tensor]:
    """`decode_window` with CUDA graphs of these window shapes and batch sizes captured now (a
    stage loads them before it reports ready); the eager decoder when capture fails: served
    eagerly rather than not at all."""
    graphs = Code2WavGraphs(model, windows=windows, batch_sizes=batch_sizes)
    try:
        graphs.capture()
    except Exception:  # noqa: BLE001
        logger.exception("code2wav CUDA graph capture failed; decoding eagerly")
        return model.decode_window
    logger.info("code2wav: %d CUDA graphs captured", len(graphs.graphs))
    return graphs.decode_window
