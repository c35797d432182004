"""The toy policy's tokenizer: characters, plus a few words, with "\\n\\n" as one token.

Built with Hugging Face ``tokenizers`` (WordLevel over a regex pre-tokenizer, a Fuse
decoder so decoding concatenates pieces exactly) and saved as ``tokenizer.json`` through
``PreTrainedTokenizerFast``, which both transformers and vLLM load offline.

    python -m data_pipelines.toy.tokenizer OUT_DIR     # writes tokenizer.json + configs
"""

from __future__ import annotations

import sys
from pathlib import Path

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
# Multi-character pieces; "\n\n" is the thought boundary Gambit scores at.
WORDS = ["\n\n", "check", "ok", "no", "\\boxed{", "Start", "Ops", "Mod"]
CHARS = ["\n"] + [chr(c) for c in range(32, 127)]
VOCAB_SIZE = 128  # padded: the embedding is a multiple of 8 rows
BOUNDARY = "\n\n"


def vocab() -> dict[str, int]:
    toks = SPECIALS + WORDS + [c for c in CHARS if c not in WORDS]
    assert len(toks) <= VOCAB_SIZE, len(toks)
    return {t: i for i, t in enumerate(toks)}


def build_tokenizer():
    """A ``PreTrainedTokenizerFast`` for the toy world."""
    import re

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alternatives = "|".join(re.escape(w) for w in WORDS) + r"|[\s\S]"
    tok = Tokenizer(models.WordLevel(vocab(), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(alternatives), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )


def save_tokenizer(out_dir: str | Path):
    tok = build_tokenizer()
    tok.save_pretrained(str(out_dir))
    return tok


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m data_pipelines.toy.tokenizer OUT_DIR")
    save_tokenizer(sys.argv[1])
