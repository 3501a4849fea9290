"""Wire schemas for the AsyncAPI document, derived from the one msgspec schema of each concept.

Handlers receive the raw bytes (``raw_body``) and decode them with ``adapters.wire``, the same
decoder as ``baton submit``; the annotation only tells FastStream's AsyncAPI generator what the
bytes hold, so the document and ``baton schema`` can never disagree.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from pydantic import WithJsonSchema

from baton.domain.commands import Submission, Verdict
from baton.domain.events import RecordedEvent

__all__ = ["EventBody", "SubmissionBody", "VerdictBody", "inline_schema", "raw_body"]


def inline_schema(struct: Any) -> dict[str, Any]:
    """msgspec's JSON Schema with every ``$ref`` inlined (AsyncAPI tools do not see its ``$defs``)."""
    schema = msgspec.json.schema(struct)
    defs: dict[str, Any] = schema.pop("$defs", {})

    def resolve(node: Any, seen: tuple[str, ...]) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                name = ref.removeprefix("#/$defs/")
                if name in seen:  # a recursive type: stop with an open schema
                    return {"title": name}
                return resolve(defs[name], (*seen, name))
            return {key: resolve(value, seen) for key, value in node.items()}
        if isinstance(node, list):
            return [resolve(item, seen) for item in node]
        return node

    resolved: dict[str, Any] = resolve(schema, ())
    return resolved


async def raw_body(msg: Any) -> Any:
    """A FastStream decoder that hands the handler the message bytes (a list of them for a batch)."""
    return msg.body


SubmissionBody = Annotated[bytes, WithJsonSchema(inline_schema(Submission))]
VerdictBody = Annotated[bytes, WithJsonSchema(inline_schema(Verdict))]
EventBody = Annotated[bytes, WithJsonSchema(inline_schema(RecordedEvent))]
