"""The run ledger: an eventsourcing application whose only verb is *submit*.

``submit`` loads the run's state (cached, caught up by position), asks the pure domain to decide,
seals the new events into the hash chain and appends them with the fence in the same transaction.
A retry of an accepted submission returns the original verdict; a fence failure returns
``stale_epoch`` with the current epoch; a lost race reloads and decides again.
"""

from __future__ import annotations

import contextlib
import functools
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Generator, Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar, NamedTuple, cast

import msgspec
from eventsourcing.application import Application
from eventsourcing.persistence import (
    IntegrityError,
    InterfaceError,
    Mapper,
    OperationalError,
    PersistenceError,
    StoredEvent,
)

from baton.adapters.clock import Clock, SystemClock
from baton.adapters.eventstore.fenced import (
    MAX_EVENTS_PER_APPEND,
    AppendConflict,
    DuplicateSubmission,
    FenceViolation,
    Riders,
    RunRow,
    SubmissionRow,
)
from baton.adapters.eventstore.mapper import MsgspecMapper, StoredRunEvent, decode_recorded
from baton.domain import errors
from baton.domain.canonical import digest_of
from baton.domain.chain import ChainReport, seal_stored, verify_chain
from baton.domain.commands import AcceptHandoff, AcquireLease, ExpireLease, OpenRun, Submission, Verdict
from baton.domain.decide import decide, envelope_epoch, positional_text, screened_texts
from baton.domain.errors import ChainBroken
from baton.domain.events import IntentRecorded, RecordedEvent
from baton.domain.fencing import Fence, fence_for
from baton.domain.state import RunState, apply, fold
from baton.projections.portable_state import PortableStateFold
from baton.projections.replay import PrefixOutline, ReplayCursor, ReplayStep, prefix_steps

if TYPE_CHECKING:
    from baton.adapters.eventstore.postgres_async import AsyncAppends

__all__ = ["SNAPSHOT_EVERY", "RunLedger", "submission_digest"]

_SUBMISSION_PREFIX = b"baton.submission.v2\x00"
_FIRST_SUBMISSION_PREFIX = b"baton.submission.v1\x00"  # rows from before 2026-11-30, or of commands without a text
_UNFENCED = (OpenRun, AcquireLease, ExpireLease, AcceptHandoff)  # a lost race is re-decided, not called stale
_MAX_ATTEMPTS = 16
_CACHE_SIZE = 1024
_SNAPSHOT_TOPIC = "projections.portable_state:ResumeState.v3"
SNAPSHOT_EVERY = 100  # snapshots are ~1 KiB: a resume never folds more than 99 events past one


_ids = msgspec.json.Encoder()
_first_form_encoder = msgspec.json.Encoder(order="sorted")


def submission_digest(submission: Submission, command_text: bytes | None = None) -> str:
    """The content digest that tells a retry (same digest) from a conflicting reuse of an id.

    The digest of the submission's ids and epoch (a JSON array) followed by its command's positional
    text (``domain.decide.positional_text``), which screening a batch has written already
    (``command_text``): no second encoding of the command. As in the first form, JSON keeps every
    type distinct (``1`` is not ``"1"``) and keys are sorted, so two submissions share a digest
    exactly when their sorted JSON is equal. A command without a positional text (one screening must
    walk, or a field holding what it is not declared as) is digested in the first form.
    """
    text = command_text if command_text is not None else positional_text(submission.command)
    if text is None:
        return _first_form_digest(submission)
    ids = _ids.encode((submission.submission_id, submission.run_id, submission.worker, submission.epoch))
    return digest_of(_SUBMISSION_PREFIX, ids, text)


def _first_form_digest(submission: Submission) -> str:
    """The digest of the submission's sorted JSON: the form of rows written before 2026-11-30, and of
    commands without a positional text.

    Encoding a whole submission with sorted keys a second time cost a tenth of deciding a batch.
    """
    return digest_of(_FIRST_SUBMISSION_PREFIX, _first_form_encoder.encode(submission))


def _same_content(content_digest: str, submission: Submission) -> bool:
    """Whether a stored submission row's digest is this submission's, in either form (the first only if need be)."""
    return content_digest == submission_digest(submission) or content_digest == _first_form_digest(submission)


