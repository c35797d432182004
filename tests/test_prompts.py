"""Tests for gambit_core.prompts with a tiny in-test tokenizer (no downloads)."""

from __future__ import annotations

import pytest

from gambit_core.prompts import SYSTEM_PROMPT, build_prompt, build_prompt_ids

QUESTION = "what is 2 + 3 ?"

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
NO_SYSTEM_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _tiny_tokenizer(bos: bool = True):
    pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<unk>", "<s>", "</s>", "what", "is", "2", "+", "3", "?", "<|user|>", "<|assistant|>"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    kwargs = {"bos_token": "<s>", "eos_token": "</s>"} if bos else {"eos_token": "</s>"}
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", **kwargs)


def test_plain_prompt_without_tokenizer() -> None:
    assert build_prompt(QUESTION) == QUESTION + "\n"
    assert build_prompt(QUESTION, None, system_prompt=None) == QUESTION + "\n"


def test_plain_prompt_without_chat_template() -> None:
    tok = _tiny_tokenizer()
    assert not getattr(tok, "chat_template", None)
    assert build_prompt(QUESTION, tok) == QUESTION + "\n"
    ids = build_prompt_ids(QUESTION, tok)
    assert ids[0] == tok.bos_token_id
    assert ids[1:] == tok.encode(QUESTION + "\n", add_special_tokens=False)
    assert ids.count(tok.bos_token_id) == 1


def test_plain_prompt_ids_without_bos() -> None:
    tok = _tiny_tokenizer(bos=False)
    assert tok.bos_token_id is None
    assert build_prompt_ids(QUESTION, tok) == tok.encode(QUESTION + "\n", add_special_tokens=False)


def test_chat_template_prompt() -> None:
    tok = _tiny_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    text = build_prompt(QUESTION, tok)
    assert text == f"<|system|>{SYSTEM_PROMPT}\n<|user|>{QUESTION}\n<|assistant|>"
    assert build_prompt(QUESTION, tok, system_prompt=None) == f"<|user|>{QUESTION}\n<|assistant|>"
    ids = build_prompt_ids(QUESTION, tok)
    assert ids == tok.encode(text, add_special_tokens=False)
    assert tok.bos_token_id not in ids


def test_chat_template_without_system_role() -> None:
    tok = _tiny_tokenizer()
    tok.chat_template = NO_SYSTEM_TEMPLATE
    text = build_prompt(QUESTION, tok)
    assert text == f"<|user|>{SYSTEM_PROMPT}\n\n{QUESTION}\n<|assistant|>"
    assert "<|system|>" not in text
