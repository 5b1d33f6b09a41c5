"""The talker and code predictor arithmetic, written once: prefill, and one decode step per frame.

A frame: the code predictor completes codebooks 1..15 of the pending frame (a 2-token prefill of
``[talker hidden, embedding(codebook 0)]``, then 14 single-token steps; step ``i`` embeds codebook
``i`` with ``codec_embedding[i-1]`` and predicts codebook ``i+1`` with ``lm_head[i]``), then the
talker takes the sum of the frame's 16 codebook embeddings plus the next text embedding, advances
one position and predicts codebook 0 of the next frame. A prompt is prefilled through the same
layers.

:class:`Qwen3Decode` holds what both engine paths share: the weights unpacked once into plain
attributes (:class:`LayerWeights`: no ``nn.Module`` lookups per op, fused projections), the
RMSNorm, the q / k / v projection with its norm and rotation, the decoder layer, the code
predictor's rotary tables and its frame loop, the talker stack and the next talker input. How a
tensor op runs is a :class:`DecodeNumerics` strategy, one per engine path:

* :class:`~.exact_step.BatchInvariantExact` (the CPU default): every row in the reference's
  shapes, so greedy codes equal the reference ``generate()`` and a row never depends on the
  other rows of its batch;
* :class:`~.static_step.GraphSafeStatic` (the CUDA default): plain batched ops over static
  buffers, nothing that reads a device value on the host, so a step can be captured as a CUDA
  graph.

The modules (``talker.py``, ``code_predictor.py``, ``qwen3_common/layers.py``) only hold the checkpoint's
tensors under its names. The arithmetic follows the reference (``qwen-tts==0.1.1`` on
transformers 4.57.3 with SDPA) operation for operation; the rewrites below change no bit:

* RMSNorm skips its ``.to(float32)`` casts when the model is float32 (they return ``self``);
* ``rotate_half(x) * sin`` is ``roll(x, D/2) * signed_sin(sin)``: ``(-a) * b`` and ``a * (-b)``
  are the same IEEE product, and one op replaces four;
* ``q_proj | k_proj | v_proj`` and ``gate_proj | up_proj`` run as one matmul each over fused
  weights (:func:`fuse_projections`): each output is the same dot product. Prefill keeps the
  separate projections, in the reference's shapes.
"""
from __future__ import annotations

import abc
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from omni_backend.engine.kv_cache import StaticKVCache

from omni_backend.models.qwen3_common.layers import DecoderLayer

from .rotary import CodePredictorRotary, TalkerRotary

__all__ = ["DecodeNumerics", "LayerWeights", "Qwen3Decode", "fuse_projections", "signed_sin"]

# attend(layer index, q, k, v, scale) -> attention output [B, heads, n, D]; writes k / v to the cache
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]
# choose(code predictor step, float32 logits [B, vocab]) -> ids [B]
Choose = Callable[[int, torch.Tensor], torch.Tensor]


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """``sin`` with the first half of its last dim negated: ``rotate_half(x) * sin ==
    roll(x, D/2, -1) * signed_sin(sin)`` bit for bit."""
    half = sin.shape[-1] // 2
    out = sin.clone()
    out[..., :half] = -sin[..., :half]
    return out


def fuse_projections(layer: DecoderLayer) -> None:
    """Store ``q_proj | k_proj | v_proj`` and ``gate_proj | up_proj`` weights as one tensor each,
    the module weights becoming row views of it (no second copy; a row slice of a contiguous
    matrix is contiguous, so every ``F.linear`` on them gives the same bits). Idempotent."""
    a, m = layer.self_attn, layer.mlp
    with torch.inference_mode(False), torch.no_grad():
        if getattr(a, "qkv_weight", None) is None and (a.q_proj.bias is None) == (a.k_proj.bias is None) \
                == (a.v_proj.bias is None):
            a.qkv_weight, a.qkv_bias = _fuse([a.q_proj, a.k_proj, a.v_proj])
        if getattr(m, "gate_up_weight", None) is None and m.gate_proj.bias is None and m.up_proj.bias is None:
            m.gate_up_weight, _ = _fuse([m.gate_proj, m.up_proj])


def _fuse(linears: list) -> tuple[torch.Tensor, torch.Tensor | None]:
    weight = torch.cat([lin.weight for lin in linears])
    bias = None if linears[0].bias is None else torch.cat([lin.bias for lin in linears])
    row = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight.data = weight[row:row + rows]
        if bias is not None:
            lin.bias.data = bias[row:row + rows]
        row += rows
    return weight, bias


