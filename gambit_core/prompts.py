"""Prompt construction for the math questions: chat template when the model has one, else plain text.

Usage::

    from gambit_core.prompts import build_prompt, build_prompt_ids

    text = build_prompt(question, tokenizer)      # chat-templated, generation prompt appended
    ids = build_prompt_ids(question, tokenizer)   # token ids, special tokens added once

* Tokenizer with a chat template: ``[system: SYSTEM_PROMPT, user: question]`` rendered with
  ``add_generation_prompt=True``. Templates that reject a system role (they raise) get the
  system text prepended to the user message instead. ``system_prompt=None`` sends no system
  text.
* No tokenizer, or one without a chat template: exactly ``question + "\\n"``. The
  self-trained toy model is trained on that plain format, so nothing else is added (the
  system prompt is not used on this path).
"""

from __future__ import annotations

from typing import Any

__all__ = ["SYSTEM_PROMPT", "build_prompt", "build_prompt_ids", "has_chat_template"]

SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."


def has_chat_template(tokenizer: Any) -> bool:
    """True when ``tokenizer`` is present and carries a chat template."""
    return tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


def build_prompt(
    question: str, tokenizer: Any = None, *, system_prompt: str | None = SYSTEM_PROMPT
) -> str:
    """Prompt text for ``question`` (see the module docstring for the two formats)."""
    if not has_chat_template(tokenizer):
        return question + "\n"
    if not system_prompt:
        return _render(tokenizer, [{"role": "user", "content": question}])
    try:
        return _render(
            tokenizer,
            [
                {"role": "system", "content": system_prompt},
                {"role": "user", "content": question},
            ],
        )
    except Exception:  # template rejects the system role (e.g. raise_exception in Jinja)
        return _render(tokenizer, [{"role": "user", "content": f"{system_prompt}\n\n{question}"}])


def build_prompt_ids(
    question: str, tokenizer: Any, *, system_prompt: str | None = SYSTEM_PROMPT
) -> list[int]:
    """Token ids of :func:`build_prompt`, with special tokens added exactly once.

    Chat-templated text already holds the template's special tokens, so it is encoded with
    ``add_special_tokens=False``. Plain text is encoded the same way and then gets the
    tokenizer's ``bos_token_id`` prepended when it has one.
    """
    text = build_prompt(question, tokenizer, system_prompt=system_prompt)
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    if has_chat_template(tokenizer):
        return ids
    bos = getattr(tokenizer, "bos_token_id", None)
    return [bos, *ids] if bos is not None else ids


def _render(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    out = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if not isinstance(out, str):  # pragma: no cover - defensive: some versions return lists
        raise TypeError(f"apply_chat_template returned {type(out).__name__}, expected str")
    return out
