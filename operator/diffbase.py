"""kopf's record of the last handled spec, kept as a digest: the full copy does not fit in an annotation.

kopf stores each object's "essence" (spec, labels, annotations) in an annotation after handling it, to tell an
update from an echo. The apiserver caps an object's annotations at 256 KiB in all, while the validating webhook
admits specs up to etcd's 1.5 MiB (a long chat template in spec.engineArgs): past about 256 KiB, kopf's patch of
the annotation was refused (422 "metadata.annotations: Too long"), kopf logged an error, throttled the object and
handled it as new again at every event, backing off for minutes. Every handler here runs the same idempotent
reconcile and reads neither `old` nor `diff`, so a digest of the essence tells all that is needed: changed or not.
"""

from __future__ import annotations

import hashlib
import json
from typing import cast

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
        stored = super().fetch(body=body)
        if stored is None or set(stored) != {DIGEST_KEY}:
            return stored
        current = self.build(body=body)
        return current if dict(stored).get(DIGEST_KEY) == digest(current) else stored
