"""The batch-invariant exact strategy: the CPU engine's decode, bit for bit the reference's.

On CPU the bits of a matmul, of ``cos`` and of ``silu`` depend on the shape they are computed
in. :class:`BatchInvariantExact` runs every row in the reference's shapes: a batch of one calls
``F.linear`` / SDPA directly, as the reference decodes; a bigger batch goes through
:class:`BatchInvariantOps`, whose every row equals the same row computed alone; the talker
attends per row over that row's own valid length (padding never enters a softmax). Greedy codes
of a batched request therefore equal the same request alone and the reference ``generate()``.
With ``BatchInvariantOps(enabled=False)`` batches run as plain batched ops (faster, not
batch-invariant; the runner's ``batch_invariant=False`` and the joint prefill).

:class:`BatchInvariantExactStep` drives it for the engine: prefill in the reference's shapes, a
frame's code predictor (greedy, or sampled per row with each request's generator on the host),
and the talker decode. On CPU almost all of a small model's frame is Python overhead (a frame is
~2000 tensor ops, 15 code-predictor steps of every layer), so the greedy code-predictor loop of a
frame at batch 1 is recorded once with ``torch.jit.trace`` and replayed without optimisation
passes (``optimized_execution(False)``: the recorded aten ops run as they are, no fusion), which
takes the interpreter out of the loop: the CPU counterpart of a CUDA graph. The replay is checked
against the eager loop on its first frames and dropped if the two ever differ. (The weights are
constants of the recording, shared, not copied; bigger batches stay eager, since their recording
would materialise the batch-invariant ``bmm``'s expanded weights.)
"""
from __future__ import annotations

import warnings
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from omni_backend.engine.kv_cache import StaticKVCache

from .decode import Choose, DecodeNumerics, LayerWeights, Qwen3Decode, signed_sin
from .rotary import TalkerRotary

__all__ = ["BatchInvariantOps", "BatchInvariantExact", "BatchInvariantExactStep"]


