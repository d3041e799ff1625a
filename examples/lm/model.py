"""A decoder-only transformer over bytes, in plain PyTorch: token and
position embeddings, pre-LayerNorm blocks of causal self-attention and an
MLP, a final LayerNorm, and the output layer tied to the token embedding.

    model = Transformer(layers=4, width=96, heads=4, block=64)
    loss = model.loss(inputs, targets)     # mean cross-entropy, nats per byte

SIZES names the configurations the examples use; parameters() counts them.
"""

import math

import torch
from torch import nn
from torch.nn import functional as F

VOCABULARY = 256  # bytes

# name: (layers, width, heads, block)
SIZES = {
    "tiny": (2, 64, 4, 64),       # 0.11M: the tests
    "small": (4, 96, 4, 64),      # 0.48M: the comparisons (scripts/compare-lm)
    "25m": (8, 512, 8, 256),      # 25.4M: the trainer path at size
}


class Block(nn.Module):
    """x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, width, heads, block):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.project = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        # A plain attribute, not a buffer: gloo cannot broadcast bool tensors (DDP would).
        self.causal = torch.tril(torch.ones(block, block, dtype=torch.bool))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        scores = scores.masked_fill(~self.causal[:t, :t], float("-inf"))
        attended = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.project(attended)
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    def __init__(self, layers, width, heads, block):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not a multiple of heads {heads}")
        self.block = block
        self.tokens = nn.Embedding(VOCABULARY, width)
        self.positions = nn.Embedding(block, width)
        self.blocks = nn.ModuleList(Block(width, heads, block) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.apply(self._initialise)
        for name, p in self.named_parameters():  # GPT-2: residual projections scaled by depth
            if name.endswith("project.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _initialise(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, inputs):
        """Logits (batch x time x 256) of the next byte at every position."""
        t = inputs.shape[1]
        x = self.tokens(inputs) + self.positions(torch.arange(t, device=inputs.device))
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.tokens.weight.t()  # tied output layer

    def loss(self, inputs, targets):
        return cross_entropy(self(inputs), targets)

    @torch.no_grad()
    def generate(self, prompt, count, rng, temperature=0.8):
        """`prompt` (bytes) continued by `count` bytes sampled from the model."""
        tokens = torch.tensor(list(prompt), dtype=torch.int64)[None]
        generator = torch.Generator().manual_seed(int(rng.integers(1 << 62)))
        for _ in range(count):
            logits = self(tokens[:, -self.block:])[0, -1] / temperature
            following = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
            tokens = torch.cat([tokens, following[None]], dim=1)
        return bytes(tokens[0].tolist())


def cross_entropy(logits, targets):
    """Mean cross-entropy of the next bytes, nats per byte."""
    return F.cross_entropy(logits.reshape(-1, VOCABULARY), targets.reshape(-1))


def build(size):
    """The transformer of SIZES[size]."""
    if size not in SIZES:
        raise SystemExit(f"unknown model size {size!r}: one of {', '.join(SIZES)}")
    return Transformer(*SIZES[size])


def parameters(model):
    return sum(p.numel() for p in model.parameters())
