#!/usr/bin/python3
"""Check that dropout in training mode draws the same masks under every
strategy, that --seed picks them, and that evaluation runs without it.

An MLP with two nn.Dropout layers (p 0.3 and 0.5), exported in training
mode, is compiled for one process, dp 2, pipeline 2 x 4 micro-batches and a
2 x 2 hybrid, and each program trains 10 SGD steps with --seed 7:

- every strategy's losses equal the single process's (rtol 1e-5: the masks
  are keyed by the seed, the step, each row's position in the global batch
  and the element, so only float rounding of the gradient sums differs);
- dropout changes the training: the losses differ from the same model's
  with p = 0, and from those with --seed 8;
- the saved weights, loaded back into the torch model in eval mode, give
  the outputs the program's --predict wrote: evaluation runs no dropout.

Prints PASS/FAIL lines and `N passed, M failed`; exits 77 (skip) without
torch or mpirun.

    /usr/bin/python3 tests/py/test_dropout.py --cleave build/cleave --workdir /tmp/w
"""

import argparse
import os
import sys
import warnings

import harness

BATCH, ROWS, STEPS, LR = 16, 128, 10, 0.1
STRATEGIES = [
    ("single", 1, []),
    ("dp2", 2, ["--ranks", "2", "--strategy", "dp"]),
    ("pipeline2x4", 2, ["--ranks", "2", "--strategy", "pipeline", "--microbatches", "4"]),
    ("hybrid2x2", 4, ["--ranks", "4", "--strategy", "hybrid", "--dp", "2", "--microbatches", "2"]),
]


def model(torch, p1, p2):
    nn = torch.nn
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Dropout(p1), nn.Linear(64, 64), nn.ReLU(),
                         nn.Dropout(p2), nn.Linear(64, 10))


def export(torch, m, path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m.train(), torch.zeros(BATCH, 20), path, training=torch.onnx.TrainingMode.TRAINING,
                          opset_version=13, do_constant_folding=False, input_names=["input"],
                          output_names=["logits"])


def train(rep, cleave, work, onnx_path, label, ranks, flags, seed, extra=()):
    """Compiles and trains; the losses, or None after a failed check."""
    prog = os.path.join(work, label)
    cmd = [cleave, "compile", onnx_path, "-o", prog, "--batch", str(BATCH), "--loss", "ce", "--lr", str(LR)] + flags
    p, _ = harness.run(cmd)
    if not rep.check("%s: compiles" % label, p.returncode == 0, harness.failure(cmd, p)):
        return None
    argv = [prog, "--data", "input=" + os.path.join(work, "x.npy"), "--data", "labels=" + os.path.join(work, "y.npy"),
            "--steps", str(STEPS), "--metrics", prog + ".jsonl", "--seed", str(seed)] + list(extra)
    if ranks > 1:
        argv = harness.mpirun(ranks, argv)
    p, _ = harness.run(argv, env=harness.mpi_env())
    if not rep.check("%s: trains" % label, p.returncode == 0, harness.failure(argv, p)):
        return None
    return harness.read_losses(prog + ".jsonl")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cleave", required=True)
    ap.add_argument("--workdir")
    args = ap.parse_args()
    why = harness.missing(modules=("torch", "onnx", "numpy"), programs=("mpirun",))
    if why:
        return harness.skip(why)
    import numpy as np
    import torch
    rep = harness.Report()
    with harness.workdir(args.workdir, "cleave_dropout_") as work:
        g = torch.Generator().manual_seed(1)
        x = torch.randn(ROWS, 20, generator=g)
        np.save(os.path.join(work, "x.npy"), x.numpy())
        np.save(os.path.join(work, "y.npy"), torch.randint(0, 10, (ROWS,), generator=g).numpy().astype(np.int64))
        path, plain = os.path.join(work, "drop.onnx"), os.path.join(work, "plain.onnx")
        net = model(torch, 0.3, 0.5)
        export(torch, net, path)
        export(torch, model(torch, 0.0, 0.0), plain)

        saved = os.path.join(work, "single.trained.onnx")
        predict = os.path.join(work, "single.predict.npy")
        evals = ["--eval-data", "input=" + os.path.join(work, "x.npy"), "--eval-data",
                 "labels=" + os.path.join(work, "y.npy"), "--save", saved, "--predict", predict]
        base = None
        for label, ranks, flags in STRATEGIES:
            losses = train(rep, args.cleave, work, path, label, ranks, flags, 7, evals if label == "single" else ())
            if losses is None:
                continue
            if base is None:
                base = losses
                continue
            ok, detail = harness.compare(losses, base, 1e-5, 1e-7)
            rep.check("%s: the same losses as one process (the same masks)" % label, ok, detail)
        if base is None:
            return rep.summary()
        for label, onnx_path, seed in (("no_dropout", plain, 7), ("seed8", path, 8)):
            losses = train(rep, args.cleave, work, onnx_path, label, 1, [], seed)
            if losses is not None:
                far = max(abs(a - b) / abs(b) for a, b in zip(losses, base))
                rep.check("%s: other losses than seed 7's with dropout (largest difference %.3g)" % (label, far),
                          far > 1e-3)
        # Evaluation: the trained weights in torch, eval mode, give --predict's outputs.
        weights = harness.read_weights(saved)
        net.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in weights.items()})
        with torch.no_grad():
            want = net.eval()(x).numpy()
        ok, detail = harness.compare(np.load(predict), want, 1e-4, 1e-5)
        rep.check("--predict runs without dropout: torch's eval outputs of the trained weights", ok, detail)
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
