"""kopf's webhook server with a request-size limit that every storable InferenceService fits in.

kopf serves the admission webhooks with an aiohttp Application made with aiohttp's default `client_max_size`,
1 MiB, and offers no setting for it. An UPDATE's AdmissionReview carries the object twice (`object` and
`oldObject`), so two specs of ~600 KB each (a long chat template) drew a 413 from aiohttp; under failurePolicy
Ignore the apiserver then admitted the update unreviewed (the reconciler still refused it in status, but the
invalid spec was stored). etcd keeps objects up to 1.5 MiB by default (its --max-request-bytes), so a review
holds at most ~3 MiB of objects plus a little of its own; the limit here, 8 MiB, leaves room for a cluster whose
etcd allows somewhat larger objects. A request beyond it still gets the 413, which only a spec that etcd would
refuse anyway can reach on a default cluster (and which failurePolicy Fail turns into a refusal).

The seam: kopf's `WebhookServer.__call__` passes each aiohttp request to its static `_serve`, before anything has
read the body. Our subclass overrides `_serve` to clone the request with the larger limit (aiohttp's public
`Request.clone(client_max_size=...)`) and hands the clone to kopf's own `_serve`; nothing else of kopf's server is
replaced. `_serve` is a kopf internal: tests/operator/test_operator_webhook.py sends a review above 1 MiB through
the real apiserver, so a kopf that renames it fails that test instead of silently serving 1 MiB again.
"""

from __future__ import annotations

from typing import Any

import aiohttp.web
import kopf

# Well above an UPDATE of two objects at etcd's default 1.5 MiB limit (see above).
MAX_REVIEW_BYTES = 8 << 20


class WebhookServer(kopf.WebhookServer):
    """kopf.WebhookServer that reads admission reviews of up to MAX_REVIEW_BYTES (aiohttp's default: 1 MiB)."""

    @staticmethod
    async def _serve(fn: Any, request: aiohttp.web.Request) -> aiohttp.web.Response:
        # The clone has not read the body either (clone refuses otherwise); kopf's _serve reads it under the new limit.
        bigger = request.clone(client_max_size=MAX_REVIEW_BYTES)
        return await kopf.WebhookServer._serve(fn, bigger)
