"""gambit-solve's configuration: the run's settings, each method's typed parameters, and
every check that needs no model.

    from gambit_search.solve.config import SolveConfig, bind_method
    from gambit_search.methods.gambit import GambitParams

    cfg = SolveConfig(dataset="toy:test:100", n=64, params=GambitParams(capacity=16))
    bound = bind_method(cfg)        # the method, its parameters and N, checked (InputError)

``params`` holds the method's own parameters (:attr:`gambit_search.methods.Method.params`;
None: its defaults). On the command line they are flat flags (``--capacity``,
``--deepconf-window``); :func:`params_from_flat` builds them from those names.

A *preset* (``--preset paper``) is a frozen dataclass in :data:`PRESETS` whose fields are
flat names (run settings and method parameters alike), each with its value and a docstring:
:func:`with_preset` gives every setting the command line did not name the preset's value.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gambit_core.errors import InputError
from gambit_core.runio import RUN_ONLY, fingerprint
from gambit_core.sampling import SamplingConfig
from gambit_search.engines import EngineSettings

REPO = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = EngineSettings.model
"""The shipped toy policy (:attr:`EngineSettings.model`'s default)."""
DEFAULT_SCORER = str(REPO / "checkpoints" / "toy-scorer-seq-prefix" / "ckpt.pt")
"""The shipped SeqScorer trained on prefix labels (checkpoints/toy-scorer-seq-prefix/README.md):
the one the issue-29 tables measured, chosen on val."""
PROG = "gambit-solve"

SCORER_DEVICES = ("cpu", "cuda", "auto")
"""The values of ``SolveConfig.scorer_device``."""


@dataclass(frozen=True)
class PaperPreset:
    """``--preset paper``: the paper's reference settings (docs/REFERENCE.md, "The paper's
    defaults"; the reference implementation's where the paper is silent). For real
    reasoning models; on the toy world w = 12,000 makes no trace a parent."""

    n: int = 256
    """N = C = 256 completed traces per question (paper §5.1)."""
    capacity: int | None = 256
    """C = 256 logically active traces."""
    swap: int = 16
    """K = 16 traces swapped per round."""
    interval: int = 200
    """D = 200 between rounds ..."""
    interval_unit: str = "steps"
    """... counted in decode steps."""
    warmup: int = 12000
    """w = 12,000 output tokens before ranking or branching."""
    floor: float = 0.1
    """delta = 0.1 (the reference code's floor)."""
    child_temperature: float = 1.0
    """m = 1.0: children sample at the base temperature."""
    branch_point: str = "current"
    """Children fork at the parent's current tokens."""
    max_children: int = 0
    """No cap on children per parent."""
    lineage_share: float = 0.0
    """No cap on a root's lineage."""
    rule: str = "weighted"
    """The score-weighted vote over every completed trace."""
    prune_budget: float = float("inf")
    """No cap on prunes per question."""
    parents: str = "top"
    """Fork from the best-scored eligible parents."""
    drain: bool = False
    """Refill until N complete, then stop the active traces (they do not vote)."""
    revive: bool = False
    """No revival in batches (a ghost leaves when pruned; the project still revives the best
    ghost when none of a question's traces runs)."""
    temperature: float = 0.6
    """T = 0.6."""
    top_p: float = 0.95
    """top-p 0.95."""
    top_k: int = 20
    """top-k 20."""


PRESETS: dict[str, type] = {"paper": PaperPreset}
"""``--preset`` names and their settings."""


def preset_settings(name: str | None) -> dict[str, Any]:
    """The flat settings of preset ``name`` (None: none); an unknown name is an
    :class:`InputError`."""
    if name is None:
        return {}
    cls = PRESETS.get(name)
    if cls is None:
        raise InputError(f"--preset must be one of {', '.join(PRESETS)}, got {name!r}")
    return dataclasses.asdict(cls())


def with_preset(flat: dict[str, Any], given: set[str] | None = None) -> dict[str, Any]:
    """``flat`` with its ``preset``'s value for every setting not in ``given`` (the names the
    user set; None: every key of ``flat``)."""
    given = set(flat) if given is None else given
    return flat | {k: v for k, v in preset_settings(flat.get("preset")).items()
                   if k not in given}


SolveInputError = InputError
"""Bad input to gambit-solve (the project's one :class:`~gambit_core.errors.InputError`)."""


@dataclass(kw_only=True)
class SolveConfig(SamplingConfig, EngineSettings):
    """One gambit-solve run (the sampling fields: :class:`gambit_core.sampling.SamplingConfig`;
    the engine's: :class:`gambit_search.engines.EngineSettings`; the method's own:
    ``params``)."""

    dataset: str | None = None
    """Questions: a JSONL path, a local HF dataset, or toy:<split>[:count] (instead of a
    question on the command line)."""
    scorer: str = DEFAULT_SCORER
    """Scorer checkpoint (gambit-train's ckpt.pt or a reference STEP/Gambit .pt); "none" for
    methods that need none."""
    method: str = "gambit"
    """Search method: gambit, sc, bon, step, deepconf-low, deepconf-high or slim-sc
    (comma-separated: several, one after another on one engine)."""
    n: int = 64
    """Budget: completed traces per question that vote, for every method (prune-only methods
    start n and vote on those that complete)."""
    max_questions: int | None = None
    """Use only the first N questions of the dataset."""
    admit_on_live: bool = True
    """Admit a question while the traces live in the engine, plus its slots, fit
    ``max_live`` (False: while the admitted questions' slots fit). Live admission gives a
    question's finished traces' places to the next question at once instead of holding
    them until its last trace ends. SC's traces do not depend on it; Gambit's rounds fall
    on other engine steps, so its trees differ."""
    queue: int = 0
    """Traces admitted beyond ``max_live`` to wait in vLLM's queue, so a finished or pruned
    trace's place is taken in the engine's next step, before the driver has read the step
    (0: none). SC's traces do not depend on it; Gambit's rounds fall on other steps."""
    catch_up: bool = False
    """Let each engine step also take every output vLLM's engine core made while the driver
    was busy (the vLLM engine only): the driver's decisions lag the engine by at most one of
    its steps, however slow the driver. SC's traces do not depend on it; Gambit's rounds
    fall on other steps."""
    score_every: int = 1
    """Score waiting thought boundaries in one batched forward every N engine steps (and at
    once when a trace finishes): N > 1 trades score freshness for fewer scorer forwards."""
    score_in_engine: bool = False
    """Score boundaries inside the engine (vLLM's worker), on the model's device, so only
    scores cross to the driver (not for a scorer with confidence features). The worker's
    forward then sits on the engine's critical path."""
    scorer_device: str = "cpu"
    """Where the driver runs its scorer: "cpu", "cuda", or "auto" (cuda when this process
    sees a GPU). Unused when the engine scores (``score_in_engine``). On "cuda" the driver's
    kernels share the GPU with the engine's process."""
    preset: str | None = field(default=None, metadata=RUN_ONLY)
    """Start from named settings; flags given win. "paper": the paper's reference (N = C =
    256, K = 16, D = 200 steps, w = 12,000, floor 0.1, --branch-point current, --no-drain,
    --no-revive, T = 0.6, top-p 0.95, top-k 20)."""
    out: str | None = field(default=None, metadata=RUN_ONLY)
    """Output directory (needed with --dataset; optional for one question)."""
    rule: str | None = field(default=None, metadata=RUN_ONLY)
    """Vote rule of the reported answer: weighted, plain, top1 or lineage (weighted, one vote
    per root lineage: Gambit's default, +2 points from N = 64 on toy val) (default: the
    method's)."""
    rescore: str | None = field(default=None, metadata=RUN_ONLY)
    """Re-vote a finished run directory with --rule (no model is loaded)."""
    params: Any = field(default=None, metadata=RUN_ONLY)
    """The method's parameters (an instance of its ``Method.params``; None: the defaults).
    Part of the fingerprint through :func:`run_fingerprint`."""


def setting_names(cls: type) -> set[str]:
    """The fields of config class ``cls`` a user sets (flags, ``--set``, a config file, a
    request): all but those the application sets itself (``"flag": False``, e.g.
    :class:`EngineSettings`' ``confidence``)."""
    return {f.name for f in dataclasses.fields(cls) if f.metadata.get("flag") is not False}


def flat_name(prefix: str, name: str) -> str:
    """The flat key of a method parameter: its flag without dashes ("deepconf_window").
    The one rule for every way a parameter is named: the flag ``--deepconf-window``,
    gambit-bench's ``--set deepconf-low.deepconf-window=8`` and gambit-serve's
    ``"gambit": {"deepconf_window": 8}`` all name this key."""
    return prefix.replace("-", "_") + name


def flat_names(method: Any) -> set[str]:
    """The flat keys of ``method``'s own parameters ({"capacity", "swap", ...})."""
    return {flat_name(method.flag_prefix, f.name) for f in dataclasses.fields(method.params)}


def params_from_flat(method: Any, flat: dict[str, Any]) -> Any:
    """``method``'s parameters from flat keys (``{"capacity": 16, "deepconf_window": 8}``):
    the keys of other methods are ignored, missing ones keep their defaults."""
    kw = {f.name: flat[flat_name(method.flag_prefix, f.name)]
          for f in dataclasses.fields(method.params)
          if flat_name(method.flag_prefix, f.name) in flat}
    return method.params(**kw)


def flat_params(method: Any, params: Any) -> dict[str, Any]:
    """The inverse of :func:`params_from_flat`, for fingerprints and summaries."""
    return {flat_name(method.flag_prefix, k): v for k, v in dataclasses.asdict(params).items()}


def bind_method(cfg: SolveConfig) -> Any:
    """``cfg.method`` bound to ``cfg.params`` and ``cfg.n``, checked (:class:`InputError`)."""
    from gambit_search.methods import get_method

    return get_method(cfg.method).bind(cfg.params, cfg.n)


def run_fingerprint(cfg: SolveConfig, bound: Any, ident: dict) -> dict:
    """What must match to resume into an output directory: the run's settings, the method's
    parameters and the model's identity."""
    return fingerprint(cfg) | flat_params(bound.method, bound.params) | ident


def check_config(cfg: SolveConfig, question: str | None) -> Any:
    """Everything that can be refused without a model; returns the bound method (None for
    --rescore). Raises :class:`InputError`."""
    from gambit_search.engines import get_engine_kind
    from gambit_search.voting import RULES


    if cfg.rescore is not None:
        return None
    bound = bind_method(cfg)
    if (question is None) == (cfg.dataset is None):
        raise InputError("give one question as text, or --dataset (not both)")
    if question is not None and not question.strip():
        raise InputError("the question is empty")
    if cfg.rule is not None and cfg.rule not in RULES:
        raise InputError(f"--rule must be one of {', '.join(RULES)}, got {cfg.rule!r}")
    kind = get_engine_kind(cfg.engine)
    if cfg.catch_up and not kind.catches_up:
        raise InputError(f"--catch-up needs the vllm engine, not {cfg.engine!r}")
    if cfg.queue < 0:
        raise InputError(f"--queue must be >= 0, got {cfg.queue}")
    if cfg.score_every < 1:
        raise InputError(f"--score-every must be >= 1, got {cfg.score_every}")
    if cfg.scorer_device not in SCORER_DEVICES:
        raise InputError(f"--scorer-device must be one of {', '.join(SCORER_DEVICES)}, "
                         f"got {cfg.scorer_device!r}")
    cfg.check_sampling()
    m = bound.method
    if m.needs_scorer and (not cfg.scorer or cfg.scorer == "none"):
        raise InputError(f"method {m.name!r} needs a scorer: pass --scorer ckpt.pt")
    return bound


def make_config(**flat: Any) -> SolveConfig:
    """A :class:`SolveConfig` from flat names, as the command line gives them: the run's
    fields, and the method's parameters by their flag names (``swap=2``,
    ``deepconf_window=8``); ``preset="paper"`` fills the names not given. A name that is neither a field nor any method's parameter is an
    :class:`InputError`; another method's parameters are ignored, as on the command line."""
    from gambit_search.methods import get_method, param_classes

    own = setting_names(SolveConfig) - {"params"}
    known = {flat_name(prefix, f.name) for cls, prefix in param_classes().items()
             for f in dataclasses.fields(cls)}
    bad = sorted(set(flat) - own - known)
    if bad:
        raise InputError(f"unknown gambit-solve settings {bad}")
    flat = with_preset(flat)
    cfg = SolveConfig(**{k: v for k, v in flat.items() if k in own})
    if "," in cfg.method:
        return cfg
    return dataclasses.replace(cfg, params=params_from_flat(get_method(cfg.method), flat))
