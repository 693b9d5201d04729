"""kopf's record of the last handled spec, kept as a digest: the full copy does not fit in an annotation.

kopf stores each object's "essence" (spec, labels, annotations) in an annotation after handling it, to tell an
update from an echo. The apiserver caps an object's annotations at 256 KiB in all, while the validating webhook
admits specs up to etcd's 1.5 MiB (a long chat template in spec.engineArgs): past about 256 KiB, kopf's patch of
the annotation was refused (422 "metadata.annotations: Too long"), kopf logged an error, throttled the object and
handled it as new again at every event, backing off for minutes. Every handler here runs the same idempotent
reconcile and reads neither `old` nor `diff`, so a digest of the essence tells all that is needed: changed or not.

Both of kopf's records (this one and each handler's progress) are annotations of the InferenceService, which its
author may write too. kopf decodes them without a check, so `{not json` in one raised on every event: kopf throttled
the object for ever (errors and Events each time) and never ran its handlers. A record that is no record of kopf's
(not JSON, not an object, a field of the wrong type) is read here as absent: the object is handled as new, and
kopf's next write puts its own record there.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, cast

import iso8601
import kopf

from flotilla.operator.spec import GROUP

# The one key of a stored digest (a real essence always has `spec`, never this).
DIGEST_KEY = "sha256"


def digest(essence: kopf.BodyEssence) -> str:
    """sha256 of the essence's canonical JSON."""
    return hashlib.sha256(json.dumps(essence, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class DigestDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's annotation diff-base storage, holding `{"sha256": ...}` of the essence instead of the essence."""

    def __init__(self) -> None:
        super().__init__(prefix=GROUP, key="last-handled-configuration")

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        """Annotate the essence's digest."""
        super().store(body=body, patch=patch, essence=cast(kopf.BodyEssence, {DIGEST_KEY: digest(essence)}))

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        """The last handled essence as kopf compares it: the current one when the stored digest matches it (no
        change), the digest itself otherwise (a change, whose details no handler reads). An essence stored whole
        by an earlier operator is returned as it is."""
        try:
            stored = super().fetch(body=body)
        except ValueError:  # not JSON: not kopf's
            return None
        if not isinstance(stored, dict) or (not stored.get("spec") and set(stored) != {DIGEST_KEY}):
            return None  # neither a digest nor an essence: not kopf's
        if set(stored) != {DIGEST_KEY}:
            return stored
        current = self.build(body=body)
        return current if dict(stored).get(DIGEST_KEY) == digest(current) else stored


# The fields of kopf's progress record (kopf.ProgressRecord) and the types kopf reads them as.
_TIMES = ("started", "stopped", "delayed")
_TEXTS = ("purpose", "message")


def _is_aware_time(value: Any) -> bool:
    """Whether kopf reads `value` as a time it can compare with its own: kopf parses with iso8601 (fewer forms than
    datetime.fromisoformat: no week dates) and compares with aware times (a time without an offset raised)."""
    if not isinstance(value, str):
        return False
    try:
        return iso8601.parse_date(value, default_timezone=None).tzinfo is not None
    except iso8601.ParseError:
        return False


def _is_progress_record(record: Any) -> bool:
    """Whether `record`, decoded from a progress annotation, is one kopf can read."""
    if not isinstance(record, dict):
        return False
    if not all(record.get(key) is None or _is_aware_time(record[key]) for key in _TIMES):
        return False
    subrefs = record.get("subrefs")
    retries = record.get("retries")
    return (all(record.get(key) is None or isinstance(record[key], str) for key in _TEXTS)
            # kopf's backoff doubles per retry from 1 s: below 0, a retry comes at once (thousands in a row)
            and (retries is None or (type(retries) is int and retries >= 0))
            and all(record.get(key) is None or isinstance(record[key], bool) for key in ("success", "failure"))
            and (subrefs is None or (isinstance(subrefs, list) and all(isinstance(ref, str) for ref in subrefs))))


class CheckedProgressStorage(kopf.AnnotationsProgressStorage):
    """kopf's annotation progress storage, reading a record kopf could not use as absent (the handler runs anew)."""

    def __init__(self) -> None:
        super().__init__(prefix=GROUP)

    def fetch(self, *, key: kopf.HandlerId, body: kopf.Body) -> kopf.ProgressRecord | None:
        """The handler's progress record, or None when there is none or it is not kopf's."""
        try:
            record = super().fetch(key=key, body=body)
        except ValueError:
            return None
        return record if _is_progress_record(record) else None
