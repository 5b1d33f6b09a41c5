"""The per-frame decode step with the Python overhead taken out (eager, any device).

:meth:`Talker.decode` and :meth:`CodePredictor.first` / :meth:`CodePredictor.next` are written for
clarity: modules called through ``nn.Module.__call__``, one closure per layer, ``rotate_half``
as slices, a negation and a cat. On CPU with a small model almost all of a frame's time is that
overhead (a frame is ~2000 tensor ops, 15 code-predictor steps of every layer). This module runs
the *same tensor operations in the same shapes* from weights unpacked once into plain
attributes, so every result is bit-identical to the module path (and so to the reference):

* RMSNorm skips its ``.to(float32)`` casts when the model is float32 (they return ``self``);
* ``rotate_half(q) * sin`` becomes ``roll(q, D/2) * sin_signed`` where ``sin_signed`` is ``sin``
  with its first half negated: ``(-a) * b`` and ``a * (-b)`` are the same IEEE product, so the
  bits do not change, and one op replaces four;
* a batch of one calls ``F.linear`` / SDPA directly; bigger batches go through
  :class:`BatchInvariantOps` exactly as before;
* on CPU the greedy code-predictor loop of a frame at batch 1 (15 steps, ~1000 ops) is recorded
  once with ``torch.jit.trace`` and replayed without optimisation passes
  (``optimized_execution(False)``: the recorded aten ops run as they are, no fusion), which takes
  the Python interpreter out of the loop. This is the CPU counterpart of a CUDA graph; it is
  checked against the eager loop on its first frames and dropped if the two ever differ. (The
  weights are constants of the recording, shared, not copied; bigger batches stay eager, since
  their recording would materialise the batch-invariant ``bmm``'s expanded weights.)

Tests (``tests/unit/test_qwen3_decode_step.py``) compare it with the module path bit for bit.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from omni_backend.engine.kv_cache import StaticKVCache

from .layers import BatchInvariantOps, DecoderLayer

__all__ = ["LayerWeights", "DecodeStep", "signed_sin", "split_qkv", "fuse_projections"]


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
    matrix is contiguous, so every ``F.linear`` on them gives the same bits). One matmul of the
    fused weight equals the separate ones bit for bit: each output is the same dot product,
    whatever the number of rows (checked in the tests). Idempotent."""
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
    """One decoder layer's tensors as plain attributes (no ``nn.Module`` lookups per op), with its
    projections fused (:func:`fuse_projections`): ``wqkv`` and ``wgu`` (None where a layer's
    biases do not allow it), and ``qk_norm``, the q and k norm weights per head ``[Hq + Hkv, D]``
    so both norms run as one."""

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


def split_qkv(w: LayerWeights, qkv: torch.Tensor, rms, cos: torch.Tensor, sin_signed: torch.Tensor):
    """q, k, v ``[B, heads, n, D]`` from the fused projection ``qkv`` ``[B, n, (Hq + 2 Hkv) D]``:
    q and k normed (per-head weights) and rotated together, v as it is."""
    qkv = qkv.view(qkv.shape[0], qkv.shape[1], -1, w.head_dim)
    split = w.heads + w.kv_heads
    qk = rms(qkv[:, :, :split], w.qk_norm, w.qk_eps).transpose(1, 2)
    qk = (qk * cos) + (qk.roll(w.half, -1) * sin_signed)
    return qk[:, :w.heads], qk[:, w.heads:], qkv[:, :, split:].transpose(1, 2)


