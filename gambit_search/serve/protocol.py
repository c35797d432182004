"""gambit-serve's wire format: OpenAI-compatible request and response bodies (pydantic), and
the ``gambit`` extension that picks the search method per request.

    {"model": "gambit", "messages": [{"role": "user", "content": "Start 3. Ops: +1. Mod 100."}],
     "max_tokens": 400, "gambit": {"method": "gambit", "n": 64, "capacity": 32}}

With the ``openai`` client the extension goes in ``extra_body={"gambit": {...}}``. Unknown
keys in ``gambit`` are refused (400), so a typo does not silently run the defaults.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class GambitOptions(BaseModel):
    """The search for one request: the method, its budget and its own parameters by their
    ``gambit-solve`` flag names without dashes (``capacity``, ``swap``, ``deepconf_window``)."""

    model_config = ConfigDict(extra="allow")

    method: str | None = None
    """Search method (default: the server's ``--method``)."""
    n: int | None = None
    """Budget: completed traces that vote (default: the server's ``--n``)."""
    rule: str | None = None
    """Vote rule of the answer: weighted, plain, top1 or lineage (default: the method's)."""

    def params(self) -> dict[str, Any]:
        """The method parameters given (the extra keys)."""
        return dict(self.model_extra or {})


class ChatMessage(BaseModel):
    role: str
    content: str


class _Common(BaseModel):
    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stream: bool = False
    gambit: GambitOptions = Field(default_factory=GambitOptions)


class ChatRequest(_Common):
    """``POST /v1/chat/completions``: the question is the last user message."""

    messages: list[ChatMessage]


class CompletionRequest(_Common):
    """``POST /v1/completions``: the question is the prompt (a string)."""

    prompt: str


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    """Unique tokens generated for the whole search (a fork's inherited prefix counts once)."""
    total_tokens: int
    traces_completed: int
    """Completed traces: the votes."""


def new_id(kind: Literal["chatcmpl", "cmpl"]) -> str:
    return f"{kind}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def error_body(message: str, *, type_: str = "invalid_request_error", param: str | None = None,
               code: int = 400) -> dict:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
