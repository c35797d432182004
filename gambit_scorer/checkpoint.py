"""Scorer checkpoints: save ``ckpt.pt``, and one loader for the search runtime.

No Lightning or Hydra here (the search runtime imports this); only torch and numpy.

Format (a ``torch.save`` dict, loadable with ``torch.load(weights_only=True)``)::

    {
      "model_state_dict": {...},            # reference module names (models.py)
      "model_config": {...},                # reference keys: {"arch": "mlp", ...} or
                                            #   {"type": "sequence_transformer", "d_model", "nhead",
                                            #    "num_layers", "dim_feedforward", "max_len", "rope_base", ...}
      "gambit": {                           # ours; absent in reference checkpoints
        "format": "gambit-scorer", "format_version": 1,
        "arch": "mlp" | "seq", "input_size": int, "hidden_size": int,
        "features": ["hidden"] | ["hidden", "conf_mean", "conf_min"],
        "conf_norm": {"mean": [..], "std": [..]} | None,
        "policy_model": str, "policy_model_hash": str, "boundary_token_ids": [int],
        "loss_position": "last" | "every" | None, "metrics": {...}, "train_config": str (YAML),
        "versions": {...}, "created": str,
      },
    }

:func:`load_scorer` also reads reference STEP/Gambit ``.pt`` files (MLP and sequence
scorer); those take the hidden state only. The network is rebuilt from the weights'
shapes, cross-checked against ``model_config``.

Everything that differs between kinds (which network, how it is rebuilt, the per-trace
history, how a trace is scored) is the kind's (``kinds.py``): ``LoadedScorer.scorer_kind``.

Runtime API (:class:`LoadedScorer`)::

    s = load_scorer("ckpt.pt", expected_hidden_size=model_hidden_size,
                    expected_boundary_token_ids=engine_boundary_ids)
    s.features                      # what to feed per step
    h = s.init_history()            # per trace; immutable, so a branch may share its parent's
    h, score = s.append(h, hidden_state, conf_mean=..., conf_min=...)   # score = trace score
    s.score_steps(states)           # MLP only: per-step probabilities [n]
    s.score_trace(states)           # trace score after each step [n] (both kinds)
    hs, scores = s.append_many(histories, states)   # one new step for N traces, one forward
"""

from __future__ import annotations

import datetime as _dt
import platform
import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from gambit_core.errors import InputError
from gambit_scorer.kind_mlp import MLPHistory
from gambit_scorer.kind_seq import SeqHistory
from gambit_scorer.kinds import detect_kind, get_kind, kind_names, kind_of_model
from gambit_scorer.models import _tensor, feature_size, resolve_features, step_features
from gambit_scorer.scorer_kind import ArchitectureError, ScorerKind, int_or_none

FORMAT = "gambit-scorer"
FORMAT_VERSION = 1


def _one_line(text: str) -> str:
    """``text`` on one line: line breaks (and the whitespace around them) and ANSI colour codes removed."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(text))
    return re.sub(r"\s*[\r\n]+\s*", " ", text).strip()


class ScorerLoadError(InputError):
    """A scorer checkpoint cannot be used (the message says why and what to do).

    The message is always one line (line breaks in it are replaced by spaces)."""

    def __init__(self, message: str):
        super().__init__(_one_line(message))


class HiddenSizeMismatchError(ScorerLoadError):
    """The scorer was trained on another policy model's hidden size."""


class BoundaryTokenMismatchError(ScorerLoadError):
    """The scorer was trained on hidden states at another tokenizer's boundary tokens."""


# ----------------------------------------------------------------------------- saving


def _plain(x: Any) -> Any:
    """Convert to types torch.load(weights_only=True) accepts (dict/list/str/int/float/bool/None/Tensor)."""
    if isinstance(x, Tensor):
        return x.detach().cpu()
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x)
    if isinstance(x, np.ndarray):
        return _plain(x.tolist())
    if x is None:
        return None
    return str(
        x
    )  # also str subclasses (torch's TorchVersion, numpy str_): plain str for weights_only


