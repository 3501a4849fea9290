"""``decide(state, submission, now) -> events``: every rule a submission must pass.

Pure: the clock reading is an argument, so lease expiry is judged by the store's injected clock and
never by a worker's. A rejection raises; nothing about it is ever stored.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import msgspec

from baton.domain import authority, errors, handoff, threads
from baton.domain.budgets import Usage
from baton.domain.canonical import OPAQUE_KEYS, canonical_bytes, digest_of, struct_canonical_bytes
from baton.domain.commands import (
    AbortHandoff,
    AcceptHandoff,
    AcquireLease,
    CompleteRun,
    DenyApproval,
    ExpireLease,
    FailRun,
    GrantApproval,
    GrantAuthority,
    OpenRun,
    PrepareHandoff,
    PurgeThread,
    ReconcileIntent,
    RecordEvidence,
    RecordIntent,
    RecordObservation,
    RecordTransition,
    ReleaseLease,
    RenewLease,
    ReserveStage,
    RevokeAuthority,
    SealCheckpoint,
    Submission,
)
from baton.domain.credentials import (
    MAX_DEPTH,
    MAX_NODES,
    credential_named,
    find_credential,
    is_credential_key,
    suspect_text,
)
from baton.domain.events import (
    BlobRef,
    CheckpointSealed,
    Event,
    IntentContext,
    IntentReconciled,
    IntentRecorded,
    LeaseExpired,
    LeaseGranted,
    LeaseReleased,
    LeaseRenewed,
    ObservationRecorded,
    RunCompleted,
    RunFailed,
    RunOpened,
    StageReserved,
    TransitionRecorded,
)
from baton.domain.stages import Stage, is_legal
from baton.domain.state import OpRecord, RunState

__all__ = [
    "CONTEXT_PREFIX",
    "envelope_epoch",
    "MAX_ID_LENGTH",
    "MAX_INLINE_BYTES",
    "MAX_LIST_ITEMS",
    "MAX_TEXT_LENGTH",
    "MAX_TTL_MS",
    "context_digest",
    "decide",
    "positional_text",
    "screened_texts",
]

MAX_ID_LENGTH = 200
MAX_TEXT_LENGTH = 4096
MAX_LIST_ITEMS = 256
MAX_INLINE_BYTES = 64 * 1024
_ID_FIELDS = frozenset(
    {"op_id", "stage_id", "checkpoint_id", "idempotency_key", "tool_contract", "worker", "release_id"}
)
MAX_TTL_MS = 24 * 3600 * 1000
CONTEXT_PREFIX = b"baton.intent-context.v1\x00"
_json = msgspec.json.Encoder(order="sorted")  # keys sorted, as in the first form of the content digest


def context_digest(context: IntentContext) -> str:
    """The digest an observation must quote to prove it answers exactly this intent."""
    return digest_of(CONTEXT_PREFIX, canonical_bytes(context))


def envelope_epoch(state: RunState, submission: Submission, bodies: list[Event]) -> int:
    """The epoch a submission's events are recorded under: the submitter's, which is a lease it takes
    in this very submission (acquire, import) but not one it hands on (a handoff's ``LeaseGranted``)."""
    for body in bodies:  # ``type is``: an ``isinstance`` that fails on a Struct class costs more than the rest
        if type(body) is LeaseGranted and body.worker == submission.worker:
            return body.epoch
    return state.epoch


def decide(  # noqa: C901, PLR0911, PLR0912
    state: RunState,
    submission: Submission,
    now: int,
    encoded: list[bytes | None] | None = None,
    *,
    screened: bool = False,
) -> list[Event]:
    """Return the events ``submission`` produces against ``state``, or raise a ``Rejection``.

    ``encoded``, when given, receives the canonical bytes (no newline) of the first events returned,
    as far as deciding wrote them anyway (an intent's context is written for its digest), for
    ``chain.seal_stored`` to splice in rather than write again. ``screened`` says that
    ``screened_texts`` cleared the command already (with the rest of its batch).
    """
    _check_ids(submission)
    if state.run_id and submission.run_id != state.run_id:
        raise errors.Malformed(f"submission for run {submission.run_id!r} decided against run {state.run_id!r}")
    command = submission.command
    if not screened:
        _screen(command)
    work = type(command) in _WORK_COMMANDS  # most submissions: neither unfenced nor a handoff's acceptance
    if not work and isinstance(command, _UNFENCED):
        return _unfenced(state, submission, command, now)
    if not work and isinstance(command, AcceptHandoff) and state.pending_handoff is None:
        # an import, or a refusal that does not depend on who asks (no handoff, or one already taken)
        return handoff.accept(state, submission, command, now + _ttl_us(command.ttl_ms))
    _require_run(state, submission)
    _check_fence(state, submission, now)
    if state.pending_handoff is not None and not isinstance(command, _WHILE_HANDOFF_PENDING):
        msg = f"handoff {state.pending_handoff} must be accepted (or aborted) before anything else"
        raise errors.HandoffPending(msg)
    # the work of a run first: most submissions are
    if isinstance(command, RecordIntent):
        if command.kind == "effect":
            authority.require_authority(state, submission.worker, command.context, now)
        return [_intent(state, command, encoded)]
    if isinstance(command, RecordObservation):
        return [_observation(state, command)]
    if isinstance(command, ReconcileIntent):
        return [_reconcile(state, command)]
    if isinstance(command, RecordTransition):
        return [_transition(state, command)]
    if isinstance(command, ReserveStage):
        if command.fuel < 0:
            raise errors.Malformed("fuel cannot be negative")
        charge = _charged(state, Usage(reserved_fuel=command.fuel))
        return [StageReserved(command.stage_id, command.fuel, charge)]
    if isinstance(command, RenewLease):
        return [LeaseRenewed(submission.worker, state.epoch, now + _ttl_us(command.ttl_ms))]
    if isinstance(command, ReleaseLease):
        return [LeaseReleased(submission.worker, state.epoch)]
    if isinstance(command, PrepareHandoff):
        return handoff.prepare(state, submission, command, now + _ttl_us(command.ttl_ms))
    if isinstance(command, AcceptHandoff):
        return handoff.accept(state, submission, command, now + _ttl_us(command.ttl_ms))
    if isinstance(command, AbortHandoff):
        return handoff.abort(state, command)
    if isinstance(command, RecordEvidence):
        return [authority.record_evidence(command)]
    if isinstance(command, SealCheckpoint):
        _require_settled(state, "seal a checkpoint")
        return [CheckpointSealed(command.checkpoint_id, state.stage, command.state_digest, command.state_ref)]
    if isinstance(command, threads.THREAD_COMMANDS):
        return threads.decide_thread(state, command)
    if isinstance(command, CompleteRun):
        _require_settled(state, "complete the run")
        if state.stage is Stage.COMMITTING:
            raise errors.IllegalTransition("cannot complete while COMMITTING; record COMMITTED first")
        return [RunCompleted(command.summary)]
    if isinstance(command, FailRun):
        return [RunFailed(command.reason, command.detail)]
    msg = f"unknown command {type(command).__name__}"  # pragma: no cover - the union is closed
    raise errors.Malformed(msg)  # pragma: no cover


_FromAuthority = GrantAuthority | RevokeAuthority | GrantApproval | DenyApproval
_FROM_AUTHORITIES = (GrantAuthority, RevokeAuthority, GrantApproval, DenyApproval)
_UNFENCED = (OpenRun, PurgeThread, AcquireLease, ExpireLease, *_FROM_AUTHORITIES)
_WHILE_HANDOFF_PENDING = (AcceptHandoff, AbortHandoff, RenewLease, ReleaseLease, FailRun)
_WORK_COMMANDS = frozenset({RecordIntent, RecordObservation, RecordTransition})


def _unfenced(
    state: RunState,
    submission: Submission,
    command: OpenRun | PurgeThread | AcquireLease | ExpireLease | _FromAuthority,
    now: int,
) -> list[Event]:
    """Commands whose sender need not hold the lease: to open, erase, take over, or grant."""
    if isinstance(command, OpenRun):
        return [_open(state, command)]
    if isinstance(command, PurgeThread):  # erasure is an operator's duty, also on a closed run
        _require_run(state, submission, closed=True)
        return threads.decide_purge(state, command)
    _require_run(state, submission)
    if isinstance(command, AcquireLease):
        return _acquire(state, submission, command, now)
    if isinstance(command, ExpireLease):
        return _expire(state, now)
    return [_from_authority(state, submission, command, now)]


def _require_run(state: RunState, submission: Submission, *, closed: bool = False) -> None:
    """The run exists and, unless ``closed`` ones will do, is neither completed nor failed."""
    if not state.opened:
        raise errors.RunNotFound(f"run {submission.run_id!r} does not exist")
    if state.closed and not closed:
        raise errors.RunClosed(f"run {state.run_id!r} is {state.status}")


def _check_ids(submission: Submission) -> None:
    ids = sid, run_id, worker = submission.submission_id, submission.run_id, submission.worker
    top = MAX_ID_LENGTH
    if not (sid and run_id and worker and len(sid) <= top and len(run_id) <= top and len(worker) <= top) or (
        "\x00" in sid or "\x00" in run_id or "\x00" in worker  # a key no SQL text column can hold
    ):
        for name, value in zip(("submission_id", "run_id", "worker"), ids, strict=True):  # name the first offender
            if not value or len(value) > MAX_ID_LENGTH or "\x00" in value:
                msg = f"{name} must be 1..{MAX_ID_LENGTH} characters, none of them NUL"
                raise errors.Malformed(msg)
    if submission.epoch < 0:
        raise errors.Malformed("epoch cannot be negative")


def _screen(command: Any) -> None:
    """Bounds first, then credentials; a JSON text of the command proves most commands pass both.

    The text is the command's positional text, so the prefilters read the values without the keys
    that every command of a class shares; the builtins are built and walked only when one is unsure.
    """
    if screened_texts((command,)) is not None:
        return
    plain = msgspec.to_builtins(command)
    _check_bounds(plain, "command")
    found = find_credential(plain)
    if found:
        raise errors.CredentialInPayload(f"the submission carries {found}: pass authority by reference")


def positional_text(command: Any) -> bytes | None:
    """The command's positional JSON text, or None when only a walk of its builtins can screen it.

    Its tag, then its fields' values in declaration order, fields declared as one Struct class
    likewise (``_keyless``); every other object is written with its keys, sorted. Within a class a
    position says what its value is, so two commands share a text exactly when their sorted JSON
    texts are equal (a property test holds it). Screening reads it, and the ledger digests it as a
    submission's content. None for a command that screening must walk: a value under a credential
    name, a negative size (both rejected), or a field holding what it is not declared as.
    """
    try:
        return _json.encode(_keyless(command))
    except Exception:  # whatever stops it, screening walks the builtins instead
        return None


def screened_texts(commands: Sequence[Any]) -> list[bytes] | None:
    """The positional texts of ``commands`` when one pass over them proves that each passes the walks
    of ``_screen`` (``_check_bounds`` and the credential walk), which then need not run; else None.

    For a batch: the bounds of each text alone (list items, size, nesting) are counted per text;
    the searches (escapes, long strings, negative sizes, credential formats and names) run once over
    the texts joined by newlines, which no JSON text holds: what they find in one text they find in
    the whole. None says only that each command must be screened on its own, where whatever stops
    this proof (a value that cannot be encoded, whatever it raises) meets its usual verdict.
    """
    try:
        texts = [_json.encode(_keyless(command)) for command in commands]  # ``positional_text``, inlined
    except Exception:  # screened alone, the error surfaces where it would have
        return None
    if not texts:
        return texts
    joined = b"\n".join(texts)
    longest = max(map(len, texts))
    if _each_surely_bounded(joined, longest) and _strings_surely_within_bounds(joined, longest=longest):
        return None if suspect_text(joined) else texts
    return None


def _each_surely_bounded(joined: bytes, longest: int) -> bool:
    """``_lists_surely_short`` and ``within_prefilter_bounds`` of every text of ``joined`` (JSON texts
    joined by newlines, which none holds; ``longest`` bytes at most), counted in C, not per text in Python.

    A text has no more commas than bytes, so a short longest text needs no comma count; otherwise
    deleting all but the commas (then all but the brackets) and splitting at the newlines leaves
    one piece per text, as long as its count. Per text in Python, these checks cost a sixth of
    screening a 1000-intent batch.
    """
    if longest >= 2 * MAX_NODES:
        return False
    if longest >= MAX_LIST_ITEMS and _most_per_text(joined, _ALL_BUT_COMMAS) >= MAX_LIST_ITEMS:
        return False
    return _most_per_text(joined, _ALL_BUT_OPENERS) < MAX_DEPTH


def _most_per_text(joined: bytes, all_but: bytes) -> int:
    """The most bytes of a kind in one text of ``joined``: ``all_but`` deletes every other byte but newlines."""
    return max(map(len, joined.translate(None, all_but).split(b"\n")))


_ALL_BUT_COMMAS = bytes(byte for byte in range(256) if byte not in b",\n")
_ALL_BUT_OPENERS = bytes(byte for byte in range(256) if byte not in b"{[\n")


class _Unsure(Exception):
    """Only the command's builtins can say: walk them."""


class _Plan(NamedTuple):
    """What ``_keyless`` needs of a Struct class: its tag, and the fields whose key makes their value matter."""

    tag: str | int | None
    sizes: tuple[int, ...]  # fields under ``size``: ``_check_bounds`` refuses a negative int there
    named: tuple[tuple[int, str], ...]  # fields under a credential name: ``find_credential`` looks at the value
    structs: tuple[tuple[int, type], ...]  # fields declared as one Struct class (or None): made keyless too


def _keyless(value: msgspec.Struct) -> list[Any]:
    """``value`` without its keys: its tag, then its fields' values, nested Structs keyless too.

    Its JSON text holds every container and every string of the JSON text of ``value``'s builtins
    (so the same or more of whatever the prefilters count) but the keys of Struct fields and tags:
    ``_plan`` screens those once per class, and the values under the few keys that matter are
    checked here. Other Structs (in lists, dicts, or fields not declared as one Struct class) keep
    their keys. A field declared as one Struct class holding anything but that class or None is
    ``_Unsure``: written positionally it could read as a value of the class (a list of its fields).
    """
    write = _KEYLESS.get(type(value))
    if write is None:
        write = _KEYLESS[type(value)] = _compile_keyless(_plan(type(value)))
    return write(value)


def _compile_keyless(plan: _Plan) -> Callable[[Any], list[Any]]:
    """``_keyless`` for the class of ``plan``, its checks written out: looping over the plan's
    (mostly empty) tuples cost about as much as the checks themselves, for every command."""
    lines = ["def write(v):", "    out = [tag, *astuple(v)]"]
    for index in plan.sizes:  # ``_check_bounds`` refuses a negative size
        lines += [f"    if type(x := out[{index}]) is int and x < 0:", "        raise Unsure"]
    for index, key in plan.named:  # the value under a credential name: settled here, or walked
        lines += [
            f"    if type(x := out[{index}]) is str:",
            f"        if x and named({key!r}, x):",
            "            raise Unsure",
            "    elif x is not None:",
            "        raise Unsure",
        ]
    for index, _ in plan.structs:
        lines += [
            f"    if type(x := out[{index}]) is C{index}:",
            f"        out[{index}] = keyless(x)",
            "    elif x is not None:",
            "        raise Unsure",
        ]
    lines.append("    return out")
    namespace: dict[str, Any] = {
        "tag": plan.tag,
        "astuple": msgspec.structs.astuple,
        "Unsure": _Unsure,
        "named": is_credential_key,
        "keyless": _keyless,
        **{f"C{index}": cls for index, cls in plan.structs},
    }
    exec("\n".join(lines) + "\n", namespace)  # generated from the plan: indices, and keys as literals
    write: Callable[[Any], list[Any]] = namespace["write"]
    return write


_KEYLESS: dict[type, Callable[[Any], list[Any]]] = {}


def _plan(cls: type[msgspec.Struct]) -> _Plan:
    """The plan of a Struct class; ``_Unsure`` if its own keys need the walk (none in the domain)."""
    if not (isinstance(cls, type) and issubclass(cls, msgspec.Struct)):
        raise _Unsure
    try:
        fields = msgspec.structs.fields(cls)
    except Exception:  # annotations that do not resolve: nothing to plan with
        raise _Unsure from None
    config = cls.__struct_config__
    keys = [field.encode_name for field in fields]
    tag_keys = [] if config.tag_field is None else [config.tag_field]
    if any(find_credential(key) for key in keys + tag_keys) or any(credential_named(key) for key in tag_keys):
        raise _Unsure  # a credential format in a key, or a tag under a credential name
    return _Plan(  # indices into ``[tag, *fields]``
        config.tag,
        tuple(index for index, key in enumerate(keys, 1) if key == "size"),
        tuple((index, key) for index, key in enumerate(keys, 1) if credential_named(key)),
        tuple((index, declared) for index, field in enumerate(fields, 1) if (declared := _declared_struct(field.type))),
    )


def _declared_struct(annotation: Any) -> type | None:
    """The Struct class a field is declared as (``BlobRef``, ``BlobRef | None``), else None (a union of
    Struct classes, a tuple of them: msgspec writes those with their keys, so they need no position)."""
    union = isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union
    members = typing.get_args(annotation) if union else (annotation,)
    classes = [member for member in members if member is not type(None)]
    if len(classes) == 1 and isinstance(classes[0], type) and issubclass(classes[0], msgspec.Struct):
        return classes[0]
    return None


# The bounds prefilter: together, the two say that a JSON text of the command alone proves that
# ``_check_bounds`` passes (most do). Without escapes, each string is the run after its opening
# quote, in at least as many bytes as it has characters; a list of n items holds n - 1 commas; a
# negative size reads ``"size":-``. Anything else is walked. (``find``, not ``in``:
# ``bytes.__contains__`` first tries its operand as an int, and formats the exception it catches.)


def _lists_surely_short(text: bytes) -> bool:
    """No list past ``MAX_LIST_ITEMS``: counted per text (commas add up across texts)."""
    return text.count(b",") < MAX_LIST_ITEMS


def _strings_surely_within_bounds(text: bytes, *, longest: int | None = None) -> bool:
    """No escapes, no string over the shortest limit, no negative size: true of JSON texts joined by
    newlines only if true of each of them. ``longest`` is the length of the longest text joined:
    one too short to hold a string's quote and ``MAX_ID_LENGTH + 1`` characters holds no string
    over the limit, so the search for one is skipped (an intent's text is typically about 150 bytes)."""
    if text.find(b"\\") >= 0 or text.find(b'"size":-') >= 0:
        return False
    return (longest is not None and longest <= MAX_ID_LENGTH + 1) or _LONG_STRING.search(text) is None


_LONG_STRING = re.compile(b'"[^"]{%d}' % (MAX_ID_LENGTH + 1))


def _check_bounds(value: Any, key: str) -> None:  # noqa: C901 - one flat walk: this runs per submission
    """Every string and list outside the opaque payloads is bounded, and no blob size is negative.

    Opaque payloads (arguments, results) are bounded as a whole by ``MAX_INLINE_BYTES`` instead.
    Errors name the field by its key; this walk runs for every submission, so it builds no paths.
    """
    kind = type(value)
    if kind is str:
        limit = MAX_ID_LENGTH if key in _ID_FIELDS else MAX_TEXT_LENGTH
        if len(value) > limit:
            raise errors.Malformed(f"{key} is {len(value)} characters; the limit is {limit}")
        if "\x00" in value and key in _ID_FIELDS:  # ids become keys and columns: a worker, the run row's holder
            raise errors.Malformed(f"{key} holds a NUL character")
    elif kind is list or kind is tuple:  # ``to_builtins`` keeps a Struct's tuple fields as tuples
        if len(value) > MAX_LIST_ITEMS:
            raise errors.Malformed(f"{key} has {len(value)} items; the limit is {MAX_LIST_ITEMS}")
        for item in value:
            _check_bounds(item, key)
    elif kind is dict:
        for name, item in value.items():
            if name in OPAQUE_KEYS or name == "document":  # a handoff document has its own bound
                continue
            if name == "size" and type(item) is int and item < 0:
                raise errors.Malformed(f"{key}.size cannot be negative")
            if type(item) in _CONTAINERS:
                _check_bounds(item, name)


_CONTAINERS = (str, list, tuple, dict)


def _from_authority(state: RunState, submission: Submission, command: _FromAuthority, now: int) -> Event:
    """Grants and approvals come from someone other than the holder, so they are not fenced."""
    if isinstance(command, GrantAuthority):
        return authority.grant(state, submission, command, now)
    if isinstance(command, RevokeAuthority):
        return authority.revoke(state, command)
    if isinstance(command, GrantApproval):
        return authority.approve(state, submission, command, now)
    return authority.deny(state, submission, command)


def _ttl_us(ttl_ms: int) -> int:
    if not 0 < ttl_ms <= MAX_TTL_MS:
        msg = f"ttl_ms must be in 1..{MAX_TTL_MS}"
        raise errors.Malformed(msg)
    return ttl_ms * 1000


def _open(state: RunState, command: OpenRun) -> RunOpened:
    if state.opened:
        raise errors.RunAlreadyExists(f"run {state.run_id!r} already exists")
    command.ceilings.validate()
    if command.schema_version < 0:
        raise errors.Malformed("schema_version cannot be negative")
    return RunOpened(
        command.release_id, command.schema_name, command.schema_version, command.task_ref, command.ceilings
    )


def _acquire(state: RunState, submission: Submission, command: AcquireLease, now: int) -> list[Event]:
    if command.placement.worker != submission.worker:
        raise errors.Malformed("placement.worker must be the submitting worker")
    expires_at = now + _ttl_us(command.ttl_ms)
    events: list[Event] = []
    lease = state.lease
    if lease is not None:
        if now < lease.expires_at:
            msg = f"lease epoch {lease.epoch} is held by {lease.worker!r} until {lease.expires_at}"
            raise errors.LeaseHeld(msg)
        events.append(LeaseExpired(lease.worker, lease.epoch, now))
    events.append(LeaseGranted(submission.worker, state.epoch + 1, command.placement, expires_at))
    return events


def _expire(state: RunState, now: int) -> list[Event]:
    lease = state.lease
    if lease is None:
        raise errors.NoLease(f"run {state.run_id!r} has no lease to expire")
    if now < lease.expires_at:
        raise errors.LeaseHeld(f"lease epoch {lease.epoch} has not expired yet")
    return [LeaseExpired(lease.worker, lease.epoch, now)]


def _check_fence(state: RunState, submission: Submission, now: int) -> None:
    lease = state.lease
    if lease is None or submission.epoch != state.epoch or lease.worker != submission.worker:
        msg = (
            f"{submission.worker!r} at epoch {submission.epoch} does not hold the lease "
            f"(current epoch {state.epoch}, holder {state.holder!r})"
        )
        raise errors.StaleEpoch(msg, current_epoch=state.epoch)
    if now >= lease.expires_at:
        raise errors.LeaseExpired(f"lease epoch {lease.epoch} expired at {lease.expires_at}")


def _charged(state: RunState, charge: Usage) -> Usage:
    state.ceilings.check(state.usage.plus(charge))
    return charge


def _inline_text(value: Any, what: str) -> bytes:
    """The payload's canonical text as stored inside an event (ints as numbers, no newline)."""
    try:
        text = canonical_bytes(value, opaque=True)[:-1]
    except (TypeError, ValueError) as exc:
        raise errors.Malformed(f"{what}: {exc}") from None
    if len(text) > MAX_INLINE_BYTES:
        msg = f"{what} is {len(text)} bytes inline; the limit is {MAX_INLINE_BYTES}: store it as a blob"
        raise errors.PayloadTooLarge(msg)
    return text


def _intent(state: RunState, command: RecordIntent, encoded: list[bytes | None] | None) -> IntentRecorded:
    if command.op_id in _intended(state):
        raise errors.DuplicateOperation(f"operation {command.op_id!r} already has an intent")
    if command.kind == "effect":
        older = sorted(op.op_id for op in state.operations.values() if op.epoch < state.epoch)
        if older:
            msg = f"uncertain intents from an earlier epoch must be reconciled first: {older}"
            raise errors.UncertainIntent(msg)
    context = command.context
    arguments = _inline_text(context.arguments, "arguments")
    charge = _charged(state, _intent_charge(len(arguments)))
    # The context is written once: for its digest, and (through ``encoded``) inside the event.
    text = struct_canonical_bytes(context, given=("arguments", arguments))
    digest = context_digest(context) if text is None else digest_of(CONTEXT_PREFIX, text, b"\n")
    body = IntentRecorded(
        command.op_id, command.kind, command.tool_contract, context, digest, command.idempotency_key, charge
    )
    if encoded is not None and text is not None:
        encoded.append(struct_canonical_bytes(body, given=("context", text)))
    return body


def _intent_charge(argument_bytes: int) -> Usage:
    """What an intent with ``argument_bytes`` of arguments costs: one shared value per size (it is frozen),
    so that writing it into the event finds its text by identity."""
    charge = _INTENT_CHARGES.get(argument_bytes)
    if charge is None:
        if len(_INTENT_CHARGES) >= _INTENT_CHARGE_SIZES:
            _INTENT_CHARGES.clear()
        charge = _INTENT_CHARGES[argument_bytes] = Usage(calls=1, argument_bytes=argument_bytes)
    return charge


_INTENT_CHARGES: dict[int, Usage] = {}
_INTENT_CHARGE_SIZES = 1024  # a bound: argument sizes vary, most agents' repeat


def _outcome_charge(state: RunState, result: Any, result_ref: BlobRef | None, reported: Usage) -> Usage:
    """What settling an operation costs, for observations and reconciliations alike.

    The worker may report fuel, cost and result bytes; result bytes are never less than what the
    event itself carries (inline bytes plus the blob's size).
    """
    reported.validate()
    if reported.calls or reported.argument_bytes or reported.iterations or reported.stages:
        raise errors.Malformed("an outcome may report only fuel, cost_micros and result_bytes")
    inline = len(_inline_text(result, "result")) if result is not None else 0
    carried = inline + (result_ref.size if result_ref is not None else 0)
    result_bytes = max(carried, reported.result_bytes)
    return _charged(state, Usage(result_bytes=result_bytes, fuel=reported.fuel, cost_micros=reported.cost_micros))


def _observation(state: RunState, command: RecordObservation) -> ObservationRecorded:
    op = _open_operation(state, command.op_id)
    if op.epoch != state.epoch:
        msg = f"operation {command.op_id!r} was intended at epoch {op.epoch}; reconcile it instead"
        raise errors.ReconciliationRequired(msg)
    if command.context_digest != op.context_digest:
        msg = f"observation quotes {command.context_digest}, intent recorded {op.context_digest}"
        raise errors.ContextMismatch(msg)
    if (command.outcome == "failed") != (command.failure_reason is not None):
        raise errors.Malformed("failure_reason is required exactly when outcome is 'failed'")
    charge = _outcome_charge(state, command.result, command.result_ref, command.usage)
    return ObservationRecorded(
        command.op_id,
        command.context_digest,
        command.outcome,
        charge,
        command.failure_reason,
        command.result,
        command.result_ref,
        command.evidence_refs,
    )


def _reconcile(state: RunState, command: ReconcileIntent) -> IntentReconciled:
    _open_operation(state, command.op_id)
    if not command.evidence:
        raise errors.Malformed("reconciliation needs evidence")
    charge = _outcome_charge(state, command.result, command.result_ref, command.usage)
    return IntentReconciled(
        command.op_id, command.resolution, command.evidence, charge, command.result, command.result_ref
    )


def _transition(state: RunState, command: RecordTransition) -> TransitionRecorded:
    if not is_legal(state.stage, command.to_stage):
        raise errors.IllegalTransition(f"{state.stage} -> {command.to_stage} is not a legal move")
    rework = 1 if command.to_stage is Stage.GENERATING else 0
    charge = _charged(state, Usage(stages=1, iterations=rework))
    return TransitionRecorded(state.stage, command.to_stage, command.state_digest, charge, command.state_ref)


def _intended(state: RunState) -> set[str]:
    if state.op_ids is None:
        raise TypeError("decide needs a write-side RunState: this one was folded without operation ids")
    return state.op_ids


def _open_operation(state: RunState, op_id: str) -> OpRecord:
    op = state.operations.get(op_id)
    if op is not None:
        return op
    if op_id in _intended(state):
        raise errors.AlreadyObserved(f"operation {op_id!r} already has a recorded outcome")
    raise errors.UnknownOperation(f"no intent recorded for operation {op_id!r}")


def _require_settled(state: RunState, action: str) -> None:
    if state.operations:
        msg = f"cannot {action} with uncertain intents: {sorted(state.operations)}"
        raise errors.UncertainIntent(msg)