class LayerWeights:
    """One decoder layer's tensors as plain attributes, with its projections fused
    (:func:`fuse_projections`): ``wqkv`` and ``wgu`` (None where a layer's biases do not allow
    it), and ``qk_norm``, the q and k norm weights per head ``[Hq + Hkv, D]`` so both norms run
    as one."""

    __slots__ = ("ln_in", "ln_post", "eps", "q_norm", "k_norm", "qk_eps", "wq", "bq", "wk", "bk", "wv", "bv",
                 "wo", "bo", "gate", "up", "down", "act", "act_name", "head_dim", "scaling", "half",
                 "wqkv", "bqkv", "wgu", "qk_norm", "heads", "kv_heads", "inter")

    def __init__(self, layer: DecoderLayer) -> None:
        fuse_projections(layer)
        a, m = layer.self_attn, layer.mlp
        self.ln_in = layer.input_layernorm.weight
        self.ln_post = layer.post_attention_layernorm.weight
        self.eps = layer.input_layernorm.variance_epsilon
        assert layer.post_attention_layernorm.variance_epsilon == self.eps
        self.q_norm, self.k_norm = a.q_norm.weight, a.k_norm.weight
        self.qk_eps = a.q_norm.variance_epsilon
        assert a.k_norm.variance_epsilon == self.qk_eps
        self.wq, self.bq = a.q_proj.weight, a.q_proj.bias
        self.wk, self.bk = a.k_proj.weight, a.k_proj.bias
        self.wv, self.bv = a.v_proj.weight, a.v_proj.bias
        self.wo, self.bo = a.o_proj.weight, a.o_proj.bias
        self.gate, self.up, self.down = m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight
        self.act, self.act_name = m.act_fn, m.hidden_act
        self.head_dim = a.head_dim
        self.scaling = a.scaling
        self.half = a.head_dim // 2
        self.heads, self.kv_heads = a.num_heads, a.num_kv_heads
        self.inter = self.gate.shape[0]
        self.wqkv, self.bqkv = getattr(a, "qkv_weight", None), getattr(a, "qkv_bias", None)
        self.wgu = getattr(m, "gate_up_weight", None)
        with torch.inference_mode(False), torch.no_grad():
            self.qk_norm = torch.cat((self.q_norm.expand(self.heads, -1), self.k_norm.expand(self.kv_heads, -1)))


