"""Hypothesis tries to break invariant 5's last clause: budgets carry across a (cross-store) handoff.

Given a run imported from a handoff document that carries some usage under some ceilings, when the
destination records intents of random sizes, then it may spend exactly ``ceiling - carried`` of each
counter: an intent is accepted if and only if carried plus local usage plus its charge stays within
every ceiling, a refused one changes nothing, and the reported usage is always carried plus local.
"""

from __future__ import annotations

import msgspec
from hypothesis import given as hypothesis_given
from hypothesis import settings
from hypothesis import strategies as st

from baton.domain import errors
from baton.domain.budgets import COUNTERS, Ceilings, Usage
from baton.domain.commands import AcceptHandoff, RecordIntent, RecordObservation
from baton.domain.decide import context_digest, decide
from baton.domain.handoff_document import document_digest, encode_document, local_allowance

from .given import History, context, given
from .handoffs import DESTINATION_STORE, checkpoint, claimed_import, document

_small = st.integers(0, 60)


def within(usage: Usage, ceilings: Ceilings) -> bool:
    return all((ceiling := getattr(ceilings, name)) is None or getattr(usage, name) <= ceiling for name in COUNTERS)


def imported(carried: Usage, ceilings: Ceilings) -> tuple[History, AcceptHandoff]:
    """An empty store's history of the run, and the import of the document carrying ``carried``."""
    doc = document(
        usage=carried,
        ceilings=ceilings,
        checkpoint=checkpoint(usage=carried, ceilings=ceilings),
        destination_store=DESTINATION_STORE,
    )
    data = encode_document(doc)
    return given(run_id=doc.run_id), claimed_import(data, document_digest(data), doc.run_id)


@settings(max_examples=150, deadline=None)
@hypothesis_given(
    carried_calls=_small,
    carried_bytes=st.integers(0, 600),
    calls_ceiling=st.none() | _small,
    bytes_ceiling=st.none() | st.integers(0, 900),
    sizes=st.lists(st.integers(0, 120), max_size=12),
)
def test_an_imported_run_spends_only_its_ceilings_minus_what_it_carried(
    carried_calls: int, carried_bytes: int, calls_ceiling: int | None, bytes_ceiling: int | None, sizes: list[int]
) -> None:
    """Given an import carrying usage (refused if that exhausts a ceiling), when intents of random sizes
    follow, then each is accepted exactly when it fits, and usage is always carried + local."""
    carried = Usage(calls=carried_calls, argument_bytes=carried_bytes, fuel=7, stages=1)
    ceilings = Ceilings(calls=calls_ceiling, argument_bytes=bytes_ceiling)
    history, accept = imported(carried, ceilings)
    try:
        allowance = local_allowance(ceilings, carried)
    except errors.PriorUsageExhaustsDestination:
        assert history.rejects(accept, worker="w-b", epoch=2).reason == "prior_usage_exhausts_destination"
        assert not history.state.opened
        return
    history.record(accept, worker="w-b", epoch=2)
    assert history.state.usage == carried and history.state.ceilings == ceilings

    spent = Usage()
    for index, size in enumerate(sizes):
        intended = context(f"op-{index}", {"q": "x" * size})
        command = RecordIntent(f"op-{index}", "pure", "tools.search@1", intended, f"k-{index}")
        # the charge the intent would carry, decided where nothing is bounded
        unbounded = msgspec.structs.replace(history.state, ceilings=Ceilings())
        charge = decide(unbounded, history.submission(command, worker="w-b"), history.now)[0].charge  # type: ignore[attr-defined]
        before = history.state.usage
        if within(before.plus(charge), ceilings):
            history.record(command, worker="w-b")
            history.record(RecordObservation(f"op-{index}", context_digest(intended), "ok"), worker="w-b")
            spent = spent.plus(charge)
        else:
            assert history.rejects(command, worker="w-b").reason == "budget_exceeded"
        assert history.state.usage == carried.plus(spent)  # reported usage is carried + local, never less
        assert within(spent, allowance)  # local spending stays within ceiling - carried
