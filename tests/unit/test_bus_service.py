"""The bus service's group commit, with a fake ledger: batches, answers, rejections, stop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from baton.adapters.bus.service import SubmissionService
from baton.adapters.wire import encode_submission
from baton.domain.commands import ReleaseLease, Submission, Verdict
from baton.domain.events import RecordedEvent


class FakeLedger:
    """Accepts everything; ``gate`` holds the first batch until the test opens it, and ``entered`` says
    that a batch has reached the ledger."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail = False

    def submit(self, submission: Submission) -> Verdict:
        return self.submit_many([submission])[0]

    def submit_many(self, submissions: Sequence[Submission]) -> list[Verdict]:
        self.entered.set()
        self.gate.wait(10)
        if self.fail:
            raise RuntimeError("the store broke")
        self.batches.append([s.submission_id for s in submissions])
        return [Verdict(s.submission_id, "accepted", s.run_id, position=1) for s in submissions]

    def all_events(self, *, after: int = 0, page: int = 1000) -> Iterator[tuple[int, RecordedEvent]]:
        return iter(())


class Recorder:
    """An ``Answers`` that keeps every call."""

    def __init__(self) -> None:
        self.calls: list[list[tuple[Any, Verdict]]] = []
        self.abandoned: list[Any] = []
        self.done = asyncio.Event()

    async def answer(self, answers: list[tuple[Any, Verdict]]) -> None:
        self.calls.append(answers)
        self.done.set()

    def abandon(self, tokens: list[Any], exc: BaseException) -> None:
        self.abandoned.extend(tokens)


def release(sid: str, run_id: str = "run-1") -> Submission:
    return Submission(sid, run_id, "w", ReleaseLease(), 1)


async def holding_a_batch(ledger: FakeLedger, answers: Recorder) -> SubmissionService:
    """A started service whose first batch (``s0``) is in the store, held at the ledger's gate."""
    service = SubmissionService(ledger)
    await service.start()
    ledger.gate.clear()
    ledger.entered.clear()
    service.enqueue(release("s0"), answers, "t0")
    assert await asyncio.to_thread(ledger.entered.wait, 10), "the first batch never reached the ledger"
    return service


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_submissions_queued_while_a_batch_commits_are_answered_in_one_call() -> None:
    """While the first batch is in the store, the next ones gather and come back in one answer call."""
    ledger, answers = FakeLedger(), Recorder()

    async def scenario() -> None:
        service = await holding_a_batch(ledger, answers)
        for i in range(1, 6):
            service.enqueue(release(f"s{i}"), answers, f"t{i}")
        ledger.gate.set()
        while sum(len(call) for call in answers.calls) < 6:
            answers.done.clear()
            await answers.done.wait()
        await service.stop()

    run(scenario())
    assert ledger.batches == [["s0"], ["s1", "s2", "s3", "s4", "s5"]]
    assert [[token for token, _ in call] for call in answers.calls] == [["t0"], ["t1", "t2", "t3", "t4", "t5"]]
    assert all(verdict.verdict == "accepted" for call in answers.calls for _, verdict in call)


def test_handle_answers_bad_input_without_the_ledger_and_good_input_with_it() -> None:
    """A malformed or misaddressed message gets its rejection at once; a good one its ledger verdict."""
    ledger = FakeLedger()

    async def scenario() -> list[Verdict]:
        service = SubmissionService(ledger)
        try:
            return [
                await service.handle(b"{not json", run_id="run-1"),
                await service.handle(encode_submission(release("s1")), run_id="run-2"),
                await service.handle(encode_submission(release("s2")), run_id="run-1"),
            ]
        finally:
            await service.stop()

    malformed, misaddressed, good = run(scenario())
    assert (malformed.verdict, malformed.reason) == ("rejected", "malformed")
    assert (misaddressed.verdict, misaddressed.reason, misaddressed.submission_id) == ("rejected", "malformed", "s1")
    assert (good.verdict, good.submission_id) == ("accepted", "s2")
    assert ledger.batches == [["s2"]]


def test_a_store_error_answers_store_unavailable_and_the_service_keeps_going() -> None:
    """An unexpected store error becomes a retryable rejection for the batch, and the next batch works."""
    ledger = FakeLedger()

    async def scenario() -> tuple[Verdict, Verdict]:
        service = SubmissionService(ledger)
        try:
            ledger.fail = True
            first = await service.submit(release("s1"))
            ledger.fail = False
            return first, await service.submit(release("s2"))
        finally:
            await service.stop()

    first, second = run(scenario())
    assert (first.verdict, first.reason) == ("rejected", "store_unavailable")
    assert second.verdict == "accepted"


def test_stop_abandons_what_was_never_taken_and_finishes_the_batch_in_the_store() -> None:
    """A stop lets the batch being appended finish and answers the rest with an abandonment."""
    ledger, answers = FakeLedger(), Recorder()

    async def scenario() -> None:
        service = await holding_a_batch(ledger, answers)
        service.enqueue(release("s1"), answers, "t1")
        stopping = asyncio.ensure_future(service.stop())
        await asyncio.sleep(0.05)
        ledger.gate.set()
        await stopping

    run(scenario())
    assert ledger.batches == [["s0"]]
    assert [[token for token, _ in call] for call in answers.calls] == [["t0"]]
    assert answers.abandoned == ["t1"]
