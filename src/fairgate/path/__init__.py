"""The request path: one ``/v1`` request from its parsed body to the answer and its settlement.

``proxy`` (and ``responses_edge``) turn an HTTP request into a :class:`~fairgate.path.call.Call`;
``combos`` orders targets (strategies, quota-share, fusion, pipeline, fan-out, shadows);
``executor`` runs the attempts over the candidates (slots, resilience, admission, failover);
``attempt`` sends one attempt through the ``exchange`` table and ``relay``\\ s streams, settling
each reservation exactly once (``reservation``). The process (``fairgate.process``) gives it the
gateway's state; nothing here imports the admin API or the process assembly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fairgate.surface import lazy_surface

if TYPE_CHECKING:
    from fairgate.path.call import Services
    from fairgate.path.provider_signals import ProviderSignals
else:  # mypy reads the imports; a run loads each name on first use
    __getattr__ = lazy_surface(__name__)

__all__ = ["ProviderSignals", "Services"]
