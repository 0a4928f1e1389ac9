"""The model, data and options of the FSDP2 tests (fsdp_rank.py, test_fsdp.py):
every dimension a multiple of 4, so FSDP2's shards are even at 1, 2 and 4 ranks."""

import torch

STEPS = 6
VOCAB = 32
DIM = 16
HIDDEN = 64
DOWN_SHAPE = (DIM, HIDDEN)
OPTIONS = dict(lr=0.02, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8)


EXPERTS = 4


class Experts(torch.nn.Module):
    """A 3-D expert stack [experts, dim, dim] (the planner's name rule: "experts." then a name), every expert
    applied and averaged (no routing: every expert gets a gradient)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(EXPERTS, DIM, DIM) / DIM**0.5)

    def forward(self, h):
        return torch.tanh(torch.einsum("btd,eod->ebto", h, self.weight)).mean(0)


class Block(torch.nn.Module):
    def __init__(self, experts=False):
        super().__init__()
        self.norm = torch.nn.LayerNorm(DIM)
        self.up = torch.nn.Linear(DIM, HIDDEN)
        self.down = torch.nn.Linear(HIDDEN, DIM, bias=False)
        self.experts = Experts() if experts else None

    def forward(self, h):
        h = h + self.down(torch.tanh(self.up(self.norm(h))))
        return h + self.experts(h) if self.experts is not None else h


class Model(torch.nn.Module):
    def __init__(self, experts=False):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.blocks = torch.nn.ModuleList([Block(experts), Block(experts)])
        self.lm_head = torch.nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.lm_head(h)


def make_model(experts=False):
    torch.manual_seed(5)
    return Model(experts)


def batch(step, rank):
    """Rank `rank`'s batch of step `step` (the same at every world size)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, VOCAB, (2, 8), generator=g), torch.randint(0, VOCAB, (2, 8), generator=g)


def loss(model, x, y):
    return torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
