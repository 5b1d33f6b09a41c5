"""The sparse mixture-of-experts block of the Qwen3-Omni thinker and talker.

Checkpoint layout (module names = keys): ``gate.weight`` (the router, ``[experts, hidden]``),
``experts.{e}.gate_proj / up_proj / down_proj.weight``, and for the talker ``shared_expert.*``
(a dense MLP) with ``shared_expert_gate.weight`` (``[1, hidden]``).

Routing is the reference's: softmax over all experts in float32, top-k, then (``norm_topk_prob``)
divided by the sum of the k chosen probabilities. The experts run as transformers 5 runs them by
default (its ``grouped_mm`` experts implementation): the (token, expert) pairs sorted by expert,
one grouped matmul over ``gate | up`` and one over ``down``, each pair scaled by its routing
weight, and each token's k results summed. The expert weights are therefore also held fused,
``gate_up`` ``[experts, 2 * inter, hidden]`` and ``down`` ``[experts, hidden, inter]``, with the
per-expert module weights as views into them (:meth:`SparseMoeBlock.fuse_experts`; no second
copy). The talker adds ``sigmoid(shared_expert_gate(x)) * shared_expert(x)``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omni_backend.models.qwen3_common.layers import MLP, activation

__all__ = ["Router", "SparseMoeBlock"]


class Router(nn.Module):
    """``gate``: router logits ``x @ weight.T`` over the experts."""

    def __init__(self, hidden_size: int, num_experts: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_experts, hidden_size))


def _grouped_mm(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Rows of ``x`` (sorted by expert; ``offsets`` the running row count per expert) times their
    expert's ``weight[e].T``."""
    return F.grouped_mm(x.to(weight.dtype), weight.transpose(-2, -1), offs=offsets)


class SparseMoeBlock(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int,
                 norm_topk_prob: bool, hidden_act: str, shared_intermediate_size: int = 0) -> None:
        super().__init__()
        self.gate = Router(hidden_size, num_experts)
        self.experts = nn.ModuleList([MLP(hidden_size, intermediate_size, hidden_act) for _ in range(num_experts)])
        if shared_intermediate_size:
            self.shared_expert = MLP(hidden_size, shared_intermediate_size, hidden_act)
            self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False)
        else:
            self.shared_expert = None
            self.shared_expert_gate = None
        self.num_experts = num_experts
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.intermediate_size = intermediate_size
        self.act_fn = activation(hidden_act)
        self.gate_up: torch.Tensor | None = None
        self.down: torch.Tensor | None = None

    def fuse_experts(self) -> None:
        """Hold the expert weights as one ``gate_up`` and one ``down`` tensor, the per-expert
        module weights becoming views of them. Idempotent; call after loading weights."""
        if self.gate_up is not None:
            return
        with torch.inference_mode(False), torch.no_grad():
            gate_up = torch.stack([torch.cat((e.gate_proj.weight, e.up_proj.weight)) for e in self.experts])
            down = torch.stack([e.down_proj.weight for e in self.experts])
            inter = self.intermediate_size
            for index, expert in enumerate(self.experts):
                expert.gate_proj.weight.data = gate_up[index, :inter]
                expert.up_proj.weight.data = gate_up[index, inter:]
                expert.down_proj.weight.data = down[index]
        self.gate_up, self.down = gate_up, down

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Routing weights and expert ids, both ``[tokens, top_k]``, of ``x`` ``[tokens, hidden]``."""
        logits = F.linear(x, self.gate.weight)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights /= weights.sum(dim=-1, keepdim=True)
        return weights.to(logits.dtype), experts

    def experts_forward(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """The routed experts' weighted sum ``[tokens, hidden]`` for ``x`` ``[tokens, hidden]``."""
        self.fuse_experts()
        tokens, hidden = x.shape
        k = experts.shape[-1]
        pair_weights = weights.reshape(-1)
        expert_ids, order = torch.sort(experts.reshape(-1))
        rows = x[order // k]
        pair_weights = pair_weights[order]
        # rows per expert; histc on float ids (CPU histc takes no integers)
        counts = torch.histc(expert_ids.float() if x.device.type in ("cpu", "mps") else expert_ids.int(),
                             bins=self.num_experts, min=0, max=self.num_experts - 1)
        offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
        gate, up = _grouped_mm(rows, self.gate_up, offsets).chunk(2, dim=-1)
        out = _grouped_mm(self.act_fn(gate) * up, self.down, offsets)
        out = out * pair_weights.unsqueeze(-1)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.shape[0], device=order.device)
        return out[inverse].view(tokens, k, hidden).sum(dim=1).to(x.dtype)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[B, L, hidden]`` -> ``[B, L, hidden]``."""
        batch, length, size = hidden.shape
        x = hidden.view(-1, size)
        shared = None
        if self.shared_expert is not None:
            s = self.shared_expert
            shared = s.down_proj(s.act_fn(s.gate_proj(x)) * s.up_proj(x))
        weights, experts = self.route(x)
        out = self.experts_forward(x, weights, experts)
        if shared is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * shared
        return out.reshape(batch, length, size)
