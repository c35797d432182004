"""The engine registry: ``vllm`` (the adapter over stock vLLM) and ``fake`` (the scripted
engine of tests and dry runs), behind one small interface.

    from gambit_search.engines import EngineSettings, get_engine_kind

    kind = get_engine_kind("vllm")
    facts = kind.facts(model)                      # hidden size, tokenizer, boundary ids, hash
    engine = kind.start(EngineSettings(model=model, max_live=64, kv_cache=0.02))
    prompt = kind.prompt_ids(facts.tokenizer or engine.tokenizer)   # str -> token ids
    decode = kind.decoder(engine)                  # token ids -> text

The applications (solve, bench, harvest) name an engine with ``--engine`` and know nothing
else about it. A new engine is a class here and an entry of :data:`ENGINES` (a
:class:`~gambit_core.registry.Registry`).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gambit_core.errors import InputError
from gambit_core.registry import Registry
from gambit_core.runio import RUN_ONLY

__all__ = ["ENGINES", "EngineKind", "EngineSettings", "ModelFacts", "engine_names",
           "get_engine_kind"]


DTYPES: tuple[str, ...] = ("auto", "float32", "bfloat16", "float16")
"""The ``--dtype`` values every engine kind understands (vLLM's names)."""


@dataclass(kw_only=True)
class EngineSettings:
    """What an application asks of an engine, declared and checked here once: gambit-solve,
    -serve, -bench and -harvest inherit these fields (``--engine --model --dtype
    --max-live --kv-cache``), and :meth:`engine_settings` gives the plain settings an engine
    kind starts from. The fields marked ``ask`` are not flags: the application sets them
    from what its run needs (its seed, log-probabilities, a scorer inside the engine)."""

    _ASK = {"ask": True, "flag": False, "fingerprint": False}

    engine: str = "vllm"
    """Engine: "vllm", or "fake" (the scripted engine: tests and dry runs)."""
    model: str = str(Path(__file__).resolve().parents[1] / "checkpoints" / "toy-policy")
    """Policy model directory or Hugging Face name, available offline (``fake``: ignored)."""
    max_live: int = 256
    """Most traces live in the engine at once (vLLM's max_num_seqs)."""
    kv_cache: float = 1.0
    """KV-cache size in GiB (small values create memory pressure; ``fake``: 1,024
    blocks of 4 tokens per GiB, at least one)."""
    dtype: str = "auto"
    """Model weights' dtype: auto, float32, bfloat16 or float16 ("auto": the checkpoint's
    own; the toy policy is float32). ``fake``: only "auto" and "float32"."""
    data_parallel_size: int = field(default=1, metadata=RUN_ONLY)
    """Ranks: independent engines, each on its own devices (vLLM: a GPU each, or a share of
    the CPU cores); a question's whole search runs on one (docs/SEARCH.md, "Data
    parallelism"). Results do not depend on it, so a run may resume with another."""
    seed: int = field(default=0, metadata=_ASK)
    """Engine seed (traces carry their own; the applications pass their ``--seed``)."""
    confidence: bool = field(default=False, metadata=_ASK)
    """Return the sampled tokens' log-probabilities (confidence features, DeepConf)."""
    scorer: str | None = field(default=None, metadata=_ASK)
    """A scorer checkpoint to score boundaries with inside the engine, where the states are
    (kinds with ``scores_inside``; others ignore it)."""
    extra: dict[str, Any] = field(default_factory=dict, metadata=_ASK)
    """Engine-specific overrides (``VLLMEngineConfig`` fields, e.g. ``stream_interval``)."""

    def __post_init__(self) -> None:
        kind = get_engine_kind(self.engine)  # InputError naming the known engines
        if self.max_live < 1:
            raise InputError(f"--max-live must be >= 1, got {self.max_live}")
        if self.kv_cache <= 0:
            raise InputError(f"--kv-cache must be > 0 GiB, got {self.kv_cache}")
        if self.data_parallel_size < 1:
            raise InputError(f"--data-parallel-size must be >= 1, got {self.data_parallel_size}")
        if self.dtype not in DTYPES:
            raise InputError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.dtype not in kind.dtypes:
            raise InputError(f"--engine {kind.name} runs --dtype {' or '.join(kind.dtypes)} only, "
                             f"got {self.dtype}")

    def engine_settings(self, **asks: Any) -> EngineSettings:
        """The plain settings to start an engine with: this config's own (an application's
        config inherits them; its ``scorer``, say, is the run's, not the engine's) plus
        ``asks`` (``seed``, ``confidence``, ``scorer``, ``extra``)."""
        own = {k: getattr(self, k) for k, f in EngineSettings.__dataclass_fields__.items()
               if not f.metadata.get("ask")}
        return EngineSettings(**own, **asks)


@dataclass(frozen=True)
class ModelFacts:
    """What is known of a model before its engine starts (no vLLM needed)."""

    hidden_size: int | None
    """Width of the hidden states the scorer reads (None: unknown)."""
    boundary_ids: list[int] | None
    """Token ids that end a thought on their own (a scorer's fingerprint of the rule)."""
    tokenizer: Any = None
    """The model's tokenizer (None for the fake engine)."""
    identity: dict[str, str] = field(default_factory=dict)
    """{"model_hash", "tokenizer_hash"}: pins an output directory to these weights."""


class EngineKind(ABC):
    """One kind of engine as the applications see it."""

    name: str
    reads_model: bool = True
    """Whether ``--model`` means anything to it (the fake engine scripts its own)."""
    dtypes: tuple[str, ...] = DTYPES
    """The ``--dtype`` values it runs (the rest are refused before it starts)."""
    scores_inside: bool = False
    """Whether it can score boundaries itself (``EngineSettings.scorer``)."""
    catches_up: bool = False
    """Whether its engines have a settable ``catch_up`` (take every output already waiting
    in one step: :attr:`gambit_search.vllm_config.VLLMEngineConfig.catch_up`)."""

    def identity(self, model: str) -> dict[str, str]:
        """{"model_hash", "tokenizer_hash"} of ``model``: pins an output directory to it."""
        from gambit_core.runio import model_identity

        m_hash, t_hash = model_identity(model)
        return {"model_hash": m_hash, "tokenizer_hash": t_hash}

    @abstractmethod
    def facts(self, model: str) -> ModelFacts:
        """Check ``model`` and read its facts; :class:`InputError` with one line if unusable."""

    @abstractmethod
    def start(self, s: EngineSettings) -> Any:
        """A started :class:`~gambit_search.engine.Engine`."""

    def rank_envs(self, s: EngineSettings) -> list[dict[str, str]]:
        """The environment each of ``s.data_parallel_size`` ranks' engines starts in (its
        devices); :class:`InputError` when there are too few (:func:`~gambit_search.
        data_parallel.start_ranks` starts them). Default: nothing to pin."""
        return [{} for _ in range(s.data_parallel_size)]

    @abstractmethod
    def prompt_ids(self, tokenizer: Any) -> Callable[[str], list[int]]:
        """question text -> prompt token ids."""

    @abstractmethod
    def decoder(self, engine: Any) -> Callable[[Sequence[int]], str]:
        """token ids -> text, for a started engine."""


class VLLMKind(EngineKind):
    name = "vllm"
    scores_inside = True
    catches_up = True

    def facts(self, model: str) -> ModelFacts:
        from gambit_search.boundary_vocab import boundary_token_ids
        from gambit_search.vllm_config import validate_model_path

        try:
            validate_model_path(model)
        except Exception as e:  # noqa: BLE001 - one line for the user
            raise InputError(str(e)) from None
        hidden = None
        cfg = Path(model) / "config.json"
        if cfg.is_file():
            c = json.loads(cfg.read_text())
            hidden = c.get("hidden_size") or (c.get("text_config") or {}).get("hidden_size")
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(model)
        except Exception as e:  # noqa: BLE001
            raise InputError(f"cannot load the tokenizer of {model!r}: {e}") from None
        return ModelFacts(hidden, boundary_token_ids(tok), tok, self.identity(model))

    def start(self, s: EngineSettings) -> Any:
        from gambit_search.vllm_config import VLLMEngineConfig
        from gambit_search.vllm_engine import VLLMEngine

        return VLLMEngine(VLLMEngineConfig(**({
            "model": s.model, "dtype": s.dtype, "max_num_seqs": s.max_live, "seed": s.seed,
            "kv_cache_memory_bytes": int(s.kv_cache * (1 << 30)), "detokenize": False,
            "sampled_logprobs": s.confidence, "scorer": s.scorer} | s.extra)))

    def rank_envs(self, s: EngineSettings) -> list[dict[str, str]]:
        from gambit_search._vllm_internals import on_cpu, rank_envs

        return rank_envs(s.data_parallel_size, on_cpu=on_cpu(),
                         per_rank=int(s.extra.get("tensor_parallel_size", 1)))

    def prompt_ids(self, tokenizer: Any) -> Callable[[str], list[int]]:
        from gambit_core.prompts import build_prompt_ids

        return lambda q: build_prompt_ids(q, tokenizer)

    def decoder(self, engine: Any) -> Callable[[Sequence[int]], str]:
        tok = engine.tokenizer
        return lambda ids: tok.decode(ids, skip_special_tokens=True)


FAKE_BLOCKS_PER_GIB = 1024
"""The fake engine's KV pool per GiB of ``--kv-cache``: the default 1 GiB is
``FakeEngineConfig``'s own 1,024 blocks."""


class FakeKind(EngineKind):
    name = "fake"
    reads_model = False
    dtypes = ("auto", "float32")

    def identity(self, model: str) -> dict[str, str]:
        return {"model_hash": "fake", "tokenizer_hash": "fake"}

    def facts(self, model: str) -> ModelFacts:
        from gambit_search.fake_engine import BOUNDARY, FakeEngineConfig

        return ModelFacts(FakeEngineConfig().hidden_size, [BOUNDARY], None, self.identity(model))

    def start(self, s: EngineSettings) -> Any:
        from gambit_search.fake_engine import FakeEngine, FakeEngineConfig

        blocks = max(1, round(s.kv_cache * FAKE_BLOCKS_PER_GIB))
        return FakeEngine(FakeEngineConfig(seed=s.seed, max_num_seqs=s.max_live, num_blocks=blocks))

    def prompt_ids(self, tokenizer: Any) -> Callable[[str], list[int]]:
        from gambit_search.fake_engine import FIRST_TEXT

        return lambda q: [1] + [FIRST_TEXT + (ord(c) % 50) for c in q]

    def decoder(self, engine: Any) -> Callable[[Sequence[int]], str]:
        return engine.decode


ENGINES: Registry[EngineKind] = Registry(
    lambda name, known: InputError(f"--engine must be one of {', '.join(known)}, got {name!r}"),
    entries={k.name: k for k in (VLLMKind(), FakeKind())}, what="engine")
"""Registered engine kinds by ``--engine`` name."""


def engine_names() -> list[str]:
    """Registered engine names."""
    return list(ENGINES.names())


def get_engine_kind(name: str) -> EngineKind:
    """The engine kind called ``name``; :class:`InputError` names the known ones."""
    return ENGINES.get(name)
