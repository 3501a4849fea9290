"""Who may submit what: principals, their roles and keys, kept in a registry that lives in the log.

The registry is a stream of its own (``REGISTRY_RUN``), folded into a ``RunState`` like any run,
written only by operators. A store whose registry says ``signatures_required`` accepts a
submission only when it is signed by the key registered for the principal it names (``worker``),
that principal is not revoked, and its roles allow the command; what a worker says about itself is
never enough. A store without a registry, or one opened as a development store, verifies nothing
and says so ("identities not verified").

A submission's signature is an Ed25519 signature over ``signed_digest(submission)``: the digest
of its canonical bytes without the ``signature`` member (``signed_by``, the key, is signed too).
The envelopes a submission produces carry that digest and the signature, so whoever holds the
registry's events can check who wrote each event. Verifying the signature itself needs a
cryptography library, which this pure package does not import: ``identify`` returns the key that
must verify it, and the ledger's adapter verifies (``adapters/identity``).
"""

from __future__ import annotations

import base64
from typing import Any

import msgspec

from baton.domain import errors
from baton.domain.canonical import canonical_bytes, digest_of
from baton.domain.commands import (
    AddPrincipal,
    ChangeRoles,
    Command,
    DenyApproval,
    GrantApproval,
    GrantAuthority,
    OpenRegistry,
    OpenRun,
    PurgeThread,
    RecordEvidence,
    RevokeAuthority,
    RevokePrincipal,
    Submission,
)
from baton.domain.events import (
    ROLES,
    Event,
    PrincipalAdded,
    PrincipalRevoked,
    PrincipalRolesChanged,
    RegistryOpened,
    Role,
)
from baton.domain.state import RunState

__all__ = [
    "KEY_PREFIX",
    "REGISTRY_COMMANDS",
    "REGISTRY_RUN",
    "SIGNATURE_PREFIX",
    "decide_registry",
    "identify",
    "require_role",
    "content_digest",
    "signed_content",
    "signed_digest",
]

REGISTRY_RUN = "baton:registry"
SIGNATURE_PREFIX = b"baton.submission-signature.v1\x00"
KEY_PREFIX = "ed25519:"
REGISTRY_COMMANDS = (OpenRegistry, AddPrincipal, ChangeRoles, RevokePrincipal)
_OPERATOR_COMMANDS = (*REGISTRY_COMMANDS, GrantAuthority, RevokeAuthority, PurgeThread)


def signed_content(submission: Submission) -> dict[str, Any]:
    """What a submission's author signs: its builtins without ``signature`` (kept in its first event)."""
    plain: dict[str, Any] = msgspec.to_builtins(submission)
    del plain["signature"]
    return plain


def signed_digest(submission: Submission) -> str:
    """What a submission's signature signs: the digest of its canonical bytes without ``signature``."""
    return content_digest(signed_content(submission))


def content_digest(content: dict[str, Any]) -> str:
    """The signed digest of ``signed_content`` (or of that content as stored in an event)."""
    return digest_of(SIGNATURE_PREFIX, canonical_bytes(content))


def identify(registry: RunState | None, submission: Submission) -> str | None:
    """The public key that must verify ``submission``'s signature, or None when nothing is verified.

    ``registry`` is the registry stream's state (a ``RunState``; None or unopened: no registry).
    Raises ``SignatureRequired``, ``UnknownPrincipal``, ``PrincipalMismatch`` or ``PrincipalRevoked``.
    """
    if registry is None or not registry.opened:
        if isinstance(submission.command, OpenRegistry) and submission.command.signatures_required:
            return _signed_with(submission, submission.command.public_key)  # the first operator signs itself in
        return None
    if not registry.signatures_required:
        return None
    principals = registry.principals
    if not submission.signature or not submission.signed_by:
        raise errors.SignatureRequired("this store verifies identities: sign the submission")
    principal = principals.get(submission.worker)
    owner = registry.principal_keys.get(submission.signed_by)
    if principal is None:
        raise errors.UnknownPrincipal(f"no principal {submission.worker!r} in the registry")
    if owner is None:
        raise errors.UnknownPrincipal("the submission is signed with a key no principal has")
    if owner != principal.name:
        raise errors.PrincipalMismatch(f"the submission names {principal.name!r} but the key is {owner!r}'s")
    if principal.revoked:
        raise errors.PrincipalRevoked(f"principal {principal.name!r} was revoked")
    return _signed_with(submission, principal.public_key)


def _signed_with(submission: Submission, public_key: str) -> str:
    if not submission.signature:
        raise errors.SignatureRequired("this store verifies identities: sign the submission")
    if submission.signed_by != public_key:
        raise errors.PrincipalMismatch(f"{submission.worker!r} is registered with another key")
    return public_key


