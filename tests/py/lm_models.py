"""Transformer models as people write them in plain PyTorch, small enough
for tests: a GPT-2-style decoder, a BERT-style encoder with an attention
mask, nn.TransformerEncoderLayer and torchvision's VisionTransformer.

Each entry of MODELS makes the module, its inputs and its labels for one
seed, and says how its loss reads its output (LmSpec).  The test and the
samples export them with export() below, as a user would for training."""

import math
import warnings

import torch
from torch import nn

VOCAB, SEQ, WIDTH, HEADS = 32, 16, 32, 2


class CausalSelfAttention(nn.Module):
    """GPT-2's attention: one Linear makes q, k and v, split along the
    features; a lower-triangular buffer masks the future with -inf."""

    def __init__(self, d, heads, seq):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.register_buffer("causal", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.heads))
        att = att.masked_fill(self.causal[:, :, :t, :t] == 0, float("-inf"))
        y = torch.softmax(att, dim=-1) @ v
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, d))


class GptBlock(nn.Module):
    def __init__(self, d, heads, seq):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads, seq)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.out(nn.functional.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    """Token and position embeddings, pre-norm blocks, and an LM head tied
    to the token embedding: logits [B, T, V]."""

    def __init__(self, vocab=VOCAB, seq=SEQ, d=WIDTH, heads=HEADS, layers=2):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.blocks = nn.Sequential(*[GptBlock(d, heads, seq) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx):
        pos = torch.arange(0, idx.shape[1], dtype=torch.long)
        return self.head(self.ln_f(self.blocks(self.wte(idx) + self.wpe(pos))))


class BertLayer(nn.Module):
    """Post-norm encoder layer; the padding mask is added to the scores as
    a large negative number, as BERT does."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.o = nn.Linear(d, d)
        self.ln1 = nn.LayerNorm(d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.ln2 = nn.LayerNorm(d)

    def forward(self, x, bias):
        b, t, d = x.shape
        h = self.heads
        q, k, v = (f(x).view(b, t, h, d // h).transpose(1, 2) for f in (self.q, self.k, self.v))
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // h) + bias, dim=-1)
        x = self.ln1(x + self.o((att @ v).transpose(1, 2).reshape(b, t, d)))
        return self.ln2(x + self.out(nn.functional.gelu(self.fc(x))))


class Bert(nn.Module):
    """Token, position and segment embeddings, an embedding LayerNorm, and
    a masked-language-model head: logits [B, T, V].  `mask` [B, T] is 1 for
    real tokens and 0 for padding."""

    def __init__(self, vocab=VOCAB, seq=SEQ, d=WIDTH, heads=HEADS, layers=2):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.ln = nn.LayerNorm(d)
        self.layers = nn.ModuleList([BertLayer(d, heads) for _ in range(layers)])
        self.head = nn.Linear(d, vocab)

    def forward(self, idx, mask):
        pos = torch.arange(0, idx.shape[1], dtype=torch.long)
        x = self.ln(self.tok(idx) + self.pos(pos))
        bias = (1.0 - mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, bias)
        return self.head(x)


class TorchEncoder(nn.Module):
    """nn.TransformerEncoderLayer over float features, tagging every
    position: logits [B, T, C]."""

    def __init__(self, d=WIDTH, heads=HEADS, classes=10):
        super().__init__()
        self.inp = nn.Linear(8, d)
        self.layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=2 * d, dropout=0.0, batch_first=True)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        return self.head(self.layer(self.inp(x)))


def vit():
    import torchvision
    return torchvision.models.VisionTransformer(image_size=16, patch_size=8, num_layers=2, num_heads=2,
                                                hidden_dim=WIDTH, mlp_dim=2 * WIDTH, num_classes=10, dropout=0.0)


class LmSpec:
    """make(): the module; data(n, generator): (inputs as {name: tensor},
    labels, -100 where ignored); opset; tied: the initializer two layers
    share, if any."""

    def __init__(self, make, data, opset, tied=None):
        self.make, self.data, self.opset, self.tied = make, data, opset, tied


def token_data(n, g, ignore_share=0.0):
    """Token windows and their next tokens; a share of the labels set to
    -100 (ignored)."""
    seq = torch.randint(0, VOCAB, (n, SEQ + 1), generator=g)
    y = seq[:, 1:].clone()
    if ignore_share:
        y[torch.rand(y.shape, generator=g) < ignore_share] = -100
    return {"input": seq[:, :SEQ]}, y


def bert_data(n, g):
    """Masked-language-model batches: padding after a random length, the
    labels of unmasked and padded positions ignored."""
    idx = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    lengths = torch.randint(SEQ // 2, SEQ + 1, (n,), generator=g)
    mask = (torch.arange(SEQ)[None, :] < lengths[:, None]).long()
    y = idx.clone()
    chosen = (torch.rand(idx.shape, generator=g) < 0.3) & (mask == 1)
    y[~chosen] = -100
    idx = torch.where(chosen, torch.zeros_like(idx), idx)  # token 0 plays [MASK]
    return {"input": idx, "mask": mask}, y


def tag_data(n, g):
    """Features and a class per position; a fifth of the positions
    unlabelled (-100), as padding is in token tagging."""
    x = torch.randn(n, SEQ, 8, generator=g)
    y = torch.randint(0, 10, (n, SEQ), generator=g)
    y[torch.rand(y.shape, generator=g) < 0.2] = -100
    return {"input": x}, y


MODELS = {
    "gpt": LmSpec(Gpt, lambda n, g: token_data(n, g, 0.1), 17, tied="wte.weight"),
    "bert": LmSpec(Bert, bert_data, 13),
    "encoder": LmSpec(TorchEncoder, lambda n, g: tag_data(n, g), 17),
    "vit": LmSpec(vit, lambda n, g: ({"input": torch.randn(n, 3, 16, 16, generator=g)},
                                     torch.randint(0, 10, (n,), generator=g)), 17),
}


def export(model, inputs, path, opset):
    """torch.onnx.export in training mode with the batch axis dynamic, no
    constant folding (initializers stay one per parameter), output
    'logits'."""
    names = list(inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.train(), tuple(inputs[k][:2] for k in names), path, input_names=names,
                          output_names=["logits"], opset_version=opset, do_constant_folding=False,
                          training=torch.onnx.TrainingMode.TRAINING,
                          dynamic_axes=dict({k: {0: "batch"} for k in names}, logits={0: "batch"}))
