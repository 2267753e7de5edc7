"""The layer hyperparameters, `#nsa.config<...>` (docs/Spec.md section 4)."""

from dataclasses import dataclass
from typing import Tuple


@dataclass(frozen=True)
class NSAConfig:
    """One layer's configuration; the defaults are the paper's.

    cmp_block (l), cmp_stride (d): compressed blocks of l tokens every d.
    slc_block (l'), num_selected (n): the top-n selection blocks of l' tokens.
    window (w): the sliding window.
    scale: the softmax scale; None means 1/sqrt(Dqk).
    pool: "mean", or "linear" (learned weights [2, H, l], float32).
    initial, local, log_levels, hub_stride, blocks, max_tokens: the
    always-on blocks (Spec 5.4); hubs need max_tokens.
    """

    cmp_block: int = 32
    cmp_stride: int = 16
    slc_block: int = 64
    num_selected: int = 16
    window: int = 512
    scale: float = None
    pool: str = "mean"
    initial: int = 1
    local: int = 2
    log_levels: int = 0
    hub_stride: int = 0
    blocks: Tuple[int, ...] = ()
    max_tokens: int = 0

    def __post_init__(self):
        for name in ("cmp_block", "cmp_stride", "slc_block", "num_selected",
                     "window", "initial", "local", "log_levels",
                     "hub_stride", "max_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"NSAConfig.{name} must be an int, found "
                                f"{type(value).__name__}")
            if not -2**63 <= value < 2**63:
                raise ValueError(f"NSAConfig.{name} must fit in 64 bits "
                                 f"(the C layer's int64_t), found {value}")
        if self.pool not in ("mean", "linear"):
            raise ValueError(f"NSAConfig.pool must be 'mean' or 'linear', "
                             f"found {self.pool!r}")
        if self.scale is not None and not (isinstance(self.scale, (int, float))
                                           and self.scale > 0):
            raise ValueError(f"NSAConfig.scale must be None or positive, "
                             f"found {self.scale!r}")
        try:
            blocks = tuple(self.blocks)
        except TypeError:
            raise TypeError(f"NSAConfig.blocks must be a sequence of ints, "
                            f"found {type(self.blocks).__name__}") from None
        if any(not isinstance(b, int) or isinstance(b, bool) for b in blocks):
            raise TypeError(f"NSAConfig.blocks must hold ints, found "
                            f"{blocks}")
        object.__setattr__(self, "blocks", blocks)
        if any(not -2**63 <= b < 2**63 for b in self.blocks):
            raise ValueError(f"NSAConfig.blocks must fit in 64 bits, found "
                             f"{self.blocks}")