def build_checkpoint(
    model: nn.Module,
    *,
    features: Sequence[str],
    hidden_size: int,
    conf_norm: dict | None = None,
    policy_model: str | None = None,
    policy_model_hash: str | None = None,
    boundary_token_ids: Sequence[int] | None = None,
    loss_position: str | None = None,
    metrics: dict | None = None,
    train_config: str | None = None,
    versions: dict | None = None,
    extra: dict | None = None,
) -> dict:
    """The checkpoint dict for ``model`` (a StepMLP or SeqScorer: a registered kind's network)."""
    arch = kind_of_model(model).name
    feats = resolve_features(list(features))
    if model.input_size != feature_size(feats, hidden_size):
        raise ValueError(
            f"model input {model.input_size} != features {list(feats)} at hidden size {hidden_size}"
        )
    vers = {
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }
    try:
        from importlib.metadata import version

        vers["gambit"] = version("gambit")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        pass
    vers.update(versions or {})
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "arch": arch,
        "input_size": model.input_size,
        "hidden_size": int(hidden_size),
        "features": list(feats),
        "conf_norm": conf_norm,
        "policy_model": policy_model,
        "policy_model_hash": policy_model_hash,
        "boundary_token_ids": list(boundary_token_ids) if boundary_token_ids is not None else None,
        "loss_position": loss_position,
        "metrics": metrics or {},
        "train_config": train_config,
        "versions": vers,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        **(extra or {}),
    }
    return {
        "model_state_dict": {
            k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()
        },
        "model_config": _plain(model.model_config()),
        "gambit": _plain(meta),
    }


def save_checkpoint(path: str | Path, model: nn.Module, **kwargs) -> dict:
    """Write ``build_checkpoint(model, **kwargs)`` to ``path``; returns the dict."""
    ckpt = build_checkpoint(model, **kwargs)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ckpt, path)
    return ckpt


# ----------------------------------------------------------------------------- loading


History = MLPHistory | SeqHistory
"""A trace's run-time state (``kinds.py``): immutable, so a branch may share its parent's."""


@dataclass
class LoadedScorer:
    """A scorer ready for the search runtime (eval mode, no gradients)."""

    model: nn.Module
    kind: str
    """The kind's name ('mlp': step scores, trace score = running mean; 'seq': trace score =
    last position); :attr:`scorer_kind` is the kind itself."""
    features: tuple[str, ...]
    """Per-step features, in order; 'hidden' and optionally 'conf_mean', 'conf_min'."""
    hidden_size: int
    input_size: int
    conf_norm: dict | None = None
    meta: dict = field(default_factory=dict)
    model_config: dict = field(default_factory=dict)
    source: str = ""
    is_reference: bool = False
    """True for a reference STEP/Gambit checkpoint (no ``gambit`` metadata)."""
    scorer_kind: ScorerKind = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.scorer_kind = get_kind(self.kind)

    @property
    def needs_confidence(self) -> bool:
        return any(f != "hidden" for f in self.features)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def to(self, device: str | torch.device) -> LoadedScorer:
        """This scorer on ``device`` (itself when already there; the model moves in place)."""
        if torch.device(device) != self.device:
            self.model.to(device)
        return self

    def make_features(self, hidden, conf_mean=None, conf_min=None) -> Tensor:
        """Per-step inputs [..., input_size] exactly as in training."""
        h = _tensor(hidden)
        if h.shape[-1] != self.hidden_size:
            raise HiddenSizeMismatchError(
                f"scorer {self.source} takes hidden states of size {self.hidden_size}, got {h.shape[-1]}"
            )
        x = step_features(h, conf_mean, conf_min, features=self.features, conf_norm=self.conf_norm)
        return x.to(self.device)

    @torch.inference_mode()
    def score_steps(self, hidden, conf_mean=None, conf_min=None) -> np.ndarray:
        """MLP: per-step probabilities sigmoid(scorer(x)) for states [n, d] (or [d]) -> [n] (or scalar array).
        TypeError for a sequence scorer."""
        x = self.make_features(hidden, conf_mean, conf_min)
        return self.scorer_kind.score_steps(self.model, x)

    @torch.inference_mode()
    def score_trace(self, hidden, conf_mean=None, conf_min=None) -> np.ndarray:
        """The trace score after each step of one trace (states [n, d]) -> [n]."""
        x = self.make_features(hidden, conf_mean, conf_min)
        if x.dim() != 2:
            raise ValueError(
                f"score_trace takes one trace's steps [n, d], got shape {tuple(x.shape)}"
            )
        return self.scorer_kind.score_trace(self.model, x)

    def init_history(self) -> History:
        """The empty history of a new trace."""
        return self.scorer_kind.new_state()

    def copy_history(self, history: History) -> History:
        """A branch's copy of its parent's history. Histories are immutable values
        (``append`` returns a new one and never changes its argument), so this is the same object."""
        return self.scorer_kind.fork(history)

    @torch.inference_mode()
    def append(
        self, history: History, hidden, conf_mean=None, conf_min=None
    ) -> tuple[History, float]:
        """Add one step ([d]; or several, [k, d]) to a trace's history -> (new history, trace score)."""
        x = self.make_features(hidden, conf_mean, conf_min)
        if x.dim() == 1:
            x = x.unsqueeze(0)
        return self.scorer_kind.append(self.model, history, x)

    @torch.inference_mode()
    def append_many(self, histories: Sequence[History], hidden, conf_mean=None, conf_min=None):
        """One new step for each of N traces, in one forward: states [N, d] -> (new histories,
        trace scores [N])."""
        x = self.make_features(hidden, conf_mean, conf_min)
        return self.scorer_kind.step(self.model, list(histories), x)