def require_role(registry: RunState | None, submission: Submission, holder_key: str | None) -> None:
    """The principal's roles allow the command; approvals and evidence never come from the lease holder.

    Only where signatures are required (roles of unverified names would prove nothing).
    ``holder_key`` is the public key of the run's lease holder, if it has one.
    """
    if registry is None or not registry.signatures_required:
        return
    principal = registry.principals.get(submission.worker)
    command = submission.command
    if principal is None:  # only ``OpenRegistry`` gets here unregistered: ``identify`` refuses the rest
        return
    needed = _roles_for(command)
    if not set(needed) & set(principal.roles):
        msg = f"{principal.name!r} ({', '.join(principal.roles) or 'no roles'}) may not {type(command).__name__}"
        raise errors.RoleNotAllowed(msg + f": it takes {' or '.join(needed)}")
    if isinstance(command, GrantApproval | DenyApproval | RecordEvidence) and principal.public_key == holder_key:
        raise errors.SelfApproval(
            f"{principal.name!r} holds the lease (or shares its key): it cannot judge its own work"
        )


def _roles_for(command: Command) -> tuple[Role, ...]:
    if isinstance(command, _OPERATOR_COMMANDS):
        return ("operator",)
    if isinstance(command, GrantApproval | DenyApproval):
        return ("approver",)
    if isinstance(command, RecordEvidence):
        return ("verifier",)
    if isinstance(command, OpenRun):
        return ("worker", "operator")
    return ("worker",)


def decide_registry(registry: RunState, submission: Submission) -> list[Event]:
    """The events of a registry command (``identify`` and ``require_role`` have judged its author)."""
    command = submission.command
    if isinstance(command, OpenRegistry):
        return _open_registry(registry, submission.worker, command)
    if not registry.opened:
        raise errors.RunNotFound("the store has no registry: run `baton store init`")
    if isinstance(command, AddPrincipal):
        return [_add(registry, command)]
    if not isinstance(command, ChangeRoles | RevokePrincipal):
        raise errors.Malformed(f"the registry takes registry commands, not {type(command).__name__}")
    principal = registry.principals.get(command.name)
    if principal is None:
        raise errors.UnknownPrincipal(f"no principal {command.name!r}")
    if principal.revoked:
        raise errors.PrincipalRevoked(f"principal {command.name!r} was revoked")
    if isinstance(command, ChangeRoles):
        return [PrincipalRolesChanged(command.name, _roles(command.roles))]
    return [PrincipalRevoked(command.name)]


def _open_registry(registry: RunState, operator: str, command: OpenRegistry) -> list[Event]:
    if registry.opened:
        raise errors.RunAlreadyExists("the registry is already open")
    if not command.signatures_required:
        return [RegistryOpened(False, existing=command.existing)]
    _check_key(command.public_key)
    opened = RegistryOpened(True, operator, command.public_key, command.existing)
    return [opened, PrincipalAdded(operator, ("operator",), command.public_key)]


def _add(registry: RunState, command: AddPrincipal) -> PrincipalAdded:
    if command.name in registry.principals:
        raise errors.RunAlreadyExists(f"principal {command.name!r} already exists")
    _check_key(command.public_key)
    if command.public_key in registry.principal_keys:
        raise errors.Malformed("another principal already has this key: one key, one principal")
    return PrincipalAdded(command.name, _roles(command.roles), command.public_key)


def _roles(roles: tuple[Role, ...]) -> tuple[Role, ...]:
    """No repeats (kept in the order given, as signed); a judge of work (approver, verifier) never
    does work itself: a worker could otherwise release its lease, approve its own proposal and take
    the lease back."""
    if not roles:
        raise errors.Malformed("a principal needs at least one role")
    if "worker" in roles and ("approver" in roles or "verifier" in roles):
        raise errors.Malformed("a worker cannot also be an approver or a verifier: register another principal")
    if len(set(roles)) != len(roles) or not set(roles) <= set(ROLES):
        raise errors.Malformed(f"roles are distinct, of {', '.join(ROLES)}")
    return roles


def _check_key(public_key: str) -> None:
    """A key is ``ed25519:`` and the canonical base64 of 32 bytes: one spelling per key, so one key
    cannot be registered twice under two spellings."""
    body = public_key.removeprefix(KEY_PREFIX)
    try:
        raw = base64.b64decode(body, validate=True)
    except ValueError:
        raw = b""
    if not public_key.startswith(KEY_PREFIX) or len(raw) != 32 or base64.b64encode(raw).decode() != body:
        raise errors.Malformed(f"a public key is {KEY_PREFIX}<base64 of 32 bytes>")
