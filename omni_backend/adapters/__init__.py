"""One adapter per model type: the only place that knows a model's request fields."""
from omni_backend.adapters.base import TTSAdapter, adapter_class, register_adapter

__all__ = ["TTSAdapter", "adapter_class", "register_adapter"]