class BatchInvariantOps:
    """Batched ops whose every row equals the same row computed alone.

    On CPU, ``F.linear`` of ``[B, K]`` rows gives different bits per row than ``[1, K]`` (MKL
    picks other kernels for other M), and ``silu`` of a flattened ``[B, I]`` tensor sends other
    elements through its scalar tail loop than ``[1, I]``. Here a batched linear runs as a batch
    of single-row matmuls (``bmm`` against the expanded weight: no copy, one call), element-wise
    ops see rows laid apart (:meth:`rows_apart`), and each op is checked once per shape against
    the per-row computation; shapes that fail the check fall back to a loop over rows. With
    ``enabled=False`` plain batched ops are used (faster, not batch-invariant).
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._verdicts: dict[tuple, bool] = {}

    # -- probing
    def _exact(self, key: tuple, batched: Callable[..., torch.Tensor], single: Callable[..., torch.Tensor],
               *like: torch.Tensor) -> bool:
        """Whether ``batched(*xs)`` row ``b`` equals ``single(*(x[b:b+1] for x in xs))``, checked once
        per key on random tensors with the sizes and strides of ``like``."""
        key = key + (torch.get_num_threads(),)  # on CPU some kernels split work by thread count
        verdict = self._verdicts.get(key)
        if verdict is None:
            generator = torch.Generator(device=like[0].device).manual_seed(1234)
            probes = [torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=x.device)
                      .normal_(generator=generator) for x in like]
            with torch.inference_mode():
                together = batched(*probes)
                verdict = all(torch.equal(together[b:b + 1], single(*(p[b:b + 1] for p in probes)))
                              for b in range(like[0].shape[0]))
            self._verdicts[key] = verdict
        return verdict

    @property
    def fallbacks(self) -> list[tuple]:
        """Shapes that run row by row because the batched op was not batch-invariant."""
        return [k for k, ok in self._verdicts.items() if not ok]

    # -- ops
    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``F.linear`` of ``x`` ``[B, M, K]`` whose row ``b`` equals ``F.linear(x[b:b+1], ...)``."""
        if x.shape[0] == 1:
            return F.linear(x, weight, bias)
        if not self.enabled:
            return self._gemm_linear(x, weight, bias)
        key = ("linear", tuple(x.shape), tuple(x.stride()), tuple(weight.shape), bias is not None, x.dtype,
               x.device.type)
        if self._exact(key, lambda t: self._bmm_linear(t, weight, bias), lambda t: F.linear(t, weight, bias), x):
            return self._bmm_linear(x, weight, bias)
        return torch.cat([F.linear(x[b:b + 1], weight, bias) for b in range(x.shape[0])])

    # On CPU (one thread), MKL runs 2-3 rows through another kernel than 4: every weight of a
    # random ``small`` frame once takes 28.3 ms at 2 rows, 32.3 at 3, 27.3 at 4. Batches of 2-3
    # rows are padded to 4 (perf/JOURNAL.md).
    MIN_GEMM_ROWS = 4

    @classmethod
    def _gemm_linear(cls, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if x.device.type != "cpu" or rows >= cls.MIN_GEMM_ROWS:
            return F.linear(x, weight, bias)
        padded = x.new_zeros(cls.MIN_GEMM_ROWS, x.shape[-1])
        padded[:rows] = x.reshape(rows, -1)
        return F.linear(padded, weight, bias)[:rows].view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def _bmm_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        batch, rows, _ = x.shape
        w = weight.t().unsqueeze(0).expand(batch, -1, -1)
        if bias is None:
            return torch.bmm(x, w)
        return torch.baddbmm(bias.expand(batch, rows, -1), x, w)

    def elementwise(self, name: str, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """``fn(x)`` for an element-wise ``fn`` whose vector and scalar code paths may differ."""
        if x.shape[0] == 1 or not self.enabled:
            return fn(x)
        x = self.rows_apart(x)
        key = (name, tuple(x.shape), tuple(x.stride()), x.dtype, x.device.type)
        if self._exact(key, fn, fn, x):
            return fn(x)
        return torch.cat([fn(x[b:b + 1]) for b in range(x.shape[0])])

    @staticmethod
    def rows_apart(x: torch.Tensor) -> torch.Tensor:
        """``x`` with each batch row contiguous and the rows apart in memory, so no kernel can
        run them as one stretch: an element-wise kernel then splits every row into its vector
        body and scalar tail exactly as it splits that row alone. (A flattened ``[B, I]`` puts
        other elements in the tail, and the two paths of a transcendental like ``silu`` round a
        few inputs differently: too rarely for a probe on random data to notice.)"""
        row = x[0].numel()
        if x[0].is_contiguous() and x.stride(0) > row:
            return x
        padded = x.new_empty(x.shape[0], row + 1)[:, :row]
        padded.copy_(x.reshape(x.shape[0], row))
        return padded.view(x.shape)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  scale: float) -> torch.Tensor:
        """SDPA of rows that all have the same key length (``q`` ``[B, heads, n, dim]``). The CPU
        kernel splits work by batch x heads and threads, so a batch is checked against single
        rows; when it differs the rows run one by one."""
        def sdpa(q_, k_, v_):
            return F.scaled_dot_product_attention(q_, k_, v_, dropout_p=0.0, is_causal=causal, scale=scale,
                                                  enable_gqa=True)

        if q.shape[0] == 1:
            return sdpa(q, k, v)
        if self.enabled:
            key = ("sdpa", causal, tuple(q.shape), tuple(q.stride()), tuple(k.shape), tuple(k.stride()),
                   tuple(v.stride()), q.dtype, q.device.type)
            if not self._exact(key, sdpa, sdpa, q, k, v):
                return torch.cat([sdpa(q[b:b + 1], k[b:b + 1], v[b:b + 1]) for b in range(q.shape[0])])
        return sdpa(q, k, v)


def _codebook_sum(x: torch.Tensor) -> torch.Tensor:
    return x.sum(1, keepdim=True)


def _greedy(step: int, logits: torch.Tensor) -> torch.Tensor:
    return torch.argmax(logits, dim=-1)


class BatchInvariantExact(DecodeNumerics):
    """Every row in the reference's shapes: batch 1 as the reference, batches through ``ops``."""

    def __init__(self, ops: BatchInvariantOps) -> None:
        self.ops = ops

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        if x.shape[0] == 1:
            return F.linear(x, weight, bias)
        return self.ops.linear(x, weight, bias)

    def activate(self, w: LayerWeights, gate: torch.Tensor) -> torch.Tensor:
        return w.act(gate) if gate.shape[0] == 1 else self.ops.elementwise(w.act_name, w.act, gate)

    def fuse_gate_up(self, positions: int) -> bool:
        # only for one position per row, where each row's gate is one contiguous run like a
        # separate gate's (so the activation's vector / scalar split of elements, which can
        # change its bits, is the same)
        return positions == 1

    def merge_heads(self, attn: torch.Tensor, rows: int, positions: int) -> torch.Tensor:
        return attn.transpose(1, 2).contiguous().reshape(rows, positions, -1)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  scale: float) -> torch.Tensor:
        if q.shape[0] == 1:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=causal, scale=scale,
                                                  enable_gqa=True)
        return self.ops.attention(q, k, v, causal, scale)

    def block_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor,
                        values: torch.Tensor, start: int, scale: float) -> torch.Tensor:
        if start == 0:  # the 2-token prefill attends to itself, as the reference's prefill
            return self.attention(q, k, v, True, scale)
        return self.attention(q, keys, values, False, scale)

    def sum_codebooks(self, embeds: torch.Tensor) -> torch.Tensor:
        return self.ops.elementwise("codebook_sum", _codebook_sum, embeds)


