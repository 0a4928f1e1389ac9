"""The model, data and options of the FSDP2 tests (fsdp_rank.py, test_fsdp.py):
every dimension a multiple of 4, so FSDP2's shards are even at 1, 2 and 4 ranks."""

import torch

STEPS = 6
VOCAB = 32
DIM = 16
HIDDEN = 64
DOWN_SHAPE = (DIM, HIDDEN)
OPTIONS = dict(lr=0.02, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(DIM)
        self.up = torch.nn.Linear(DIM, HIDDEN)
        self.down = torch.nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, h):
        return h + self.down(torch.tanh(self.up(self.norm(h))))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.lm_head = torch.nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.lm_head(h)


def make_model():
    torch.manual_seed(5)
    return Model()


def batch(step, rank):
    """Rank `rank`'s batch of step `step` (the same at every world size)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, VOCAB, (2, 8), generator=g), torch.randint(0, VOCAB, (2, 8), generator=g)


def loss(model, x, y):
    return torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
