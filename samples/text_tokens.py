#!/usr/bin/python3
"""Character tokens for samples/gpt.onnx: a text file into training
windows, and a trained model's predictions back into text.

Tokens are the text's bytes: an ASCII byte is its own token (0-127), any
other byte becomes the token of '?'.  The vocabulary is therefore the 128
tokens samples/gpt.onnx was exported with, whatever the text.

    text_tokens.py encode TEXT --seq T --out DIR [--eval-windows K]
        Windows of T+1 tokens every T/2 tokens: DIR/x.npy holds their first
        T tokens (uint16 [N, T], the model's input) and DIR/y.npy the last T
        (int64 [N, T], each position's next token: the labels).  The last K
        windows (default 32, a batch) go to DIR/eval_x.npy and DIR/eval_y.npy instead,
        for --eval-data and --predict.

    text_tokens.py show DIR PRED.npy [--rows R]
        For R evaluation windows (default 3): the text, and below it the
        token the model predicts after each position (the argmax of
        PRED.npy, the program's --predict output [N, T, 128]), with the
        share of them that are right.

Needs numpy only.
"""

import argparse
import os
import sys

import numpy as np

VOCAB = 128
UNKNOWN = ord("?")


def tokens(data):
    t = np.frombuffer(data, dtype=np.uint8).astype(np.uint16)
    t[t >= VOCAB] = UNKNOWN
    return t


def text(toks):
    """Printable text of tokens: controls other than newline as '.'."""
    return "".join(chr(t) if 32 <= t < 127 or t == 10 else "." for t in toks)


def encode(args):
    with open(args.text, "rb") as f:
        toks = tokens(f.read())
    t, step = args.seq, max(1, args.seq // 2)
    starts = range(0, len(toks) - t, step)
    if len(starts) <= args.eval_windows:
        sys.exit("%s: %d tokens make %d windows of %d; need more than --eval-windows %d" %
                 (args.text, len(toks), len(starts), t + 1, args.eval_windows))
    win = np.stack([toks[s:s + t + 1] for s in starts])
    os.makedirs(args.out, exist_ok=True)
    k = len(win) - args.eval_windows
    for prefix, part in (("", win[:k]), ("eval_", win[k:])):
        np.save(os.path.join(args.out, prefix + "x.npy"), np.ascontiguousarray(part[:, :t]))
        np.save(os.path.join(args.out, prefix + "y.npy"), part[:, 1:].astype(np.int64))
    print("%s: %d tokens -> %d training windows and %d evaluation windows of %d, in %s" %
          (args.text, len(toks), k, len(win) - k, t, args.out))


def show(args):
    x = np.load(os.path.join(args.dir, "eval_x.npy"))
    y = np.load(os.path.join(args.dir, "eval_y.npy"))
    pred = np.load(args.pred)
    if pred.shape[:2] != y.shape or pred.shape[2] != VOCAB:
        sys.exit("%s: shape %s, expected [%d, %d, %d] (the --predict output over %s)" %
                 (args.pred, list(pred.shape), y.shape[0], y.shape[1], VOCAB, os.path.join(args.dir, "eval_x.npy")))
    guess = pred.argmax(axis=2)
    for r in range(min(args.rows, len(x))):
        print("text:      %r" % text(x[r]))
        print("predicted: %r" % text([x[r][0]] + list(guess[r][:-1])))
    print("next-character accuracy over %d evaluation windows: %.1f%%" % (len(y), 100.0 * float((guess == y).mean())))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("encode")
    e.add_argument("text")
    e.add_argument("--seq", type=int, default=64)
    e.add_argument("--out", required=True)
    e.add_argument("--eval-windows", type=int, default=32)
    s = sub.add_parser("show")
    s.add_argument("dir")
    s.add_argument("pred")
    s.add_argument("--rows", type=int, default=3)
    args = ap.parse_args()
    encode(args) if args.cmd == "encode" else show(args)


if __name__ == "__main__":
    main()
