"""Compare probe read-outs of one toy policy (aggregation x regularisation), HF sampling.

    python scripts/probe_variants.py MODEL_DIR OUT.json
"""
import itertools
import json
import sys

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from data_pipelines.toy.evaluate import HFSampler, auroc, boundary_states, within_question_auroc
from data_pipelines.toy.task import draw_questions
from gambit_core.grading import extract_boxed
from gambit_core.prompts import build_prompt

model, out = sys.argv[1], sys.argv[2]
s = HFSampler(model)
tok = s.tok


def rollouts(split, nq, n, seed):
    qs = draw_questions(split, nq, 0)
    P = [[tok.bos_token_id] + tok.encode(build_prompt(q.text, tok), add_special_tokens=False) for q in qs]
    outs = s.sample(P, n, 1.0, seed, 400)
    seqs, plens, ys, qid = [], [], [], []
    for qi, (q, p, o) in enumerate(zip(qs, P, outs, strict=True)):
        for ids, _ in o:
            a = extract_boxed(tok.decode(ids, skip_special_tokens=True))
            seqs.append(p + ids)
            plens.append(len(p))
            ys.append(a is not None and a.isdigit() and int(a) == q.answer)
            qid.append(qi)
    st = [h for h, _ in boundary_states(s.model, tok, seqs, plens)]
    return st, np.array(ys), np.array(qid)


tr, ytr, _ = rollouts("train", 400, 16, 1)
te, yte, qte = rollouts("test", 200, 32, 2)
res = {}
for C, scale, train_on in itertools.product([0.01, 0.1, 1.0], [True, False], ["all", "last"]):
    if train_on == "all":
        X = np.concatenate([h for h in tr if len(h)])
        Y = np.concatenate([[y] * len(h) for h, y in zip(tr, ytr, strict=True) if len(h)])
    else:
        X = np.stack([h[-1] for h in tr if len(h)])
        Y = np.array([y for h, y in zip(tr, ytr, strict=True) if len(h)])
    lr = LogisticRegression(C=C, max_iter=3000)
    pr = make_pipeline(StandardScaler(), lr) if scale else lr
    pr.fit(X, Y)
    step = [pr.predict_proba(h)[:, 1] if len(h) else np.zeros(1) for h in te]
    for agg, f in {"mean": np.mean, "min": np.min, "last": lambda v: v[-1], "mean_last3": lambda v: np.mean(v[-3:])}.items():
        sc = np.array([f(v) for v in step])
        groups = [(list(yte[qte == q].astype(int)), list(sc[qte == q])) for q in np.unique(qte)]
        wq, n = within_question_auroc(groups)
        res[f"C={C} scale={scale} train={train_on} agg={agg}"] = (round(auroc(yte, sc), 4), round(wq, 4))
        print(f"C={C} scale={scale} train={train_on} agg={agg}", res[f"C={C} scale={scale} train={train_on} agg={agg}"], flush=True)
json.dump({"test_acc": float(yte.mean()), "results": res}, open(out, "w"), indent=1)
