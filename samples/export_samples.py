#!/usr/bin/python3
"""Export cleave's sample models (mlp, cnn, resnet, transformer, gpt) to ONNX.

The model definitions live in tests/py/torch_models.py and (gpt)
tests/py/lm_models.py so the tests can build the very same models.  Weights
are seeded, so re-running this script gives the same models.

    /usr/bin/python3 samples/export_samples.py [--out DIR] [--only NAME ...]
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # keep tests/py free of __pycache__
sys.path.insert(0, os.path.join(HERE, os.pardir, "tests", "py"))

try:
    import torch  # noqa: F401
except ImportError:
    sys.exit("export_samples.py needs torch; run it with /usr/bin/python3 (Debian's python3-torch)")

import lm_models  # noqa: E402
import torch_models  # noqa: E402

MAX_BYTES = 1 << 20


# samples/gpt.onnx: a character-level GPT over samples/text_tokens.py's 128
# byte tokens, windows of 64; 2 layers of width 64 with 4 heads.
GPT = dict(vocab=128, seq=64, d=64, heads=4, layers=2)


def export_gpt(path):
    torch.manual_seed(torch_models.SEED)
    model = lm_models.Gpt(**GPT)
    tokens = torch.randint(0, GPT["vocab"], (2, GPT["seq"]), generator=torch.Generator().manual_seed(1234))
    lm_models.export(model, {"input": tokens}, path, 17)
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names_all = list(torch_models.MODELS) + ["gpt"]
    ap.add_argument("--out", default=HERE, help="output folder (default: %(default)s)")
    ap.add_argument("--only", nargs="+", choices=sorted(names_all), help="export only these models")
    args = ap.parse_args()

    os.makedirs(args.out, exist_ok=True)
    for name in args.only or names_all:
        path = os.path.join(args.out, name + ".onnx")
        if name == "gpt":
            model = export_gpt(path)
        else:
            spec = torch_models.MODELS[name]
            model = spec.build()
            torch_models.export_onnx(spec, model, path)
        size = os.path.getsize(path)
        print("%-12s %8d params  %8d bytes  %s" % (
            name, torch_models.param_count(model), size, os.path.relpath(path)))
        if size >= MAX_BYTES:
            sys.exit("%s is %d bytes; samples must stay under 1 MB" % (path, size))


if __name__ == "__main__":
    main()