def _rms_fp32(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rms_cast(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


class DecodeStep:
    """Lean eager versions of the talker's batched decode and the code predictor's block steps.

    ``talker`` is a :class:`~.talker.Talker`; the caches and rotary tables are the runner's.
    """

    def __init__(self, talker, ops: BatchInvariantOps, cp_rotary, trace: bool | None = None) -> None:
        self.talker = talker
        self.cp = talker.code_predictor
        self.ops = ops
        dtype = talker.codec_head.weight.dtype
        self.rms = _rms_fp32 if dtype == torch.float32 else _rms_cast
        self.talker_layers = [LayerWeights(layer) for layer in talker.model.layers]
        self.cp_layers = [LayerWeights(layer) for layer in self.cp.model.layers]
        self.talker_norm = (talker.model.norm.weight, talker.model.norm.variance_epsilon)
        self.cp_norm = (self.cp.model.norm.weight, self.cp.model.norm.variance_epsilon)
        self.codec_head = talker.codec_head.weight
        self.lm_heads = [head.weight for head in self.cp.lm_head]
        self.cp_embeddings = [e.weight for e in self.cp.model.codec_embedding]
        proj = self.cp.small_to_mtp_projection
        self.projection = None if proj is None else (proj.weight, proj.bias)
        # the code predictor's rotary tables: (cos, signed sin) per start position
        cos, sin = cp_rotary.prefill_table
        self.cp_tables = {0: (cos, signed_sin(sin))}
        for position, (cos, sin) in cp_rotary.tables.items():
            self.cp_tables[position] = (cos, signed_sin(sin))
        self.num_steps = self.cp.num_steps
        self.fp32 = dtype == torch.float32
        device = talker.codec_head.weight.device
        self.trace = device.type == "cpu" if trace is None else bool(trace)
        self._traced: dict[tuple, object] = {}   # (batch, threads, cache id) -> traced frame, or None: eager
        self._checks: dict[tuple, int] = {}      # frames still to compare traced vs eager

    # -- shared pieces
    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if x.shape[0] == 1:
            return F.linear(x, weight, bias)
        return self.ops.linear(x, weight, bias)

    def _qkv(self, w: LayerWeights, x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor):
        lin, rms = self._linear, self.rms
        if w.wqkv is not None:
            # one matmul for q | k | v, one norm and one rotation for q | k: per element the same
            # operations as below (the norm weight is per head), so the same bits
            return split_qkv(w, lin(x, w.wqkv, w.bqkv), rms, cos, sin_signed)
        shape = (x.shape[0], x.shape[1], -1, w.head_dim)
        q = rms(lin(x, w.wq, w.bq).view(shape), w.q_norm, w.qk_eps).transpose(1, 2)
        k = rms(lin(x, w.wk, w.bk).view(shape), w.k_norm, w.qk_eps).transpose(1, 2)
        v = lin(x, w.wv, w.bv).view(shape).transpose(1, 2)
        q = (q * cos) + (q.roll(w.half, -1) * sin_signed)
        k = (k * cos) + (k.roll(w.half, -1) * sin_signed)
        return q, k, v

    def _mlp_residual(self, w: LayerWeights, h: torch.Tensor) -> torch.Tensor:
        lin = self._linear
        x = self.rms(h, w.ln_post, w.eps)
        if w.wgu is not None and x.shape[1] == 1:
            # one matmul for gate | up; only for one position per row, where each row's gate is
            # one contiguous run like a separate gate's (so the activation's vector / scalar
            # split of elements, which can change its bits, is the same)
            gate_up = lin(x, w.wgu)
            gate, up = gate_up[..., :w.inter], gate_up[..., w.inter:]
        else:
            gate, up = lin(x, w.gate), lin(x, w.up)
        gate = w.act(gate) if x.shape[0] == 1 else self.ops.elementwise(w.act_name, w.act, gate)
        return h + lin(gate * up, w.down)

    def _out(self, w: LayerWeights, attn: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        # (the module path's second ``.contiguous()`` returns its input: a reshape of a contiguous tensor)
        attn = attn.transpose(1, 2).contiguous().reshape(x.shape[0], x.shape[1], -1)
        return x + self._linear(attn, w.wo, w.bo)

    # -- code predictor
    def _cp_run(self, embeds: torch.Tensor, start: int, cache: StaticKVCache) -> torch.Tensor:
        if self.projection is not None:
            embeds = self._linear(embeds, *self.projection)
        cos, sin = self.cp_tables[start if start else 0]
        rows, n = embeds.shape[0], embeds.shape[1]
        hidden = embeds
        for index, w in enumerate(self.cp_layers):
            q, k, v = self._qkv(w, self.rms(hidden, w.ln_in, w.eps), cos, sin)
            keys, values = cache.keys[index], cache.values[index]
            keys[:rows, :, start:start + n].copy_(k)
            values[:rows, :, start:start + n].copy_(v)
            if start == 0:  # the 2-token prefill (cp_first): causal
                attn = self._attention(q, k, v, True, w.scaling)
            else:
                attn = self._attention(q, keys[:rows, :, :start + n], values[:rows, :, :start + n], False,
                                       w.scaling)
            hidden = self._mlp_residual(w, self._out(w, attn, hidden))
        return self.rms(hidden, *self.cp_norm)

    def _attention(self, q, k, v, causal: bool, scale: float) -> torch.Tensor:
        if q.shape[0] == 1:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=causal, scale=scale,
                                                  enable_gqa=True)
        return self.ops.attention(q, k, v, causal, scale)

    def cp_first(self, talker_hidden: torch.Tensor, cb0_embed: torch.Tensor, cache: StaticKVCache) -> torch.Tensor:
        """= :meth:`CodePredictor.first`: float32 logits ``[B, vocab]`` of codebook 1."""
        hidden = self._cp_run(torch.cat((talker_hidden, cb0_embed), dim=1), 0, cache)
        logits = self._linear(hidden, self.lm_heads[0])[:, -1, :]
        return logits if self.fp32 else logits.to(torch.float32)

    def cp_next(self, step: int, codes: torch.Tensor, cache: StaticKVCache) -> torch.Tensor:
        """= :meth:`CodePredictor.next`: float32 logits ``[B, vocab]`` of codebook ``step + 1``."""
        embeds = F.embedding(codes.view(-1, 1), self.cp_embeddings[step - 1])
        hidden = self._cp_run(embeds, step + 1, cache)
        logits = self._linear(hidden, self.lm_heads[step])[:, -1, :]
        return logits if self.fp32 else logits.to(torch.float32)

    def greedy_codes(self, talker_hidden: torch.Tensor, cb0_embed: torch.Tensor,
                     cache: StaticKVCache) -> torch.Tensor:
        """Codebooks 1..15 ``[B, 15]`` of a batch of frames, every row greedy."""
        # batch 1 only: that is where the overhead dominates, and a batched recording would hold
        # the batch-invariant path's expanded weights as materialised constants (batch x weights)
        if not self.trace or talker_hidden.shape[0] != 1:
            return self._greedy_codes(talker_hidden, cb0_embed, cache)
        key = (talker_hidden.shape[0], torch.get_num_threads(), id(cache))
        traced = self._traced.get(key, False)
        if traced is False:   # first frame at this batch size: eager (settles the batch-invariance probes)
            codes = self._greedy_codes(talker_hidden, cb0_embed, cache)
            self._traced[key] = self._record(talker_hidden, cb0_embed, cache)
            self._checks[key] = 3
            return codes
        if traced is None:
            return self._greedy_codes(talker_hidden, cb0_embed, cache)
        with torch.jit.optimized_execution(False):
            codes = traced(talker_hidden, cb0_embed)
        if self._checks[key]:
            self._checks[key] -= 1
            if not torch.equal(codes, self._greedy_codes(talker_hidden, cb0_embed, cache)):
                self._traced[key] = None   # never seen; kept as a guard
                warnings.warn(f"traced code-predictor frame differs from eager at batch {key[0]}; using eager")
                return self._greedy_codes(talker_hidden, cb0_embed, cache)
        return codes

    def _greedy_codes(self, talker_hidden: torch.Tensor, cb0_embed: torch.Tensor,
                      cache: StaticKVCache) -> torch.Tensor:
        codes = [torch.argmax(self.cp_first(talker_hidden, cb0_embed, cache), dim=-1)]
        for step in range(1, self.num_steps):
            codes.append(torch.argmax(self.cp_next(step, codes[-1], cache), dim=-1))
        return torch.stack(codes, dim=1)

    def _record(self, talker_hidden: torch.Tensor, cb0_embed: torch.Tensor, cache: StaticKVCache):
        """``torch.jit.trace`` of :meth:`_greedy_codes` for these shapes (None if tracing fails)."""
        def frame(hidden: torch.Tensor, embed: torch.Tensor) -> torch.Tensor:
            return self._greedy_codes(hidden, embed, cache)

        try:
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                return torch.jit.trace(frame, (talker_hidden.clone(), cb0_embed.clone()), check_trace=False)
        except Exception as exc:  # tracing is an optimisation only
            warnings.warn(f"tracing the code-predictor frame failed ({type(exc).__name__}: {exc}); using eager")
            return None

    def embed_codes(self, codes: torch.Tensor) -> list[torch.Tensor]:
        """= :meth:`CodePredictor.embed_codes`: ``[B, 1, talker_hidden]`` per codebook 1..15."""
        return [F.embedding(codes[:, i:i + 1], w) for i, w in enumerate(self.cp_embeddings)]

    # -- talker
    def talker_decode(self, embeds: torch.Tensor, cache: StaticKVCache, slots: list[int], positions: list[int],
                      rotary) -> tuple[torch.Tensor, torch.Tensor]:
        """= :meth:`Talker.decode`: float32 logits ``[B, vocab]`` and hidden states ``[B, 1, hidden]``."""
        device = embeds.device
        batch = embeds.shape[0]
        if batch == 1:
            slot_t = pos_t = None
            cos, sin = rotary.decode(torch.tensor(positions, dtype=torch.long, device=device))
        else:
            slot_t = torch.tensor(slots, dtype=torch.long, device=device)
            pos_t = torch.tensor(positions, dtype=torch.long, device=device)
            cos, sin = rotary.decode(pos_t)
        sin = signed_sin(sin)
        lengths = [p + 1 for p in positions]
        hidden = embeds
        for index, w in enumerate(self.talker_layers):
            q, k, v = self._qkv(w, self.rms(hidden, w.ln_in, w.eps), cos, sin)
            keys, values = cache.keys[index], cache.values[index]
            if batch == 1:
                slot, position = slots[0], positions[0]
                keys[slot, :, position] = k[0, :, 0]
                values[slot, :, position] = v[0, :, 0]
                attn = F.scaled_dot_product_attention(q, keys[slot:slot + 1, :, :position + 1],
                                                      values[slot:slot + 1, :, :position + 1], dropout_p=0.0,
                                                      is_causal=False, scale=w.scaling, enable_gqa=True)
            else:
                keys[slot_t, :, pos_t] = k[:, :, 0]
                values[slot_t, :, pos_t] = v[:, :, 0]
                attn = torch.cat([
                    F.scaled_dot_product_attention(q[b:b + 1], keys[slot:slot + 1, :, :length],
                                                   values[slot:slot + 1, :, :length], dropout_p=0.0,
                                                   is_causal=False, scale=w.scaling, enable_gqa=True)
                    for b, (slot, length) in enumerate(zip(slots, lengths))])
            hidden = self._mlp_residual(w, self._out(w, attn, hidden))
        hidden = self.rms(hidden, *self.talker_norm)
        logits = self._linear(hidden, self.codec_head)[:, -1, :].to(torch.float32)
        return logits, hidden