class RunLedger(Application[str]):
    name = "BatonLedger"
    env: ClassVar[dict[str, str]] = {"ORIGINATOR_ID_TYPE": "text"}

    def __init__(self, env: dict[str, str] | None = None, *, clock: Clock | None = None) -> None:
        super().__init__(env)
        self.clock: Clock = clock or SystemClock()
        self.snapshot_recorder = self.factory.aggregate_recorder(purpose="snapshots")
        self._states: OrderedDict[str, RunState] = OrderedDict()
        self._lock = threading.Lock()
        self._stripes = [threading.Lock() for _ in range(64)]

    def construct_mapper(self) -> Mapper[str]:
        return MsgspecMapper(transcoder=self.factory.transcoder())

    # -- reading -----------------------------------------------------------------------------

    def stored(
        self, run_id: str, *, after: int = 0, upto: int | None = None, limit: int | None = None
    ) -> Sequence[StoredEvent]:
        return self.recorder.select_events(run_id, gt=after or None, lte=upto, limit=limit)

    def history(
        self, run_id: str, *, after: int = 0, upto: int | None = None, page: int = 1000
    ) -> Generator[RecordedEvent, None, None]:
        """A run's events in position order, streamed (or fetched page by page) so memory stays flat."""
        stream = getattr(self.recorder, "stream_events", None)
        if stream is not None:
            for topic, state in stream(run_id, after=after, upto=upto):
                yield decode_recorded(topic, state)
            return
        while True:
            last = after + page if upto is None else min(after + page, upto)
            batch = self.stored(run_id, after=after, upto=last)
            for stored in batch:
                yield decode_recorded(stored.topic, stored.state)
            if not batch or last == upto or batch[-1].originator_version < last:
                return
            after = last

    def resume_fold(self, run_id: str, *, snapshots: bool = True) -> PortableStateFold:
        """Everything a resume needs, folded from the latest snapshot plus the events after it.

        A snapshot is a cache, never evidence: the first event after it must chain onto the
        snapshot's head digest, or the snapshot is ignored and the run is folded from scratch.
        After folding ``SNAPSHOT_EVERY`` or more events a new snapshot is written.
        """
        fold = self._latest_snapshot(run_id) if snapshots else None
        if fold is None:
            fold = PortableStateFold(run_id)
        start, folded = fold.run.version, 0
        chained = True
        with contextlib.closing(self.history(run_id, after=start)) as events:  # frees the stream's connection
            for event in events:
                if folded == 0 and start and event.prev_digest != fold.run.head_digest:
                    chained = False  # the snapshot does not chain onto the log: ignore it
                    break
                fold.apply(event)
                folded += 1
        if not chained:
            return self.resume_fold(run_id, snapshots=False)
        if snapshots and folded >= SNAPSHOT_EVERY:
            self._write_snapshot(fold)
        return fold

    def replay_steps(self, run_id: str, outline: PrefixOutline) -> Iterator[ReplayStep]:
        """The settled steps of a run's replay prefix, streamed from the log after the prefix's start."""
        with contextlib.closing(self.history(run_id, after=outline.start)) as events:
            yield from prefix_steps(events, outline.length)

    def replay_cursor(self, run_id: str, outline: PrefixOutline) -> ReplayCursor:
        """A cursor over the run's replay prefix that holds one step at a time."""
        return ReplayCursor(outline, self.replay_steps(run_id, outline))

    def _latest_snapshot(self, run_id: str) -> PortableStateFold | None:
        latest = self.snapshot_recorder.select_events(run_id, desc=True, limit=1)
        if not latest or latest[0].topic != _SNAPSHOT_TOPIC:
            return None  # none yet, or written by an older build in another shape: fold from scratch
        return PortableStateFold.from_bytes(latest[0].state)

    def _write_snapshot(self, fold: PortableStateFold) -> None:
        run = fold.run
        snapshot = StoredEvent(run.run_id, run.version, _SNAPSHOT_TOPIC, fold.to_bytes())
        with contextlib.suppress(IntegrityError):  # another process wrote this position's snapshot
            self.snapshot_recorder.insert_events([snapshot])

    def all_events(self, *, after: int = 0, page: int = 1000) -> Iterator[tuple[int, RecordedEvent]]:
        """Every event of every run in the global (notification) order, with its notification id."""
        select_log = getattr(self.recorder, "select_log", None)
        while True:
            if select_log is not None:  # PostgreSQL: three columns as tuples
                rows: list[tuple[int, str, bytes]] = select_log(after, page)
            else:
                rows = [
                    (n.id, n.topic, n.state)
                    for n in self.recorder.select_notifications(after, page, inclusive_of_start=False)
                ]
            for notification_id, topic, state in rows:
                yield notification_id, decode_recorded(topic, state)
            if len(rows) < page:
                return
            after = rows[-1][0]

    def state(self, run_id: str) -> RunState:
        """The run's current state: a private copy the caller may keep."""
        with self._run_locks([run_id]):
            return fold([], self._current(run_id))

    def verify(self, run_id: str) -> ChainReport:
        """Verify the chain, then anchor it to the run row: a cut-off tail leaves a valid but short chain.

        The run row is written in the same transaction as every append, so it is an independent
        witness of the head; an auditor who also anchors head digests elsewhere (issue 7) closes
        the remaining gap of an attacker who rewrites both.
        """
        report = verify_chain((s.state for s in self.stored(run_id)), run_id=run_id)
        row: RunRow | None = self.recorder.select_run(run_id)  # type: ignore[attr-defined]
        if row is not None and (report.events, report.head_digest) != (row.head, row.head_digest):
            missing = report.events + 1 if report.events < row.head else row.head
            msg = (
                f"position {missing}: the log ends at {report.events} ({report.head_digest}) but the run row "
                f"records head {row.head} ({row.head_digest})"
            )
            raise ChainBroken(msg, missing)
        return report

    def runs(self) -> list[RunRow]:
        rows: list[RunRow] = self.recorder.select_runs()  # type: ignore[attr-defined]
        return rows

    def _current(self, run_id: str, *, refresh: bool = True) -> RunState:
        """Cached state, caught up with the store unless ``refresh`` is off; owned by the ledger.

        Callers that change it hold the run's stripe lock, and drop it from the cache on failure.
        Skipping the catch-up read is safe for appends: the fence rejects a decision made on a
        stale state, and the ledger then refreshes and decides again.
        """
        if not refresh:  # the common case: the cached state as it is, marked most recently used
            with self._lock:
                state = self._states.get(run_id)
                if state is not None:
                    self._states.move_to_end(run_id)
                    return state
        with self._lock:
            state = self._states.pop(run_id, None)
        if state is None:
            state, refresh = RunState(run_id=run_id), True
        if refresh:
            for stored in self.stored(run_id, after=state.version):
                apply(state, decode_recorded(stored.topic, stored.state))
        with self._lock:
            self._states[run_id] = state
            while len(self._states) > _CACHE_SIZE:
                self._states.popitem(last=False)
        return state

    # -- writing -----------------------------------------------------------------------------

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
                self._forget_all([submission.run_id])
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

    def _attempt(self, batch: list[Submission], *, refresh: bool, all_or_nothing: bool = False) -> list[Verdict] | None:
        """One try: verdicts, or None when the caller should refresh and try again.

        Without ``refresh`` the cached state is trusted for the decision; a rejection decided on
        it is not trusted (the cache may be behind): the caller refreshes and decides again.
        """
        run_ids = sorted({s.run_id for s in batch})
        if len(run_ids) == 1:  # the common case, without the ExitStack of ``_run_locks``
            with self._stripes[hash(run_ids[0]) % len(self._stripes)]:
                return self._attempt_locked(batch, run_ids, refresh=refresh, all_or_nothing=all_or_nothing)
        with self._run_locks(run_ids):
            return self._attempt_locked(batch, run_ids, refresh=refresh, all_or_nothing=all_or_nothing)

    def _attempt_locked(
        self, batch: list[Submission], run_ids: list[str], *, refresh: bool, all_or_nothing: bool
    ) -> list[Verdict] | None:
        states = {run_id: self._current(run_id, refresh=refresh) for run_id in run_ids}
        draft = self._draft(batch, states, refresh=refresh, all_or_nothing=all_or_nothing)
        if not isinstance(draft, _Draft):
            return draft
        try:
            self.recorder.insert_events(draft.stored, fences=draft.fences, submissions=draft.rows)
        except BaseException as exc:
            return self._after_append_error(draft, exc, batch[0], all_or_nothing=all_or_nothing)
        return draft.verdicts

    def _draft(
        self, batch: list[Submission], states: dict[str, RunState], *, refresh: bool, all_or_nothing: bool
    ) -> _Draft | list[Verdict] | None:
        """Decide and seal ``batch`` on ``states`` (changed in place): what to append, or the verdicts of a
        rejection, or None when the caller should refresh and try again. Pure CPU unless a trusted
        rejection must look for an earlier recording of the submission."""
        now = self.clock.now()
        before = {run_id: _undo_point(state) for run_id, state in states.items()}
        pending: list[StoredRunEvent] = []
        rows: list[SubmissionRow] = []
        verdicts: list[Verdict] = []
        texts = screened_texts([submission.command for submission in batch])
        try:
            for index, submission in enumerate(batch):
                state = states[submission.run_id]
                encoded: list[bytes | None] = []
                try:
                    bodies = decide(state, submission, now, encoded, screened=texts is not None)
                except errors.Rejection as rejection:
                    self._roll_back(before, pending)  # earlier submissions of the batch were applied in place
                    if all_or_nothing or not refresh:
                        return None
                    return [self._after_rejection(submission, rejection)]
                epoch = envelope_epoch(state, submission, bodies)
                for recorded, stored in seal_stored(
                    state.run_id, state.version, state.head_digest, submission, epoch, bodies, now, encoded
                ):
                    if type(recorded.body) is not IntentRecorded:
                        _own_operations(before[state.run_id], state)
                    apply(state, recorded)
                    pending.append(StoredRunEvent.of(recorded, stored))
                digest = submission_digest(submission, None if texts is None else texts[index])
                rows.append(SubmissionRow(submission.submission_id, state.run_id, digest, state.version))
                verdicts.append(Verdict(submission.submission_id, "accepted", state.run_id, position=state.version))
        except BaseException:  # a bug or an interrupt mid-batch: the copies may hold unstored events too
            self._forget_all(list(states))
            raise
        fences = [fence_for(before[run_id], states[run_id]) for run_id in sorted(states)]
        return _Draft(before, pending, fences, rows, verdicts)

    def _after_append_error(
        self, draft: _Draft, exc: BaseException, first: Submission, *, all_or_nothing: bool
    ) -> list[Verdict] | None:
        """Undo a draft whose append raised ``exc``: the verdicts to give, None to try again, or raise."""
        self._roll_back(draft.before, draft.pending)  # the cached states hold events that were never stored
        if isinstance(exc, DuplicateSubmission | FenceViolation | AppendConflict):
            return None if all_or_nothing else self._after_failed_append(first, exc)
        if isinstance(exc, OperationalError | InterfaceError):
            raise errors.StoreUnavailable(f"store unavailable: {exc}") from exc
        raise exc

    async def asubmit(self, submission: Submission, *, riders: Riders | None = None) -> Verdict | None:
        """Submit from an event loop without blocking it: the verdict when the submission is accepted at once.

        The same decision and the same one statement as ``submit``, awaited on an asyncio connection
        (PostgreSQL), with ``riders`` in the statement (see ``FencedPostgresRecorder.riding``). None
        whenever that would need more than CPU and that statement: no async store, no cached state,
        the run busy in another thread, a rejection to explain, a lost race, a store error. Then
        call ``submit`` with the same submission (in a thread): it decides again from the store, and
        if this try did commit after all, it answers ``duplicate`` with the position.
        """
        appends = self.async_appends
        stripe = self._stripes[hash(submission.run_id) % len(self._stripes)]
        if appends is None or not appends.ready() or not stripe.acquire(blocking=False):  # never block the loop
            return None
        try:
            with self._lock:
                state = self._states.get(submission.run_id)
            if state is None:
                return None
            draft = self._draft([submission], {submission.run_id: state}, refresh=False, all_or_nothing=True)
            if not isinstance(draft, _Draft):
                return None
            try:
                await appends.insert_events(draft.stored, fences=draft.fences, submissions=draft.rows, riders=riders)
            except PersistenceError:
                self._roll_back(draft.before, draft.pending)
                return None
            except BaseException:  # cancelled mid-statement: it may have committed; the cache stays a prefix
                self._roll_back(draft.before, draft.pending)
                raise
            return draft.verdicts[0]
        finally:
            stripe.release()

    @functools.cached_property
    def async_appends(self) -> AsyncAppends | None:
        """The recorder's appends on asyncio connections, or None where the store has none (SQLite, memory)."""
        factory = getattr(self.recorder, "async_appends", None)
        return factory() if factory is not None else None

    def close(self) -> None:
        appends = self.__dict__.get("async_appends")  # only if one was made
        if appends is not None:
            appends.close()
        close_recorder = getattr(self.recorder, "close", None)  # a connection it keeps (PostgreSQL)
        if close_recorder is not None:
            close_recorder()
        super().close()

    def _forget_all(self, run_ids: Sequence[str]) -> None:
        """Drop the cached states: the next decision folds the runs again from the log (self-healing)."""
        with self._lock:
            for run_id in run_ids:
                self._states.pop(run_id, None)

    def _roll_back(self, before: dict[str, RunState], pending: Sequence[StoredRunEvent]) -> None:
        """Put back the states as they were before the attempt: a prefix of the log, maybe stale.

        Forgetting them instead would make the next decision fold the run from its first event
        (the write side needs every op id): O(run length) for every lost race, which is every
        request when two services share a run. A stale prefix costs one fence miss and a tail read.
        """
        for event in pending:
            body = event.recorded.body
            if isinstance(body, IntentRecorded):  # how an intent grows the shared ``op_ids`` and ``operations``
                undo = before[event.recorded.run_id]
                undo.operations.pop(body.op_id, None)
                if undo.op_ids is not None:
                    undo.op_ids.discard(body.op_id)
        with self._lock:
            for run_id, state in before.items():
                self._states[run_id] = state

    def _after_failed_append(self, submission: Submission, failure: Exception) -> list[Verdict] | None:
        if isinstance(failure, DuplicateSubmission):
            return [self._duplicate_or_conflict(submission)]
        if (
            isinstance(failure, FenceViolation)
            and not isinstance(submission.command, _UNFENCED)
            and (failure.epoch != submission.epoch or failure.holder != submission.worker)
        ):
            return [self._after_rejection(submission, _stale(submission, failure))]
        return None

    @contextlib.contextmanager
    def _run_locks(self, run_ids: list[str]) -> Iterator[None]:
        """Per-run mutual exclusion inside this process (the store fences across processes)."""
        stripes = sorted({hash(run_id) % len(self._stripes) for run_id in run_ids})
        with contextlib.ExitStack() as stack:
            for stripe in stripes:
                stack.enter_context(self._stripes[stripe])
            yield

    def _after_rejection(self, submission: Submission, rejection: errors.Rejection) -> Verdict:
        """A rejected retry of an accepted submission is still a duplicate: look before rejecting."""
        recorded = self.recorder.select_submission(submission.submission_id)  # type: ignore[attr-defined]
        if recorded is not None:
            return self._duplicate_or_conflict(submission, recorded)
        return _rejected(submission, rejection)

    def _duplicate_or_conflict(self, submission: Submission, recorded: SubmissionRow | None = None) -> Verdict:
        recorded = recorded or self.recorder.select_submission(submission.submission_id)  # type: ignore[attr-defined]
        assert recorded is not None, "a duplicate submission must have a stored row"
        if recorded.run_id == submission.run_id and _same_content(recorded.content_digest, submission):
            return Verdict(submission.submission_id, "duplicate", submission.run_id, position=recorded.position)
        conflict = errors.SubmissionConflict(
            f"submission id {submission.submission_id!r} was used for different content (position {recorded.position})"
        )
        return _rejected(submission, conflict)