_IGNORED_KEY = re.compile(r"(^|\.)(inv_freq|cos_cached|sin_cached|rotary_emb\.[^.]+)$")


def _state_dict_of(obj: Any, source: str) -> tuple[dict[str, Tensor], dict, dict]:
    if not isinstance(obj, dict):
        raise ScorerLoadError(
            f"{source}: holds a {type(obj).__name__}, not a checkpoint dict "
            "(expected {'model_state_dict': ..., 'model_config': ...})"
        )
    if "model_state_dict" in obj:
        sd = obj["model_state_dict"]
    elif "state_dict" in obj:
        sd = obj["state_dict"]
    elif obj and all(isinstance(v, Tensor) for v in obj.values()):
        sd = obj  # a bare state dict
    else:
        raise ScorerLoadError(
            f"{source}: no 'model_state_dict' in the checkpoint (keys: {sorted(map(str, obj))[:10]})"
        )
    if not isinstance(sd, dict):
        raise ScorerLoadError(
            f"{source}: the checkpoint's state dict is a {type(sd).__name__}, expected a dict of tensors"
        )
    bad = next(((k, v) for k, v in sd.items() if not (isinstance(k, str) and isinstance(v, Tensor))), None)
    if bad is not None:
        raise ScorerLoadError(
            f"{source}: the state dict entry {bad[0]!r} is a {type(bad[1]).__name__}, expected a tensor"
        )
    for key in ("model_config", "gambit"):
        if obj.get(key) is not None and not isinstance(obj[key], dict):
            raise ScorerLoadError(
                f"{source}: the checkpoint's {key!r} is a {type(obj[key]).__name__}, expected a dict"
            )
    sd = {k: v for k, v in sd.items() if not _IGNORED_KEY.search(k)}
    for prefix in ("module.", "_orig_mod.", "model."):  # DDP, torch.compile, Lightning wrappers
        if sd and all(k.startswith(prefix) for k in sd):
            sd = {k[len(prefix) :]: v for k, v in sd.items()}
    if sd and all(re.fullmatch(r"\d+\.(weight|bias)", k) for k in sd):  # a bare nn.Sequential MLP
        sd = {f"net.{k}": v for k, v in sd.items()}
    return sd, dict(obj.get("model_config") or {}), dict(obj.get("gambit") or {})


def scorer_from_checkpoint(
    obj: Any,
    *,
    expected_hidden_size: int | None = None,
    expected_boundary_token_ids: Iterable[int] | None = None,
    source: str = "<checkpoint>",
    device: str | torch.device = "cpu",
) -> LoadedScorer:
    """Build a LoadedScorer from a checkpoint dict (ours or a reference one).

    ``expected_hidden_size`` / ``expected_boundary_token_ids``: see :func:`load_scorer`."""
    sd, mc, meta = _state_dict_of(obj, source)
    kind = get_kind(meta["arch"]) if meta.get("arch") in kind_names() else detect_kind(sd, mc)
    if kind is None:
        raise ScorerLoadError(
            f"{source}: unknown scorer architecture (model_config={mc}, keys {sorted(sd)[:6]}...): "
            "expected a STEP MLP (net.*) or a sequence scorer (input_proj.*, layers.*)"
        )
    try:
        model = kind.from_state_dict(sd, mc)
    except ArchitectureError as e:
        raise ScorerLoadError(f"{source}: {e}") from e
    try:
        model.load_state_dict(sd, strict=True)
    except RuntimeError as e:
        detail = _one_line(e)
        if len(detail) > 500:
            detail = detail[:500] + " ..."
        raise ScorerLoadError(
            f"{source}: weights do not fit the {kind.name} scorer they describe: {detail}"
        ) from e
    model.eval().requires_grad_(False).to(device)

    features = resolve_features(meta.get("features") or ["hidden"])
    n_extra = feature_size(features, 0)
    hidden_size = int(meta.get("hidden_size") or model.input_size - n_extra)
    if feature_size(features, hidden_size) != model.input_size:
        raise ScorerLoadError(
            f"{source}: input size {model.input_size} does not match features {list(features)} "
            f"at hidden size {hidden_size}"
        )
    if expected_hidden_size is not None and int(expected_hidden_size) != hidden_size:
        trained_on = meta.get("policy_model") or "an unrecorded policy model"
        raise HiddenSizeMismatchError(
            f"scorer {source} was trained on hidden states of size {hidden_size} ({trained_on}), "
            f"but the policy model has hidden size {expected_hidden_size}: use a scorer trained on a "
            "harvest of this policy model (gambit-train data.harvest=<its harvest>)"
        )
    recorded = meta.get("boundary_token_ids")
    if expected_boundary_token_ids is not None and recorded is not None:
        want = sorted({int(t) for t in expected_boundary_token_ids})
        if not isinstance(recorded, list) or not all(int_or_none(t) is not None for t in recorded):
            raise ScorerLoadError(
                f"{source}: the checkpoint's gambit.boundary_token_ids is {recorded!r}, expected a list of ints"
            )
        have = sorted({int(t) for t in recorded})
        if want != have:
            trained_on = meta.get("policy_model") or "an unrecorded policy model"
            raise BoundaryTokenMismatchError(
                f"scorer {source} was trained on hidden states at boundary token ids {have} "
                f"({trained_on}), but the policy's tokenizer has boundary token ids {want}: the "
                "scorer was trained on another tokenizer's boundaries; use a scorer trained on a "
                "harvest of this policy model (gambit-train data.harvest=<its harvest>)"
            )
    conf_norm = meta.get("conf_norm")
    if n_extra and conf_norm is None:
        raise ScorerLoadError(
            f"{source}: features {list(features)} need 'conf_norm' in the checkpoint metadata"
        )
    return LoadedScorer(
        model=model,
        kind=kind.name,
        features=features,
        hidden_size=hidden_size,
        input_size=model.input_size,
        conf_norm=conf_norm,
        meta=meta,
        model_config=mc,
        source=source,
        is_reference=not meta,
    )