class BatchInvariantExactStep:
    """Prefill and decode of the exact path over a :class:`~.decode.Qwen3Decode`. ``trace``
    (default: on CPU) replays the greedy code-predictor frame at batch 1 from a recording."""

    def __init__(self, decode: Qwen3Decode, ops: BatchInvariantOps, trace: Optional[bool] = None) -> None:
        self.decode = decode
        self.numerics = BatchInvariantExact(ops)
        # the joint prefill batches prompts plainly whatever the decode's mode
        self.plain = BatchInvariantExact(BatchInvariantOps(enabled=False))
        self.trace = decode.device.type == "cpu" if trace is None else bool(trace)
        self._traced: dict[tuple, object] = {}   # (batch, threads, cache id) -> traced frame, or None: eager
        self._checks: dict[tuple, int] = {}      # frames still to compare traced vs eager

    # -- prefill
    def prefill(self, embeds: torch.Tensor, cache: StaticKVCache, slot: int,
                rotary: TalkerRotary) -> tuple[torch.Tensor, torch.Tensor]:
        """One prompt ``[1, L, hidden]`` into ``slot`` (:meth:`Qwen3Decode.prefill`)."""
        return self.decode.prefill(self.numerics, embeds, cache, slot, rotary)

    def prefill_rows(self, prompts: list[torch.Tensor], cache: StaticKVCache, slots: list[int],
                     rotary: TalkerRotary) -> tuple[torch.Tensor, torch.Tensor]:
        """Several prompts in one padded forward (:meth:`Qwen3Decode.prefill_rows`)."""
        return self.decode.prefill_rows(self.plain, prompts, cache, slots, rotary)

    # -- code predictor
    def sampled_codes(self, talker_hidden: torch.Tensor, cb0_embed: torch.Tensor, cache: StaticKVCache,
                      choose: Choose) -> torch.Tensor:
        """Codebooks 1..15 ``[B, 15]``, ``choose`` picking each step's ids."""
        return self.decode.complete_frame(self.numerics, talker_hidden, cb0_embed, cache, choose)

    def greedy_codes(self, talker_hidden: torch.Tensor, cb0_embed: torch.Tensor,
                     cache: StaticKVCache) -> torch.Tensor:
        """Codebooks 1..15 ``[B, 15]`` of a batch of frames, every row greedy."""
        # batch 1 only: that is where the overhead dominates, and a batched recording would hold
        # the batch-invariant path's expanded weights as materialised constants (batch x weights)
        if not self.trace or talker_hidden.shape[0] != 1:
            return self.eager_greedy_codes(talker_hidden, cb0_embed, cache)
        key = (talker_hidden.shape[0], torch.get_num_threads(), id(cache))
        traced = self._traced.get(key, False)
        if traced is False:   # first frame at this batch size: eager (settles the batch-invariance probes)
            codes = self.eager_greedy_codes(talker_hidden, cb0_embed, cache)
            self._traced[key] = self._record(talker_hidden, cb0_embed, cache)
            self._checks[key] = 3
            return codes
        if traced is None:
            return self.eager_greedy_codes(talker_hidden, cb0_embed, cache)
        with torch.jit.optimized_execution(False):
            codes = traced(talker_hidden, cb0_embed)
        if self._checks[key]:
            self._checks[key] -= 1
            if not torch.equal(codes, self.eager_greedy_codes(talker_hidden, cb0_embed, cache)):
                self._traced[key] = None   # never seen; kept as a guard
                warnings.warn(f"traced code-predictor frame differs from eager at batch {key[0]}; using eager")
                return self.eager_greedy_codes(talker_hidden, cb0_embed, cache)
        return codes

    def traced_frames(self) -> list[tuple]:
        """Keys ``(batch, threads, cache id)`` whose greedy frame replays from a recording."""
        return [key for key, traced in self._traced.items() if traced is not None]

    def eager_greedy_codes(self, talker_hidden: torch.Tensor, cb0_embed: torch.Tensor,
                           cache: StaticKVCache) -> torch.Tensor:
        return self.decode.complete_frame(self.numerics, talker_hidden, cb0_embed, cache, _greedy)

    def _record(self, talker_hidden: torch.Tensor, cb0_embed: torch.Tensor,
                cache: StaticKVCache) -> Optional[Callable[..., torch.Tensor]]:
        """``torch.jit.trace`` of :meth:`eager_greedy_codes` for these shapes (None if tracing fails)."""
        def frame(hidden: torch.Tensor, embed: torch.Tensor) -> torch.Tensor:
            return self.eager_greedy_codes(hidden, embed, cache)

        try:
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                return torch.jit.trace(frame, (talker_hidden.clone(), cb0_embed.clone()), check_trace=False)
        except Exception as exc:  # tracing is an optimisation only
            warnings.warn(f"tracing the code-predictor frame failed ({type(exc).__name__}: {exc}); using eager")
            return None

    # -- talker
    def next_talker_input(self, cb0_embed: torch.Tensor, codes: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """:meth:`Qwen3Decode.next_talker_input` in this strategy."""
        return self.decode.next_talker_input(self.numerics, cb0_embed, codes, text)

    def talker_decode(self, embeds: torch.Tensor, cache: StaticKVCache, slots: list[int], positions: list[int],
                      rotary: TalkerRotary) -> tuple[torch.Tensor, torch.Tensor]:
        """Advance ``B`` sequences by one position: ``embeds`` ``[B, 1, hidden]``, row ``b`` at
        ``positions[b]`` of ``slots[b]``, attending to the ``positions[b] + 1`` keys of its own
        slot. Returns float32 logits ``[B, vocab]`` and hidden states ``[B, 1, hidden]``."""
        device = embeds.device
        batch = embeds.shape[0]
        if batch == 1:
            slot, position = slots[0], positions[0]
            cos, sin = rotary.decode(torch.tensor(positions, dtype=torch.long, device=device))

            def attend(index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
                keys, values = cache.keys[index], cache.values[index]
                keys[slot, :, position] = k[0, :, 0]
                values[slot, :, position] = v[0, :, 0]
                return F.scaled_dot_product_attention(q, keys[slot:slot + 1, :, :position + 1],
                                                      values[slot:slot + 1, :, :position + 1], dropout_p=0.0,
                                                      is_causal=False, scale=scale, enable_gqa=True)
        else:
            slot_t = torch.tensor(slots, dtype=torch.long, device=device)
            pos_t = torch.tensor(positions, dtype=torch.long, device=device)
            cos, sin = rotary.decode(pos_t)
            lengths = [p + 1 for p in positions]

            def attend(index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
                keys, values = cache.keys[index], cache.values[index]
                keys[slot_t, :, pos_t] = k[:, :, 0]
                values[slot_t, :, pos_t] = v[:, :, 0]
                return torch.cat([
                    F.scaled_dot_product_attention(q[b:b + 1], keys[s:s + 1, :, :length], values[s:s + 1, :, :length],
                                                   dropout_p=0.0, is_causal=False, scale=scale, enable_gqa=True)
                    for b, (s, length) in enumerate(zip(slots, lengths))])

        return self.decode.talker(self.numerics, embeds, cos, signed_sin(sin), attend)
