"""A ResNet-18-style CNN, a VGG-style CNN and transformer encoders (our blocks and PyTorch's)
for the generic saved-tensor pipeline
(``gnnact.compress_saved_tensors``): defined here, no downloads. Also used by
``benchmarks/bench_generic.py``."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class BasicBlock(nn.Module):
    """ResNet's basic block: conv3x3-BN-ReLU-conv3x3-BN, plus the (projected) shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18's layout (a 3x3 stem for small images, [2, 2, 2, 2] basic blocks at widths
    w, 2w, 4w, 8w, global average pooling, a linear head)."""

    def __init__(self, in_channels: int = 3, classes: int = 10, width: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU(inplace=True))
        blocks, cin = [], width
        for i, cout in enumerate((width, 2 * width, 4 * width, 8 * width)):
            for j in range(2):
                blocks.append(BasicBlock(cin, cout, 2 if i > 0 and j == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: Tensor) -> Tensor:
        out = self.layers(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(out, 1).flatten(1))


class VGG(nn.Module):
    """VGG-11's layout at width w: 3x3 conv-BN-ReLU stages of 1, 1, 2, 2 convs at widths w,
    2w, 4w, 8w, each stage ending in a 2x2 max pool (which keeps the argmax of every output
    for backward), global average pooling, a linear head."""

    def __init__(self, in_channels: int = 3, classes: int = 10, width: int = 16) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = in_channels
        for convs, cout in zip((1, 1, 2, 2), (width, 2 * width, 4 * width, 8 * width),
                               strict=True):
            for _ in range(convs):
                layers += [nn.Conv2d(cin, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout),
                           nn.ReLU(inplace=True)]
                cin = cout
            layers.append(nn.MaxPool2d(2, ceil_mode=True))  # (8x8 digits pool down to 1x1)
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


class SelfAttention(nn.Module):
    """Multi-head self-attention with separate query, key and value projections (all three
    save the same input) and an explicit softmax, so the pipeline sees the ``[B, H, L, L]``
    attention map."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = (nn.Linear(dim, dim) for _ in range(3))
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        b, n, d = x.shape

        def split(t: Tensor) -> Tensor:
            return t.view(b, n, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        attn = (q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, d))


class EncoderBlock(nn.Module):
    """Pre-norm transformer encoder block: x + attn(LN(x)), then x + MLP(LN(x)) with GELU."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int = 2) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(),
                                 nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    """A transformer encoder on a sequence of ``tokens`` vectors of ``features`` values (an
    image's rows, for the digits), with learned positions, mean pooling and a linear head."""

    def __init__(self, tokens: int = 8, features: int = 8, classes: int = 10, dim: int = 64,
                 heads: int = 4, depth: int = 2) -> None:
        super().__init__()
        self.embed = nn.Linear(features, dim)
        self.pos = nn.Parameter(0.02 * torch.randn(1, tokens, dim))
        self.blocks = nn.Sequential(*(EncoderBlock(dim, heads) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: Tensor) -> Tensor:
        h = self.blocks(self.embed(x.flatten(1, 2) if x.dim() == 4 else x) + self.pos)
        return self.head(self.norm(h).mean(dim=1))


class TorchTransformer(Transformer):
    """:class:`Transformer` with PyTorch's own encoder layers as users write them
    (``nn.TransformerEncoderLayer``: post-norm, ReLU, dropout 0.1 on the attention weights,
    the feed-forward and both residuals)."""

    def __init__(self, tokens: int = 8, features: int = 8, classes: int = 10, dim: int = 64,
                 heads: int = 4, depth: int = 2, dropout: float = 0.1) -> None:
        super().__init__(tokens, features, classes, dim, heads, depth)
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=dropout,
                                           batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)


def digits(seed: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """scikit-learn's bundled 8x8 digits (1,797 images, no download) as ``[N, 1, 8, 8]``
    float32 in [0, 1], split 75/25 with a fixed permutation: train x, y, test x, y."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(data.target, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    cut = len(y) * 3 // 4
    return x[perm[:cut]], y[perm[:cut]], x[perm[cut:]], y[perm[cut:]]