def _first_line(e: BaseException, limit: int = 200) -> str:
    """The informative first sentence of a torch.load error (its type when it has no text)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    # weights_only failures open with paragraphs of advice; the cause follows this marker
    m = re.search(r"WeightsUnpickler error:\s*(\S[^\n]*)", text)
    line = m.group(1) if m else next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    line = re.split(r"(?<=\.)\s", line, maxsplit=1)[0]
    if len(line) > limit:
        line = line[:limit] + " ..."
    return f"{type(e).__name__}: {line}" if line else type(e).__name__


def _unreadable(path: Path, e: BaseException) -> str:
    """One line saying why ``path`` is not a loadable checkpoint."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as oe:  # e.g. no permission to read it
        return f"{path}: cannot be read ({oe.strerror or type(oe).__name__})"
    if not head:
        return f"{path}: the file is empty (0 bytes), not a scorer checkpoint"
    is_zip = head == b"PK\x03\x04"  # torch.save's format
    if not is_zip and head[:1] != b"\x80":  # a pickle (protocol 2+, torch's legacy format) opens with PROTO
        what = "not a torch checkpoint (neither torch.save's zip format nor a pickle)"
    elif "Unsupported global" in str(e):
        what = ("holds objects other than tensors and plain containers, which "
                "torch.load(weights_only=True) refuses to unpickle")
    elif is_zip:
        what = "a damaged torch checkpoint (the zip archive is truncated or corrupted; save or copy it again)"
    else:
        what = "a damaged pickle, or one torch.load(weights_only=True) cannot read"
    return f"{path}: {what} ({_first_line(e)})"


def load_scorer(
    path: str | Path,
    *,
    expected_hidden_size: int | None = None,
    expected_boundary_token_ids: Iterable[int] | None = None,
    device: str | torch.device = "cpu",
) -> LoadedScorer:
    """Load a scorer checkpoint (``ckpt.pt`` from gambit-train, or a reference STEP/Gambit ``.pt``).

    ``expected_hidden_size``: the policy model's hidden size; a mismatch raises
    :class:`HiddenSizeMismatchError` here rather than a shape error mid-search.
    ``expected_boundary_token_ids``: the ids of the policy tokenizer's boundary tokens (the
    engine's ``boundary_ids``); when the checkpoint records other ones (compared as sets),
    :class:`BoundaryTokenMismatchError`. Reference checkpoints record none and are accepted.

    Every failure is a :class:`ScorerLoadError` with a one-line message naming the file.
    """
    path = Path(path)
    if path.is_dir():
        raise ScorerLoadError(f"scorer checkpoint {str(path)!r} is a directory; pass its ckpt.pt")
    if not path.is_file():
        raise ScorerLoadError(f"scorer checkpoint {str(path)!r} does not exist")
    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": the error says it all
            warnings.simplefilter("ignore", UserWarning)
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - report any unpickling failure the same way
        raise ScorerLoadError(_unreadable(path, e)) from e
    return scorer_from_checkpoint(
        obj,
        expected_hidden_size=expected_hidden_size,
        expected_boundary_token_ids=expected_boundary_token_ids,
        source=str(path),
        device=device,
    )
