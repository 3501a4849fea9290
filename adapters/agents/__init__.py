"""pydantic-ai agents whose runs are Baton runs (docs/agents.md); needs the ``agents`` extra."""

from baton.adapters.agents.agent import BatonAgent, UncertainCall
from baton.adapters.agents.durability import BatonDurability, idempotency_key

__all__ = ["BatonAgent", "BatonDurability", "UncertainCall", "idempotency_key"]
