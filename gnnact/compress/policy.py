"""Which saved tensors get which compressor: :class:`Rule` and :class:`Policy`."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch import Tensor, nn

from gnnact.compress.base import Compressor
from gnnact.compress.mesa import Mesa
from gnnact.compress.quantize import Quantize
from gnnact.config import Config

__all__ = ["EXACT", "OUTSIDE", "Policy", "Rule", "within"]

EXACT = None
"""A rule's compressor that keeps the tensor as is."""

OUTSIDE = "<outside>"
"""The module name of tensors saved outside every module of the model (the loss)."""

# Module types and name patterns taken for attention when a rank-4 tensor is saved inside.
_ATTENTION_TYPES: tuple[type, ...] = (nn.MultiheadAttention,)
_ATTENTION_NAMES = ("*attn*", "*attention*", "*Attn*", "*Attention*")
_QUANTIZE2 = Quantize(2)


def within(path: str, ancestor: str) -> bool:
    """Whether module ``path`` is ``ancestor`` or lies inside it (``"a.b"`` is within ``"a"``,
    ``"ab"`` is not)."""
    return path == ancestor or path.startswith(ancestor + ".")


@dataclass(frozen=True)
class Rule:
    """Give :attr:`compressor` (``None``: keep exact) to the saved tensors it matches.

    A tensor matches when every given criterion holds: the innermost module running when it
    was saved is an instance of one of :attr:`modules`; its module path or its tensor name
    (``"<module path>:<index>"``, the index counting the module's saves in the forward pass)
    matches one of the :mod:`fnmatch` patterns :attr:`names` (the path of the model itself is
    ``""``, of the loss and other code outside the model :data:`OUTSIDE`); its rank is one
    of :attr:`dims`; :attr:`where` returns ``True``.

    Args:
        compressor (Compressor or None): what the matched tensors get;
            :data:`~gnnact.compress.EXACT` (:obj:`None`) keeps them as they are.
        modules (tuple[type, ...], optional): module classes; empty: any module.
            (default: :obj:`()`)
        names (tuple[str, ...], optional): :mod:`fnmatch` patterns of module paths or tensor
            names; empty: any name. (default: :obj:`()`)
        dims (tuple[int, ...], optional): tensor ranks; empty: any rank. (default: :obj:`()`)
        where (callable, optional): ``where(name, module, tensor) -> bool``, a last test.
            (default: :obj:`None`)

    Example:
        >>> from gnnact.compress import Quantize, Rule
        >>> rule = Rule(Quantize(8), modules=(torch.nn.Conv2d,), dims=(4,))
        >>> conv = torch.nn.Conv2d(3, 8, 3)
        >>> rule.matches("features.0:0", conv, torch.randn(2, 3, 32, 32))
        True
        >>> rule.matches("features.0:1", conv, torch.randn(2, 3))  # rank 2
        False
        >>> Rule(None, names=("head",)).matches("head:0", None, torch.randn(4))  # exact
        True
    """

    compressor: Compressor | None
    modules: tuple[type, ...] = ()
    names: tuple[str, ...] = ()
    dims: tuple[int, ...] = ()
    where: Callable[[str, nn.Module | None, Tensor], bool] | None = None

    def matches(self, name: str, module: nn.Module | None, t: Tensor) -> bool:
        """Whether the tensor ``t`` named ``name``, saved inside ``module`` (:obj:`None`
        outside every module), matches every given criterion."""
        if self.modules and not isinstance(module, self.modules):
            return False
        if self.names:
            path = name.rsplit(":", 1)[0]
            if not any(fnmatch.fnmatchcase(path, p) or fnmatch.fnmatchcase(name, p)
                       for p in self.names):
                return False
        if self.dims and t.dim() not in self.dims:
            return False
        return self.where is None or self.where(name, module, t)


class Policy:
    """The first matching :class:`Rule` decides; tensors no rule matches get
    :attr:`default` (``None``: keep exact).

    Args:
        rules (Sequence[Rule], optional): in order of precedence. (default: :obj:`()`)
        default (Compressor, optional): (default: :class:`Quantize` at 2 bits)

    Example:
        >>> from gnnact.compress import Mesa, Policy, Quantize, Rule
        >>> policy = Policy([Rule(Mesa(), names=("*attn*",), dims=(4,)),
        ...                  Rule(None, names=("fc",))], default=Quantize(4))
        >>> policy.choose("fc:0", None, torch.randn(8, 8)) is None  # kept exact
        True
        >>> policy.choose("blocks.0.attn:2", None, torch.randn(2, 4, 8, 8))
        Mesa(bits=8, momentum=0.9, head_dim=1, channel_groups=8)
        >>> policy.choose("blocks.0.mlp:0", None, torch.randn(8, 8))
        Quantize(bits=4, group_size=512, per_row=False, backend='auto')
        >>> hooks = gnnact.compress_saved_tensors(policy=policy)
    """

    def __init__(self, rules: Sequence[Rule] = (), default: Compressor | None = _QUANTIZE2
                 ) -> None:
        for rule in rules:
            if not isinstance(rule, Rule):
                raise TypeError(f"rules must be gnnact.compress.Rule objects, got {rule!r}")
        if default is not None and not isinstance(default, Compressor):
            raise TypeError(f"default must be a Compressor or None, got {default!r}")
        self.rules = list(rules)
        self.default = default

    def __repr__(self) -> str:
        return f"Policy(rules={self.rules!r}, default={self.default!r})"

    def choose(self, name: str, module: nn.Module | None, t: Tensor) -> Compressor | None:
        """The compressor of the first rule that :meth:`Rule.matches` the tensor, else
        :attr:`default`; :obj:`None` keeps the tensor exact."""
        for rule in self.rules:
            if rule.matches(name, module, t):
                return rule.compressor
        return self.default

    @classmethod
    def default_for(cls, config: Config | None = None, model: nn.Module | None = None,
                    attention: Compressor | None = None) -> Policy:
        """The default policy (GACT's and Mesa's choices):

        1. what is saved outside the model (the loss) stays exact, as does the input of
           the model's last :class:`~torch.nn.Linear` (the classifier head), if it has one:
           GACT finds the loss context by far the most sensitive tensor;
        2. rank-4 tensors saved inside attention (:class:`~torch.nn.MultiheadAttention`, or
           a module whose path contains ``attn``/``attention``): :class:`Mesa`, one 8-bit
           group per head with running ranges (or ``attention``);
        3. everything else: :class:`Quantize` with ``config``'s bits and grouping.

        With ``config.bits`` of 32 every tensor stays exact.
        """
        config = config or Config()
        default = Quantize.from_config(config)
        if config.width == 32:
            return cls([], default=None)
        rules = [Rule(None, names=(OUTSIDE,))]
        if model is not None:
            heads = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
            if heads:
                rules.append(Rule(None, names=(heads[-1],)))
        attention = attention if attention is not None else Mesa()
        rules.append(Rule(attention, modules=_ATTENTION_TYPES, dims=(4,)))
        rules.append(Rule(attention, names=_ATTENTION_NAMES, dims=(4,)))
        return cls(rules, default=default)
