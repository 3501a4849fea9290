"""The ledger's write path: decide, seal and append a batch of submissions with the fence.

A decision is made on working copies of the cached states; only after the append commits are the
copies cached. A rejection or a failed append leaves the cache as it was, a prefix of the log.
A retry of an accepted submission returns the original verdict; a fence failure returns
``stale_epoch`` with the current epoch; a lost race reads the log's tail and decides again.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from typing import NamedTuple, cast

from eventsourcing.persistence import InterfaceError, OperationalError, PersistenceError, StoredEvent

from baton.adapters.clock import Clock
from baton.adapters.eventstore.claims import check_claim
from baton.adapters.eventstore.content_digest import same_content, submission_digest
from baton.adapters.eventstore.fenced import (
    MAX_EVENTS_PER_APPEND,
    AppendConflict,
    DuplicateSubmission,
    FenceViolation,
    Riders,
    SubmissionRow,
)
from baton.adapters.eventstore.liveness import session_to_judge
from baton.adapters.eventstore.mapper import StoredRunEvent, decode_recorded
from baton.adapters.eventstore.ports import AsyncAppender, FencedRecorder
from baton.adapters.eventstore.state_cache import StateCache, working_copy
from baton.adapters.identity import verify_signature
from baton.domain import errors, identity
from baton.domain.chain import seal_stored
from baton.domain.commands import AcceptHandoff, RecordIntent, Submission, Verdict
from baton.domain.decide import UNFENCED_COMMANDS, decide, envelope_epoch
from baton.domain.events import Event, IntentRecorded, LeaseExpired
from baton.domain.fencing import Fence, fence_for
from baton.domain.generation_zero import blobs_of
from baton.domain.identity import REGISTRY_RUN
from baton.domain.operations import context_digest
from baton.domain.state import RunState, apply

__all__ = ["WritePath", "submission_digest"]

# whose sender need not hold the lease: a lost race is re-decided, not called stale
_UNFENCED = (*UNFENCED_COMMANDS, AcceptHandoff, *identity.REGISTRY_COMMANDS)
_MAX_ATTEMPTS = 16
UNOPENED_RECHECK_S = 1.0


class _Draft(NamedTuple):
    """A decided, sealed attempt not yet appended; ``after`` is what to cache once it is stored.

    ``blobs``: the payloads its events reference that go into the blob store in the same
    transaction (a handoff's document and migrated state: ``domain.generation_zero``)."""

    after: list[RunState]
    pending: list[StoredRunEvent]
    fences: list[Fence]
    rows: list[SubmissionRow]
    verdicts: list[Verdict]
    blobs: dict[str, bytes]

    @property
    def stored(self) -> Sequence[StoredEvent]:
        """``pending`` as a recorder takes it: each has the four fields of a ``StoredEvent`` it reads."""
        return cast("Sequence[StoredEvent]", self.pending)


class WritePath:
    """Submissions in, verdicts out; the store's fence makes a decision on a stale state harmless."""

    def __init__(self, store: FencedRecorder, cache: StateCache, clock: Clock) -> None:
        self.store = store
        self.cache = cache
        self.clock = clock
        self._unopened_until = 0.0  # until then, a cached "no registry" is believed without a look
        self._this_store: str | None = None  # this store's id, once read (``_store_id``)
        self.lease_takeovers = 0  # leases this process's appends ended by force (``baton_lease_takeovers``)
        self._tally = threading.Lock()

    def current(self, run_id: str, *, refresh: bool = True) -> RunState:
        """The cached state, caught up with the store's log unless ``refresh`` is off.

        The caller holds the run's lock. The result is cached (it holds only stored events) and
        must not be changed: decisions are made on a ``working_copy``. Skipping the catch-up read
        is safe for appends: the fence rejects a decision made on a stale state.
        """
        state = self.cache.get(run_id)
        if state is not None and not refresh:
            return state
        state = RunState(run_id=run_id) if state is None else working_copy(state)
        for stored in self.store.select_events(run_id, gt=state.version or None):
            apply(state, decode_recorded(stored.topic, stored.state))
        self.cache.put([state])
        return state

    def submit(self, submission: Submission) -> Verdict:
        """Decide and append one submission: a verdict, or ``StoreUnavailable``; never a half-write.

        A lost race is retried with jittered exponential backoff, so competing writers (a takeover
        against a busy old owner) interleave instead of starving one another.
        """
        for attempt in range(_MAX_ATTEMPTS):
            if attempt > 1:
                time.sleep(random.uniform(0, min(0.064, 0.001 * 2**attempt)))
            if attempt == _MAX_ATTEMPTS // 2:
                # Refreshed and still losing: more likely a cached state that is not a prefix of the
                # log (a bug elsewhere) than a race; fold the run from the log once.
                self.cache.forget([submission.run_id])
            verdict = self._attempt([submission], refresh=attempt > 0)
            if verdict is not None:
                return verdict[0]
        return _rejected(submission, errors.ConcurrencyConflict("gave up after repeated concurrent changes"))

    def submit_many(self, submissions: Sequence[Submission]) -> list[Verdict]:
        """Submit a batch in one transaction when every submission is accepted.

        If any is rejected, or the batch loses a race, each is submitted on its own instead, so
        every submission still gets exactly the verdict it would have had alone.
        """
        if 0 < len(submissions) <= MAX_EVENTS_PER_APPEND // 2:
            # A second try on refreshed states: a batch that only lost a race to another process
            # (its cached states were behind) stays one transaction.
            for refresh in (False, True):
                verdicts = self._attempt(list(submissions), all_or_nothing=True, refresh=refresh)
                if verdicts is not None:
                    return verdicts
        return [self.submit(s) for s in submissions]

    async def asubmit(
        self, appender: AsyncAppender, submission: Submission, *, riders: Riders | None = None
    ) -> Verdict | None:
        """``submit`` awaited on ``appender`` when it needs no more than CPU and one append: else None.

        None for no cached state, the run busy in another thread, a rejection to explain, a lost
        race or a store error; the caller then calls ``submit`` in a thread, which decides again from
        the store and answers ``duplicate`` if this try did commit after all.
        """
        stripe = self.cache.stripe(submission.run_id)
        if not appender.ready() or not stripe.acquire(blocking=False):  # never block the loop
            return None
        try:
            state = self.cache.get(submission.run_id)
            registry = self.cache.get(REGISTRY_RUN)
            if state is None or registry is None or (not registry.opened and self._unopened_expired()):
                return None
            if session_to_judge(state, submission, self.clock.now()):
                return None  # asking the store whether the holder's session lives would block the loop
            states = {submission.run_id: state}
            read = None if submission.run_id == REGISTRY_RUN else _opened(registry)  # else it is in ``states``
            draft = self._draft([submission], states, read, refresh=False, all_or_nothing=True)
            if not isinstance(draft, _Draft) or draft.blobs:  # a handoff's blobs take the sync path
                return None
            try:
                await appender.insert_events(draft.stored, fences=draft.fences, submissions=draft.rows, riders=riders)
            except PersistenceError:
                return None
            self._stored(draft)
            return draft.verdicts[0]
        finally:
            stripe.release()

    def _attempt(self, batch: list[Submission], *, refresh: bool, all_or_nothing: bool = False) -> list[Verdict] | None:
        """One try: verdicts, or None when the caller should refresh and try again.

        Without ``refresh`` the cached state is trusted for the decision; a rejection decided on
        it is not trusted (the cache may be behind): the caller refreshes and decides again.
        """
        run_ids = sorted({s.run_id for s in batch})
        try:
            registry = None if REGISTRY_RUN in run_ids else self._registry(refresh=refresh)
        except (OperationalError, InterfaceError) as exc:
            raise errors.StoreUnavailable(f"store unavailable: {exc}") from exc
        with self.cache.locked(run_ids):
            try:
                states = {run_id: self.current(run_id, refresh=refresh) for run_id in run_ids}
                draft = self._draft(batch, states, registry, refresh=refresh, all_or_nothing=all_or_nothing)
                if not isinstance(draft, _Draft):
                    return draft
                try:
                    self.store.insert_events(
                        draft.stored, fences=draft.fences, submissions=draft.rows, blobs=draft.blobs
                    )
                except (DuplicateSubmission, FenceViolation, AppendConflict) as failure:
                    return None if all_or_nothing else self._after_failed_append(batch[0], failure)
            except (OperationalError, InterfaceError) as exc:  # reads included: a verdict, or this
                raise errors.StoreUnavailable(f"store unavailable: {exc}") from exc
            self._stored(draft)
            return draft.verdicts

    def _stored(self, draft: _Draft) -> None:
        """``draft`` is in the store: cache its states, count the leases it ended by force."""
        self.cache.put(draft.after)
        ended = sum(1 for event in draft.pending if isinstance(event.recorded.body, LeaseExpired))
        if ended:  # rare: the lock is taken only then (appends of other runs run in other threads)
            with self._tally:
                self.lease_takeovers += ended

    def _registry(self, *, refresh: bool) -> RunState | None:
        """The principal registry's state, if the store has one: cached states are never changed, so
        a cached one is read without its lock; folding it takes the lock, and lets go before any other.

        An open registry is fenced by every append, so a cached one is refreshed only on a retry. A
        store without one has nothing to fence: the ledger looks for its run row again at most every
        ``UNOPENED_RECHECK_S``, so a registry opened by another process binds this one within that.
        """
        registry = self.cache.get(REGISTRY_RUN)
        if registry is not None and not registry.opened and self._unopened_expired():
            if self.store.select_run(REGISTRY_RUN) is None:
                self._unopened_until = time.monotonic() + UNOPENED_RECHECK_S
            else:
                registry = None
        if registry is None or (refresh and registry.opened):
            with self.cache.locked([REGISTRY_RUN]):
                registry = self.current(REGISTRY_RUN)
            if not registry.opened:
                self._unopened_until = time.monotonic() + UNOPENED_RECHECK_S
        return _opened(registry)

    def _store_id(self) -> str:
        """This store's id (``baton store id``), read once: an import's claim must name it."""
        if self._this_store is None:
            identity = self.store.select_store_identity()
            if identity is None:
                raise errors.ClaimRequired("this store has no identity to be claimed for: run `baton store init`")
            self._this_store = identity.store_id
        return self._this_store

    def _unopened_expired(self) -> bool:
        return time.monotonic() >= self._unopened_until

    def _draft(
        self,
        batch: list[Submission],
        states: dict[str, RunState],
        registry: RunState | None,
        *,
        refresh: bool,
        all_or_nothing: bool,
    ) -> _Draft | list[Verdict] | None:
        """Decide and seal ``batch`` on working copies of ``states``: what to append, or the verdicts of
        a rejection, or None when the caller should refresh and try again. ``states`` are not changed.

        ``registry`` is the principal registry (None: the store has none, or it is in ``states``).
        Where it requires signatures, each submission is identified and its signature verified
        first, and the append fences the registry too, unchanged: a principal revoked meanwhile
        makes the append miss, and the retry decides on the registry that revoked it.
        """
        now = self.clock.now()
        working = {run_id: working_copy(state) for run_id, state in states.items()}
        pending: list[StoredRunEvent] = []
        rows: list[SubmissionRow] = []
        verdicts: list[Verdict] = []
        blobs: dict[str, bytes] = {}
        for submission in batch:
            state = working[submission.run_id]
            try:
                signed = _authenticate(working.get(REGISTRY_RUN, registry), state, submission)
                session = session_to_judge(state, submission, now)  # "" on every ordinary append
                gone = bool(session) and not self.store.session_alive(session)
                bodies = decide(state, submission, now, holder_gone=gone)
                if isinstance(submission.command, AcceptHandoff) and not state.opened:
                    check_claim(submission.command, self._store_id())  # an import: the document is checked
            except errors.Rejection as rejection:
                if all_or_nothing or not refresh:
                    return None
                return [self._after_rejection(submission, rejection)]
            blobs |= blobs_of(submission.command, bodies)
            epoch = envelope_epoch(state, submission, bodies)
            for recorded, stored in seal_stored(
                state.run_id, state.version, state.head_digest, submission, epoch, bodies, now, signed=signed
            ):
                apply(state, recorded)
                pending.append(StoredRunEvent.of(recorded, stored))
            digest = submission_digest(submission)
            rows.append(SubmissionRow(submission.submission_id, state.run_id, digest, state.version))
            verdicts.append(_accepted(submission, state.run_id, state.version, pending[-1].recorded.body))
        fences = [fence_for(states[run_id], working[run_id]) for run_id in sorted(states)]
        if registry is not None and registry.signatures_required:
            fences.append(fence_for(registry, registry))  # read, not changed: it must still be the same
        return _Draft(list(working.values()), pending, fences, rows, verdicts, blobs)

    def _after_failed_append(self, submission: Submission, failure: Exception) -> list[Verdict] | None:
        if isinstance(failure, DuplicateSubmission):
            return [self._duplicate_or_conflict(submission)]
        if (
            isinstance(failure, FenceViolation)
            and failure.run_id == submission.run_id  # not the registry's fence: that is a lost race
            and not isinstance(submission.command, _UNFENCED)
            and (failure.epoch != submission.epoch or failure.holder != submission.worker)
        ):
            return [self._after_rejection(submission, _stale(submission, failure))]
        return None

    def _after_rejection(self, submission: Submission, rejection: errors.Rejection) -> Verdict:
        """A rejected retry of an accepted submission is still a duplicate: look before rejecting."""
        recorded = self.store.select_submission(submission.submission_id)
        if recorded is not None:
            return self._duplicate_or_conflict(submission, recorded)
        return _rejected(submission, rejection)

    def _duplicate_or_conflict(self, submission: Submission, recorded: SubmissionRow | None = None) -> Verdict:
        recorded = recorded or self.store.select_submission(submission.submission_id)
        if recorded is None:
            msg = f"submission {submission.submission_id!r} was refused as a duplicate but has no stored row"
            raise errors.StoreUnavailable(msg)
        if recorded.run_id == submission.run_id and same_content(recorded.content_digest, submission):
            quoted = (
                context_digest(submission.command.context) if isinstance(submission.command, RecordIntent) else None
            )
            return Verdict(
                submission.submission_id,
                "duplicate",
                submission.run_id,
                position=recorded.position,
                context_digest=quoted,
            )
        conflict = errors.SubmissionConflict(
            f"submission id {submission.submission_id!r} was used for different content (position {recorded.position})"
        )
        return _rejected(submission, conflict)


def _opened(registry: RunState) -> RunState | None:
    return registry if registry.opened else None


def _authenticate(registry: RunState | None, state: RunState, submission: Submission) -> str | None:
    """Who sent ``submission``, proven by its signature, and whether their roles allow it (else a
    rejection); the signed digest, once verified (None: nothing verified)."""
    key = identity.identify(registry, submission)
    signed = verify_signature(key, submission) if key is not None else None
    holder = registry.principals.get(state.holder) if registry is not None and state.holder else None
    identity.require_role(registry, submission, holder.public_key if holder is not None else None)
    return signed


def _stale(submission: Submission, violation: FenceViolation) -> errors.StaleEpoch:
    msg = (
        f"{submission.worker!r} at epoch {submission.epoch} does not hold the lease "
        f"(current epoch {violation.epoch}, holder {violation.holder!r})"
    )
    return errors.StaleEpoch(msg, current_epoch=violation.epoch)


def _accepted(submission: Submission, run_id: str, position: int, last: Event) -> Verdict:
    """Accepted at ``position``; an intent's verdict quotes the context digest its event recorded."""
    quoted = last.context_digest if isinstance(last, IntentRecorded) else None
    return Verdict(submission.submission_id, "accepted", run_id, position=position, context_digest=quoted)


def _rejected(submission: Submission, error: errors.BatonError) -> Verdict:
    return Verdict(
        submission.submission_id,
        "rejected",
        submission.run_id,
        reason=error.reason,
        message=error.message,
        current_epoch=getattr(error, "current_epoch", None),
    )
