#!/usr/bin/python3
"""Check that transformers exported from PyTorch in training mode train in
cleave as in PyTorch, under every strategy.

The models (lm_models.py): a GPT-2-style decoder (token and position
embeddings, split qkv, causal mask, tied LM head, logits [B, T, V]), a
BERT-style encoder with an attention-mask input and masked-language-model
labels, nn.TransformerEncoderLayer (batch_first, dropout 0) tagging every
position, and torchvision's VisionTransformer (its class token is an index
pick) over [B, 10].

For each: build it from a fixed seed, export it for training at its opset,
train STEPS steps in float64 in PyTorch (the reference: batches i*B mod N,
torch's cross_entropy over the positions with ignore_index -100, which the
GPT's and BERT's labels use; SGD for the encoder and the ViT, and for the
GPT and BERT AdamW with --no-decay on biases and LayerNorms, the gradient
clipped at a norm some steps exceed, and a cosine schedule after a warmup
(Recipe)), then compile and train it in cleave under
single, dp 2, pipeline 2 (1F1B, 2 micro-batches) and hybrid 2x2 (and the
encoder with --accumulate 2 of half batches under single, dp 2 and
pipeline 2, which must train as the whole batch does), and check
every step's loss (rtol 1e-4) and every saved initializer (rtol 1e-3): the
mean over the counted labels of the global batch, however the replicas'
and micro-batches' shares of them fall.

Prints PASS/FAIL lines and `N passed, M failed`; exits 1 on failure, 77
(skip) without torch, torchvision, onnx or mpirun.

    /usr/bin/python3 tests/py/test_lm_train.py --cleave build/cleave [--workdir /tmp/w] [--models gpt,vit]
"""

import copy
import json
import math
import os
import sys

import harness

BATCH, N_ROWS, STEPS, LR = 8, 32, 8, 0.05
ADAMW_LR, WARMUP, NO_DECAY = 3e-3, 2, "bias,ln"
ADAMW_MODELS = ("gpt", "bert")
LOSS_RTOL, LOSS_ATOL = 1e-4, 1e-6
W_RTOL, W_ATOL = 1e-3, 1e-5
TOKEN_FILES = {"gpt": "uint16", "bert": "int32"}
STRATEGIES = [
    ("single", 1, []),
    ("dp2", 2, ["--ranks", "2", "--strategy", "dp"]),
    ("pipeline2_1f1b", 2, ["--ranks", "2", "--strategy", "pipeline", "--microbatches", "2", "--schedule", "1f1b"]),
    ("hybrid2x2", 4, ["--ranks", "4", "--strategy", "hybrid", "--dp", "2", "--pp", "2", "--microbatches", "2"]),
]
# --accumulate 2 of half batches: trained as the whole batch is
ACCUMULATE = ["--batch", str(BATCH // 2), "--accumulate", "2"]
ACCUMULATE_STRATEGIES = [
    ("single_accumulate2", 1, ACCUMULATE),
    ("dp2_accumulate2", 2, ACCUMULATE + ["--ranks", "2", "--strategy", "dp"]),
    ("pipeline2_accumulate2", 2, ACCUMULATE + ["--ranks", "2", "--strategy", "pipeline", "--microbatches", "2"]),
]

torch = np = lm = None


def ce(logits, y):
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100)


class Recipe:
    """How a model trains: plain SGD, or what transformers train with:
    AdamW (weight decay 0.1, none on biases and LayerNorms; eps 1e-6, as
    BERT's), the gradient clipped to a global norm, a cosine schedule after
    a warmup.  With Adam's default eps 1e-8, parameters whose gradient is
    zero but for rounding (the key bias: softmax ignores what it adds to a
    row) take steps of a sizeable share of lr driven by the rounding alone,
    in float32 and float64 differently, PyTorch's own float32 run
    included; eps 1e-6 keeps such steps far below the tolerance."""

    def __init__(self, adamw):
        self.adamw = adamw
        self.clip = None  # set from the unclipped run's norms (clip_between)

    def flags(self):
        if not self.adamw:
            return ["--lr", repr(LR)]
        return ["--optimizer", "adamw", "--lr", repr(ADAMW_LR), "--eps", "1e-6", "--weight-decay", "0.1",
                "--no-decay", NO_DECAY,
                "--lr-schedule", "cosine", "--warmup-steps", str(WARMUP), "--clip-grad-norm", repr(self.clip)]

    def optimizer(self, model):
        if not self.adamw:
            return torch.optim.SGD(model.parameters(), lr=LR), None
        decay = [p for n, p in model.named_parameters() if not any(k in n for k in NO_DECAY.split(","))]
        spared = [p for n, p in model.named_parameters() if any(k in n for k in NO_DECAY.split(","))]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": spared, "weight_decay": 0.0}],
                                lr=ADAMW_LR, eps=1e-6)

        def cosine(k):  # transformers' get_cosine_schedule_with_warmup
            if k < WARMUP:
                return k / WARMUP
            return max(0.0, 0.5 * (1 + math.cos(math.pi * (k - WARMUP) / max(1, STEPS - WARMUP))))
        return opt, torch.optim.lr_scheduler.LambdaLR(opt, cosine)