def _rms_fp32(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rms_cast(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


class DecodeNumerics(abc.ABC):
    """How the decode's tensor ops run: the strategy an engine path picks."""

    @abc.abstractmethod
    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``F.linear`` of ``x`` ``[B, n, K]``."""

    @abc.abstractmethod
    def activate(self, w: LayerWeights, gate: torch.Tensor) -> torch.Tensor:
        """The MLP's activation of ``gate`` ``[B, n, I]``."""

    @abc.abstractmethod
    def fuse_gate_up(self, positions: int) -> bool:
        """Whether ``gate | up`` runs as one matmul for ``positions`` positions per row."""

    @abc.abstractmethod
    def merge_heads(self, attn: torch.Tensor, rows: int, positions: int) -> torch.Tensor:
        """Attention output ``[B, heads, n, D]`` as ``[B, n, heads * D]`` for ``o_proj``."""

    @abc.abstractmethod
    def block_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor,
                        values: torch.Tensor, start: int, scale: float) -> torch.Tensor:
        """The code predictor's attention: ``n`` new positions ``start..start+n-1`` per row (``q``,
        ``k``, ``v``), each row attending causally to its own ``keys`` / ``values`` ``0..start+n-1``
        (cache views that already hold ``k`` / ``v``)."""

    @abc.abstractmethod
    def sum_codebooks(self, embeds: torch.Tensor) -> torch.Tensor:
        """``[B, 16, H]`` codebook embeddings of a frame summed to ``[B, 1, H]``."""


class Qwen3Decode:
    """The talker's and code predictor's forward passes over weights unpacked once.

    ``talker`` is a :class:`~.talker.Talker`; ``cp_rotary`` the code predictor's rotary tables.
    Every pass takes the :class:`DecodeNumerics` to run with; caches and talker rotary tables
    are the caller's.
    """

    def __init__(self, talker, cp_rotary: CodePredictorRotary) -> None:
        cp = talker.code_predictor
        weight = talker.codec_head.weight
        self.dtype, self.device = weight.dtype, weight.device
        self.rms = _rms_fp32 if self.dtype == torch.float32 else _rms_cast
        self.talker_layers = [LayerWeights(layer) for layer in talker.model.layers]
        self.cp_layers = [LayerWeights(layer) for layer in cp.model.layers]
        self.talker_norm = (talker.model.norm.weight, talker.model.norm.variance_epsilon)
        self.cp_norm = (cp.model.norm.weight, cp.model.norm.variance_epsilon)
        self.codec_embedding = talker.model.codec_embedding.weight
        self.codec_head = weight
        self.lm_heads = [head.weight for head in cp.lm_head]
        self.cp_embeddings = [e.weight for e in cp.model.codec_embedding]
        proj = cp.small_to_mtp_projection
        self.projection = None if proj is None else (proj.weight, proj.bias)
        self.num_steps = cp.num_steps
        # the code predictor's positions are the same every frame: (cos, signed sin) per start position
        cos, sin = cp_rotary.prefill_table
        self.cp_tables = {0: (cos, signed_sin(sin))}
        for position, (cos, sin) in cp_rotary.tables.items():
            self.cp_tables[position] = (cos, signed_sin(sin))

    # -- one decoder layer
    def qkv(self, lin: Callable[..., torch.Tensor], w: LayerWeights, x: torch.Tensor, cos: torch.Tensor,
            sin: torch.Tensor, fused: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v ``[B, heads, n, D]`` of ``x`` ``[B, n, H]``: q and k normed (per head) and
        rotated (``sin`` signed, :func:`signed_sin`)."""
        rms = self.rms
        if fused and w.wqkv is not None:
            # one matmul for q | k | v, one norm and one rotation for q | k: per element the same
            # operations as below (the norm weight is per head), so the same bits
            qkv = lin(x, w.wqkv, w.bqkv)
            qkv = qkv.view(qkv.shape[0], qkv.shape[1], -1, w.head_dim)
            split = w.heads + w.kv_heads
            qk = rms(qkv[:, :, :split], w.qk_norm, w.qk_eps).transpose(1, 2)
            qk = (qk * cos) + (qk.roll(w.half, -1) * sin)
            return qk[:, :w.heads], qk[:, w.heads:], qkv[:, :, split:].transpose(1, 2)
        shape = (x.shape[0], x.shape[1], -1, w.head_dim)
        q = rms(lin(x, w.wq, w.bq).view(shape), w.q_norm, w.qk_eps).transpose(1, 2)
        k = rms(lin(x, w.wk, w.bk).view(shape), w.k_norm, w.qk_eps).transpose(1, 2)
        v = lin(x, w.wv, w.bv).view(shape).transpose(1, 2)
        q = (q * cos) + (q.roll(w.half, -1) * sin)
        k = (k * cos) + (k.roll(w.half, -1) * sin)
        return q, k, v

    def layer(self, num: DecodeNumerics, index: int, w: LayerWeights, hidden: torch.Tensor, cos: torch.Tensor,
              sin: torch.Tensor, attend: Attend, fused: bool = True) -> torch.Tensor:
        """``hidden`` ``[B, n, H]`` through decoder layer ``index``; ``attend`` is the caller's
        attention (and cache write). ``fused=False`` keeps every projection separate."""
        lin = num.linear
        rows, positions = hidden.shape[0], hidden.shape[1]
        q, k, v = self.qkv(lin, w, self.rms(hidden, w.ln_in, w.eps), cos, sin, fused)
        attn = attend(index, q, k, v, w.scaling)
        h = hidden + lin(num.merge_heads(attn, rows, positions), w.wo, w.bo)
        x = self.rms(h, w.ln_post, w.eps)
        if fused and w.wgu is not None and num.fuse_gate_up(positions):
            gate_up = lin(x, w.wgu)
            gate, up = gate_up[..., :w.inter], gate_up[..., w.inter:]
        else:
            gate, up = lin(x, w.gate), lin(x, w.up)
        return h + lin(num.activate(w, gate) * up, w.down)

    # -- talker
    def talker(self, num: DecodeNumerics, embeds: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               attend: Attend, fused: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """The talker stack over ``embeds`` ``[B, n, H]``: normed hidden states ``[B, n, H]`` and
        the float32 codec-head logits ``[B, vocab]`` of the last position."""
        hidden = embeds
        for index, w in enumerate(self.talker_layers):
            hidden = self.layer(num, index, w, hidden, cos, sin, attend, fused)
        hidden = self.rms(hidden, *self.talker_norm)
        # the reference projects every position and keeps the last (M = n in the matmul)
        return num.linear(hidden, self.codec_head)[:, -1, :].to(torch.float32), hidden

    def prefill(self, num: DecodeNumerics, embeds: torch.Tensor, cache: StaticKVCache, slot: int,
                rotary: TalkerRotary) -> tuple[torch.Tensor, torch.Tensor]:
        """One prompt ``[1, L, hidden]`` from position 0 into ``slot``, in the reference's shapes
        (separate projections): float32 logits ``[1, vocab]`` of the last position and its hidden
        state ``[1, 1, hidden]``."""
        cos, sin = rotary.prefill(embeds.shape[1])
        causal = embeds.shape[1] > 1

        def attend(index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
            cache.write_prefix(index, slot, k, v)
            return F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=causal, scale=scale,
                                                  enable_gqa=True)

        logits, hidden = self.talker(num, embeds, cos, signed_sin(sin), attend, fused=False)
        return logits, hidden[:, -1:, :]

    def prefill_rows(self, num: DecodeNumerics, prompts: list[torch.Tensor], cache: StaticKVCache,
                     slots: list[int], rotary: TalkerRotary) -> tuple[torch.Tensor, torch.Tensor]:
        """Several prompts ``[1, L_b, hidden]`` in one right-padded forward, prompt ``b`` into
        ``slots[b]`` (batched matmuls, so not bit-identical to :meth:`prefill`: one pass instead
        of N saves N-1 passes of kernel launches). Causal attention keeps every real position off
        the padding after it; the padding's keys land past each prompt's end, where decoding masks
        and overwrites them. Returns float32 logits ``[N, vocab]`` at each prompt's last position
        and those hidden states ``[N, 1, hidden]``."""
        lengths = [p.shape[1] for p in prompts]
        hidden = torch.nn.utils.rnn.pad_sequence([p[0] for p in prompts], batch_first=True)
        device = hidden.device
        slot_t = torch.tensor(slots, dtype=torch.long, device=device)
        length = hidden.shape[1]
        cos, sin = rotary.prefill(length)

        def attend(index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
            cache.keys[index][slot_t, :, :length] = k
            cache.values[index][slot_t, :, :length] = v
            return F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=True, scale=scale,
                                                  enable_gqa=True)

        sin = signed_sin(sin)
        for index, w in enumerate(self.talker_layers):
            hidden = self.layer(num, index, w, hidden, cos, sin, attend, fused=False)
        last = torch.tensor(lengths, dtype=torch.long, device=device) - 1
        hidden = self.rms(hidden[torch.arange(len(prompts), device=device), last], *self.talker_norm).unsqueeze(1)
        return F.linear(hidden, self.codec_head)[:, -1, :].to(torch.float32), hidden

    def next_talker_input(self, num: DecodeNumerics, cb0_embed: torch.Tensor, codes: torch.Tensor,
                          text: torch.Tensor) -> torch.Tensor:
        """The talker's input after a frame: the sum of its 16 codebook embeddings (codebook 0
        embedded as ``cb0_embed`` ``[B, 1, H]``, ``codes`` ``[B, 15]``) plus ``text`` ``[B, 1, H]``."""
        parts = [cb0_embed] + self.embed_codes(codes)
        return num.sum_codebooks(torch.cat(parts, dim=1)) + text

    # -- code predictor
    def embed_codes(self, codes: torch.Tensor) -> list[torch.Tensor]:
        """Embeddings ``[B, 1, talker_hidden]`` of codebooks 1..15 (``codes`` ``[B, 15]``)."""
        return [F.embedding(codes[:, i:i + 1], w) for i, w in enumerate(self.cp_embeddings)]

    def code_predictor_logits(self, num: DecodeNumerics, step: int, embeds: torch.Tensor,
                              cache: StaticKVCache) -> torch.Tensor:
        """Float32 logits ``[B, vocab]`` of codebook ``step + 1``. Step 0 is the 2-token prefill
        (``embeds`` ``[B, 2, talker_hidden]``) at positions 0..1; step ``s`` (1..14) embeds
        codebook ``s`` at position ``s + 1``. Row ``b`` of the batch is row ``b`` of ``cache``."""
        if self.projection is not None:
            embeds = num.linear(embeds, *self.projection)
        start = step + 1 if step else 0
        cos, sin = self.cp_tables[start]
        rows, n = embeds.shape[0], embeds.shape[1]

        def attend(index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
            keys, values = cache.keys[index], cache.values[index]
            keys[:rows, :, start:start + n].copy_(k)
            values[:rows, :, start:start + n].copy_(v)
            return num.block_attention(q, k, v, keys[:rows, :, :start + n], values[:rows, :, :start + n], start,
                                       scale)

        hidden = embeds
        for index, w in enumerate(self.cp_layers):
            hidden = self.layer(num, index, w, hidden, cos, sin, attend)
        hidden = self.rms(hidden, *self.cp_norm)
        return num.linear(hidden, self.lm_heads[step])[:, -1, :].to(torch.float32)

    def complete_frame(self, num: DecodeNumerics, talker_hidden: torch.Tensor, cb0_embed: torch.Tensor,
                       cache: StaticKVCache, choose: Choose) -> torch.Tensor:
        """Codebooks 1..15 ``[B, 15]`` of a batch of frames from the talker's last hidden state and
        the embedded codebook 0 (both ``[B, 1, talker_hidden]``); ``choose`` picks each step's ids."""
        logits = self.code_predictor_logits(num, 0, torch.cat((talker_hidden, cb0_embed), dim=1), cache)
        codes = [choose(0, logits)]
        for step in range(1, self.num_steps):
            embeds = F.embedding(codes[-1].view(-1, 1), self.cp_embeddings[step - 1])
            codes.append(choose(step, self.code_predictor_logits(num, step, embeds, cache)))
        return torch.stack(codes, dim=1)
