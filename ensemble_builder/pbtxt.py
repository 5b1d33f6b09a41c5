"""A tiny, deterministic writer for Triton's model config text format."""
from __future__ import annotations

from typing import Any

from omni_backend.pipeline import DTYPES

# Values that Triton expects unquoted (enums): every dtype a stage may declare, instance kinds.
ENUMS = {f"TYPE_{d}" for d in DTYPES} | {"KIND_CPU", "KIND_GPU"}


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, str) and v in ENUMS:
        return v
    escaped = str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def render(msg: dict[str, Any], indent: int = 0) -> str:
    """Render a dict as protobuf text: dict -> message, list of dicts -> repeated message,
    list of scalars -> [a, b]. Key order is kept, so output is deterministic."""
    pad = "  " * indent
    lines = []
    for key, value in msg.items():
        if isinstance(value, dict):
            lines.append(f"{pad}{key} {{")
            lines.append(render(value, indent + 1))
            lines.append(f"{pad}}}")
        elif isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
            lines.append(f"{pad}{key} [")
            for i, item in enumerate(value):
                lines.append(f"{pad}  {{")
                lines.append(render(item, indent + 2))
                lines.append(f"{pad}  }}{',' if i < len(value) - 1 else ''}")
            lines.append(f"{pad}]")
        elif isinstance(value, list):
            lines.append(f"{pad}{key}: [ {', '.join(_scalar(x) for x in value)} ]")
        else:
            lines.append(f"{pad}{key}: {_scalar(value)}")
    return "\n".join(l for l in lines if l != "")
