"""The wire edge shared by ``baton submit`` and the bus: bytes in, a Submission or a rejection out.

One decoder for every transport, so a line on stdin, a NATS message and a Kafka record are judged
by the same rules: bounded size, valid JSON, the closed submission schema (unknown keys rejected).
What it holds is screened once, by the ledger's ``decide`` (bounds, no credential material).
Bad input never raises: it becomes a ``rejected`` verdict with a stable reason code.
"""

from __future__ import annotations

import msgspec

from baton.domain import errors
from baton.domain.commands import Submission, Verdict

__all__ = [
    "MAX_SUBMISSION_BYTES",
    "decode_submission",
    "decode_verdict",
    "encode_submission",
    "encode_verdict",
    "rejection",
]

# Four times the domain's inline payload bound (64 KiB) and well under NATS' 1 MiB message limit.
MAX_SUBMISSION_BYTES = 256 * 1024

_submission = msgspec.json.Decoder(Submission)
_verdict = msgspec.json.Decoder(Verdict)
_json = msgspec.json.Encoder()


def decode_submission(raw: bytes) -> Submission | Verdict:
    """The submission in ``raw``, or the rejection verdict that answers it (nothing is stored)."""
    if len(raw) > MAX_SUBMISSION_BYTES:
        message = f"submission is {len(raw)} bytes; the limit is {MAX_SUBMISSION_BYTES}"
        return rejection(None, None, errors.PayloadTooLarge.reason, message)
    try:
        submission = _submission.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return _malformed(raw, str(exc))
    return submission  # screened (bounds, credentials) by ``decide``, as every submission is


def rejection(submission_id: str | None, run_id: str | None, reason: str, message: str) -> Verdict:
    return Verdict(submission_id, "rejected", run_id, reason=reason, message=message)


def _malformed(raw: bytes, message: str) -> Verdict:
    """Name the submission and run when the bytes are at least a JSON object that carries them."""
    try:
        partial = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        partial = None
    fields = partial if isinstance(partial, dict) else {}
    sid, run = fields.get("submission_id"), fields.get("run_id")
    return rejection(
        sid if isinstance(sid, str) else None,
        run if isinstance(run, str) else None,
        errors.Malformed.reason,
        message,
    )


def encode_verdict(verdict: Verdict) -> bytes:
    return _json.encode(verdict)


def decode_verdict(raw: bytes) -> Verdict:
    return _verdict.decode(raw)


def encode_submission(submission: Submission) -> bytes:
    return _json.encode(submission)