def reference(model, x, y, recipe, clip=None):
    """Float64 training on batches i*B mod N: (losses before each update,
    the state afterwards, each step's gradient norm before clipping)."""
    model = copy.deepcopy(model).double()
    opt, sched = recipe.optimizer(model)
    losses, norms = [], []
    for s in range(STEPS):
        lo = (s * BATCH) % N_ROWS
        inputs = [v[lo:lo + BATCH].double() if v.is_floating_point() else v[lo:lo + BATCH] for v in x.values()]
        opt.zero_grad()
        loss = ce(model(*inputs), y[lo:lo + BATCH])
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip if clip else float("inf"))))
        opt.step()
        if sched:
            sched.step()
        losses.append(loss.item())
    return losses, {k: v.detach().numpy() for k, v in model.state_dict().items() if v.is_floating_point()}, norms


def clip_between(norms):
    """A clipping norm some steps exceed and others do not: Adam's update
    does not change when every step's gradient is scaled alike, so only
    such a norm shows that the right steps are clipped by the right
    factor."""
    return float(sorted(norms)[len(norms) // 2])


def check_weights(rep, tag, saved, state, start):
    """Every float initializer the program saved against the reference's
    tensor of that name (a tied weight is one initializer, under either
    of its module's names); and the run moved them further than the
    tolerance, so that the check says something."""
    compared, worst, worst_key, moved = 0, 0.0, None, 0.0
    for k, got in saved.items():
        if k not in state or got.dtype.kind != "f":
            continue
        want = state[k]
        moved = max(moved, float(np.max(np.abs(want - start[k]) / (W_RTOL * np.abs(want) + W_ATOL))))
        if got.shape != want.shape:
            rep.check("%s: %s has the reference's shape" % (tag, k), False, "%s vs %s" % (got.shape, want.shape))
            return
        r = float(np.max(np.abs(got.astype(np.float64) - want) / (W_RTOL * np.abs(want) + W_ATOL)))
        if r > worst:
            worst, worst_key = r, k
        compared += 1
    rep.check("%s: %d initializers match PyTorch's (worst %.3g of the tolerance, %s)" % (tag, compared, worst, worst_key),
              compared > 0 and worst <= 1.0, "no initializer of the model's names was saved" if not compared else "")
    rep.check("%s: the run moved the weights beyond the tolerance (%.3g times)" % (tag, moved), moved > 1.0)


def check_accumulated(rep, tag, plan_path, flags):
    """The plan runs the K batches one after another, as K times the
    micro-batches of one batch."""
    with open(plan_path) as f:
        plan = json.load(f)
    k = int(flags[flags.index("--accumulate") + 1])
    m = int(flags[flags.index("--microbatches") + 1]) if "--microbatches" in flags else 1
    got = (plan["accumulate"], plan["batch"], plan["microbatches"])
    rep.check("%s: the plan accumulates %d batches of %s rows as %d micro-batches" % (tag, k, flags[1], k * m),
              got == (k, k * int(flags[1]), k * m), "accumulate, batch, microbatches: %s" % (got,))


def check_tied(rep, tag, plan_path, name):
    """The tied table is used on both stages (the embedding on the first,
    the LM head on the last): each holds a copy, and the plan sums its
    gradient across them (gradient_sum transfers), so that both copies
    take the same update."""
    with open(plan_path) as f:
        plan = json.load(f)
    holders = [r["stage"] for r in plan["rank_plans"] if any(h["name"] == name for h in r["holds"])]
    sums = [t for t in plan["transfers"] if t["direction"] == "gradient_sum"]
    rep.check("%s: the tied '%s' is held by both stages, its gradient summed across them" % (tag, name),
              sorted(set(holders)) == [0, 1] and len(sums) >= 2, "held by stages %s; %d gradient_sum transfers" %
              (holders, len(sums)))


def run_model(rep, cleave, name, work):
    spec = lm.MODELS[name]
    torch.manual_seed(0)
    model = spec.make()
    x, y = spec.data(N_ROWS, torch.Generator().manual_seed(1))
    path = os.path.join(work, name + ".onnx")
    lm.export(model, x, path, spec.opset)
    data = []
    for k, v in list(x.items()) + [("labels", y)]:
        f = os.path.join(work, "%s_%s.npy" % (name, k))
        # token files as people keep them: uint16 (GPT), int32 (BERT)
        np.save(f, v.numpy().astype(TOKEN_FILES[name]) if k == "input" and name in TOKEN_FILES else v.numpy())
        data += ["--data", "%s=%s" % (k, f)]
    recipe = Recipe(name in ADAMW_MODELS)
    ref_losses, state, norms = reference(model, x, y, recipe)
    if recipe.adamw:
        recipe.clip = clip_between(norms)
        ref_losses, state, norms = reference(model, x, y, recipe, recipe.clip)
        print("%s: AdamW, cosine schedule after %d warmup steps, clipping at %.4g (norms %s)" %
              (name, WARMUP, recipe.clip, " ".join("%.3g" % n for n in norms)))
    start = harness.read_weights(path)
    for label, ranks, flags in STRATEGIES + (ACCUMULATE_STRATEGIES if name == "encoder" else []):
        tag = "%s %s" % (name, label)
        prog = os.path.join(work, "%s_%s" % (name, label))
        metrics, saved = prog + ".jsonl", prog + ".trained.onnx"
        batch = [] if "--batch" in flags else ["--batch", str(BATCH)]
        cmd = [cleave, "compile", path, "-o", prog, "--loss", "ce", "--emit-plan", prog + ".plan.json"] + \
            recipe.flags() + batch + flags
        p, _ = harness.run(cmd, timeout=900)
        if not rep.check("%s: compiles" % tag, p.returncode == 0, harness.failure(cmd, p)):
            continue
        if "--accumulate" in flags:
            check_accumulated(rep, tag, prog + ".plan.json", flags)
        if spec.tied and ("pipeline" in label or "hybrid" in label):
            check_tied(rep, tag, prog + ".plan.json", spec.tied)
        argv = [prog] + data + ["--steps", str(STEPS), "--metrics", metrics, "--save", saved]
        if harness.train_against(rep, tag, argv, ranks, metrics, ref_losses, LOSS_RTOL, LOSS_ATOL):
            check_weights(rep, tag, harness.read_weights(saved), state, start)


def main():
    global torch, np, lm
    args = harness.model_args("CLEAVE_LM_MODELS", "encoder,gpt,bert,vit")
    why = harness.missing(modules=("torch", "torchvision", "onnx", "numpy"), programs=("mpirun",))
    if why:
        return harness.skip(why)
    import numpy
    import torch as t
    torch, np = t, numpy
    torch.set_num_threads(1)
    import lm_models
    lm = lm_models
    return harness.run_models(args.models, lm.MODELS, args.workdir, "cleave_lm_",
                              lambda rep, name, work: run_model(rep, args.cleave, name, work))


if __name__ == "__main__":
    sys.exit(main())