class _Draft(NamedTuple):
    """A decided, sealed attempt not yet appended; ``before`` is what to roll the cached states back to."""

    before: dict[str, RunState]
    pending: list[StoredRunEvent]
    fences: list[Fence]
    rows: list[SubmissionRow]
    verdicts: list[Verdict]

    @property
    def stored(self) -> Sequence[StoredEvent]:
        """``pending`` as a recorder takes it: each has the four fields of a ``StoredEvent`` it reads."""
        return cast("Sequence[StoredEvent]", self.pending)


def _undo_point(state: RunState) -> RunState:
    """A copy to roll back to: its own small maps; ``op_ids`` and ``operations`` stay shared.

    Copying ``operations`` for every batch cost time in proportion to the open intents (24 µs per
    batch and run at 5,000). An intent only adds an entry, which rolling back removes again; before
    any other event (an observation removes one) ``_own_operations`` gives the undo point its copy.
    """
    return msgspec.structs.replace(
        state, grants=dict(state.grants), approvals=dict(state.approvals), evidence=dict(state.evidence)
    )


def _own_operations(undo: RunState, state: RunState) -> None:
    """The undo point's own copy of the open operations, taken before an event that may remove or replace one."""
    if undo.operations is state.operations:
        undo.operations = dict(state.operations)


def _stale(submission: Submission, violation: FenceViolation) -> errors.StaleEpoch:
    msg = (
        f"{submission.worker!r} at epoch {submission.epoch} does not hold the lease "
        f"(current epoch {violation.epoch}, holder {violation.holder!r})"
    )
    return errors.StaleEpoch(msg, current_epoch=violation.epoch)


def _rejected(submission: Submission, error: errors.BatonError) -> Verdict:
    return Verdict(
        submission.submission_id,
        "rejected",
        submission.run_id,
        reason=error.reason,
        message=error.message,
        current_epoch=getattr(error, "current_epoch", None),
    )
