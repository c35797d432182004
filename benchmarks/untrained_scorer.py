"""An untrained scorer of the shipped SeqScorer's shape for another policy model: for
measuring the search's own cost on a model no scorer was trained for (SmolLM2 here).

Its scores are those of a randomly initialised network (seeded), so a search run with it
measures speed and overhead, never accuracy. The architecture is the shipped toy scorer's
(``checkpoints/toy-scorer-seq``) with the input widened to the model's hidden size; the
checkpoint carries the model's boundary token ids, as a trained one would.

    python benchmarks/untrained_scorer.py --model /tmp/smol --out /tmp/smol-scorer.pt
"""

from __future__ import annotations

import argparse
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_LIKE = REPO / "checkpoints" / "toy-scorer-seq" / "ckpt.pt"


def make_untrained_scorer(model: str, out: str, like: str = str(DEFAULT_LIKE),
                          seed: int = 0) -> str:
    """Write an untrained scorer for ``model`` to ``out`` (the architecture of ``like``, the
    input widened to the model's hidden size); returns a one-line description."""
    import torch

    from gambit_scorer.checkpoint import save_checkpoint
    from gambit_scorer.kinds import build_model
    from gambit_search.engines import get_engine_kind

    facts = get_engine_kind("vllm").facts(model)
    ref = torch.load(like, map_location="cpu", weights_only=False)
    cfg = {k: v for k, v in ref["model_config"].items() if k not in ("type", "input_dim", "input_size")}
    torch.manual_seed(seed)
    net = build_model(ref["gambit"]["arch"], facts.hidden_size, **cfg)
    save_checkpoint(out, net, features=["hidden"], hidden_size=facts.hidden_size,
                    policy_model=model, boundary_token_ids=facts.boundary_ids,
                    extra={"untrained": True})
    return (f"{out}: untrained {ref['gambit']['arch']} scorer, hidden {facts.hidden_size}, "
            f"boundaries {facts.boundary_ids}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="policy model directory")
    p.add_argument("--out", required=True, help="checkpoint path to write")
    p.add_argument("--like", default=str(DEFAULT_LIKE),
                   help="checkpoint whose architecture to copy")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    print(make_untrained_scorer(a.model, a.out, a.like, a.seed))


if __name__ == "__main__":
    main()
