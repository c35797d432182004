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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="policy model directory")
    p.add_argument("--out", required=True, help="checkpoint path to write")
    p.add_argument("--like", default=str(REPO / "checkpoints" / "toy-scorer-seq" / "ckpt.pt"),
                   help="checkpoint whose architecture to copy")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()

    import torch

    from gambit_scorer.checkpoint import save_checkpoint
    from gambit_scorer.kinds import build_model
    from gambit_search.engines import get_engine_kind

    facts = get_engine_kind("vllm").facts(a.model)
    like = torch.load(a.like, map_location="cpu", weights_only=False)
    cfg = {k: v for k, v in like["model_config"].items() if k not in ("type", "input_dim", "input_size")}
    torch.manual_seed(a.seed)
    model = build_model(like["gambit"]["arch"], facts.hidden_size, **cfg)
    save_checkpoint(a.out, model, features=["hidden"], hidden_size=facts.hidden_size,
                    policy_model=a.model, boundary_token_ids=facts.boundary_ids,
                    extra={"untrained": True})
    print(f"{a.out}: untrained {like['gambit']['arch']} scorer, hidden {facts.hidden_size}, "
          f"boundaries {facts.boundary_ids}")


if __name__ == "__main__":
    main()
