"""fairgate: an OpenAI-compatible LLM gateway that shares upstream quota fairly."""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
