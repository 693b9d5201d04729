"""`flotilla operator`: run the InferenceService operator (kopf) with its admission webhooks.

    flotilla operator                      # every namespace, webhook on :9443, liveness on :8080
    flotilla operator -n team-a -n team-b  # only these namespaces
    flotilla operator --webhook-host 127.0.0.1 --webhook-port 9443 --webhook-cert-dir /tmp/certs
    flotilla operator --webhook-configuration '' --webhook-cert-dir /certs  # webhook configurations made by Helm

Credentials: in-cluster when run in a pod, else the kubeconfig ($KUBECONFIG). Run one replica
(kopf runs standalone, without peering).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import functools
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kopf

from flotilla.operator import handlers, serving_reader, webhook
from flotilla.operator.capabilities import server_version
from flotilla.operator.certificates import ensure_certificate, needs_restart
from flotilla.operator.diffbase import CheckedProgressStorage, DigestDiffBaseStorage
from flotilla.operator.kube import Kube, KubeError
from flotilla.operator.optional_kinds import OptionalKinds
from flotilla.operator.policy import AdmissionPolicy
from flotilla.operator.reconciler import Reconciler
from flotilla.operator.serving_reader import ReaderSettings, ServingReader
from flotilla.operator.spec import DEFAULT_IMAGE, DEFAULT_PROMETHEUS_ADDRESS, GROUP, PLURAL, VERSION
from flotilla.operator.webhook_server import WebhookServer

WEBHOOK_CONFIGURATION = f"flotilla.{GROUP}"


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The operator's command line."""
    p = argparse.ArgumentParser(prog="flotilla operator", description=__doc__.split("\n")[0])
    p.add_argument("-n", "--namespace", action="append", default=[], dest="namespaces",
                   help="watch this namespace (repeatable; a glob such as team-* allowed); default: all namespaces")
    p.add_argument("--webhook-port", type=int, default=9443, help="port the admission webhooks listen on")
    p.add_argument("--webhook-listen", default="0.0.0.0", help="address the webhook server binds")
    p.add_argument("--webhook-host", default=None,
                   help="host or IP the apiserver dials for the webhooks, and the certificate's SAN "
                        "(in a cluster: the operator Service's DNS name); default 127.0.0.1")
    p.add_argument("--webhook-cert-dir", type=Path, default=None,
                   help="directory with tls.crt and tls.key; a self-signed pair is made there when absent "
                        "(default: a fresh temporary directory)")
    p.add_argument("--webhook-configuration", default=WEBHOOK_CONFIGURATION,
                   help="name of the Validating/MutatingWebhookConfiguration the operator manages; empty: "
                        "serve the webhooks but leave their configurations to someone else (the Helm chart)")
    p.add_argument("--engine-image", default=None,
                   help=f"engine image for InferenceServices that leave spec.image at its default ({DEFAULT_IMAGE}), "
                        "e.g. a mirror in a private registry: their pods run it; the mutating webhook also writes "
                        "it into their spec (with --no-webhook the spec keeps showing the default)")
    p.add_argument("--host-path-prefix", action="append", default=[], dest="host_path_prefixes",
                   help="allow hostPath:// model sources under this node directory (repeatable); default: "
                        "hostPath sources are refused")
    p.add_argument("--prometheus-address", action="append", default=[], dest="prometheus_addresses",
                   help="a Prometheus that KEDA ScaledObjects may query (repeatable; the first is what "
                        "spec.autoscaling.prometheusAddress's default stands for); default: "
                        f"{DEFAULT_PROMETHEUS_ADDRESS} only")
    p.add_argument("--pod-annotation", action="append", default=[], dest="pod_annotations",
                   help="a pod annotation key that spec.pod.annotations may set, or a prefix ending in '/' "
                        "(repeatable); default: only keys without '/' or '.'")
    p.add_argument("--pod-label", action="append", default=[], dest="pod_labels",
                   help="a pod label key with a prefix that spec.pod.labels may set, or a prefix ending in '/' "
                        "(repeatable); default: only keys without '/'")
    p.add_argument("--priority-class", action="append", default=[], dest="priority_classes",
                   help="a PriorityClass that engine pods may use (repeatable); default: any but the built-in "
                        "system-* classes")
    p.add_argument("--service-account", action="append", default=[], dest="service_accounts",
                   help="a ServiceAccount that engine pods may run as (spec.pod.serviceAccountName; repeatable); "
                        "default: any of the namespace's")
    p.add_argument("--no-webhook", action="store_true", help="serve no admission webhooks")
    p.add_argument("--liveness", default="http://0.0.0.0:8080/healthz",
                   help="liveness endpoint URL (empty: none)")
    p.add_argument("--resync-seconds", type=float, default=60.0,
                   help="reconcile every InferenceService this often, whatever the events (0: never)")
    p.add_argument("--resync-concurrency", type=int, default=handlers.RESYNC_CONCURRENCY,
                   help="InferenceServices the resync reconciles at once (threads and apiserver connections)")
    p.add_argument("--serving-period", type=float, default=10.0,
                   help="read every engine pod's /metrics this often, in seconds, for status.serving (0: never)")
    p.add_argument("--serving-window", type=float, default=60.0,
                   help="window of status.serving's rates and latency percentiles, in seconds")
    p.add_argument("--serving-concurrency", type=int, default=32, help="engine scrapes in flight at once")
    p.add_argument("--serving-timeout", type=float, default=2.0, help="seconds one engine scrape may take")
    p.add_argument("-v", "--verbose", action="store_true", help="log every handler call")
    p.add_argument("--debug", action="store_true", help="log kopf's internals too")
    args = p.parse_args(argv)
    try:
        args.policy = AdmissionPolicy(host_path_prefixes=tuple(args.host_path_prefixes),
                                      prometheus_addresses=tuple(args.prometheus_addresses
                                                                 or [DEFAULT_PROMETHEUS_ADDRESS]),
                                      pod_annotations=tuple(args.pod_annotations),
                                      pod_labels=tuple(args.pod_labels),
                                      priority_classes=tuple(args.priority_classes),
                                      service_accounts=tuple(args.service_accounts),
                                      engine_image=args.engine_image or DEFAULT_IMAGE)
        args.reading = ReaderSettings(period_s=args.serving_period or 1.0, window_s=args.serving_window,
                                      concurrency=args.serving_concurrency, timeout_s=args.serving_timeout)
    except ValueError as e:  # pydantic's ValidationError is one
        p.error(str(e))
    if args.serving_period < 0:
        p.error("--serving-period must be 0 (off) or a positive number of seconds")
    if args.resync_concurrency < 1:
        p.error("--resync-concurrency must be at least 1")
    for pattern in args.namespaces:
        # kopf would read "!x" as every namespace but x and "a,b" as two patterns, while the resync, the serving
        # reader and the webhooks match one glob: they would list /namespaces/!x/... and serve nothing.
        if pattern.startswith("!") or "," in pattern or not pattern.strip():
            p.error(f"--namespace {pattern!r}: give one namespace or glob per flag (repeat it), without '!' "
                    "or ','")
    return args


# Threads in which kopf runs the (synchronous) handlers: what Python's ThreadPoolExecutor picks by default.
HANDLER_WORKERS = min(32, (os.cpu_count() or 1) + 4)
# Other threads that call the apiserver now and then: the serving reader, the optional kinds' discovery check, a
# resync's listing.
OTHER_CALLERS = 4


def apiserver_connections(resync_concurrency: int) -> int:
    """How many threads may call the apiserver at once, the size of the client's connection pool: kopf's handler
    threads, the periodic resync's workers and those of a resync after a new optional kind (the two may overlap),
    and a few others (OTHER_CALLERS). The client's own default, 5 per CPU (10 on 2 CPUs), was smaller than that at a
    --resync-concurrency of 16 and every connection beyond it was discarded with a warning."""
    return HANDLER_WORKERS + 2 * resync_concurrency + OTHER_CALLERS


def settings_for(args: argparse.Namespace) -> kopf.OperatorSettings:
    """kopf settings: our own annotation prefix, quiet event posting, the webhook server."""
    settings = kopf.OperatorSettings()
    # kopf's records are annotations the InferenceService's author can write too: read defensively (diffbase.py).
    settings.persistence.progress_storage = CheckedProgressStorage()
    # A digest, not kopf's full copy of the spec: a large spec does not fit in an annotation (diffbase.py).
    settings.persistence.diffbase_storage = DigestDiffBaseStorage()
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    # The reconciler posts one Event per decision itself; kopf's own "handler succeeded" chatter
    # would bury them, so only its warnings and errors become Events.
    settings.posting.level = logging.WARNING
    # Reconnect fast after an apiserver restart.
    settings.watching.connect_timeout = 5
    settings.watching.server_timeout = 300
    settings.watching.reconnect_backoff = 0.5
    settings.networking.connect_timeout = 5
    settings.networking.request_timeout = 30
    # After a fatal watch error kopf stops, waiting for its tasks: with its defaults (a request
    # retried for ~54 s, an exit allowed 10 minutes) one retrying request held a stopping operator
    # for minutes with no watch and no webhook. Stop within seconds instead, so `run_resiliently`
    # can start it again.
    settings.networking.error_backoffs = [0.5, 1, 2, 4, 8]
    settings.process.ultimate_exiting_timeout = 15
    # Python's own default for the executor, made explicit: the apiserver connection pool is sized from it.
    settings.execution.max_workers = HANDLER_WORKERS
    if not args.no_webhook:
        host = args.webhook_host or "127.0.0.1"
        cert_dir = args.webhook_cert_dir or Path(tempfile.mkdtemp(prefix="flotilla-webhook-"))
        cert, key = ensure_certificate(cert_dir, [host, "127.0.0.1", "localhost"])
        settings.admission.server = WebhookServer(
            addr=args.webhook_listen, port=args.webhook_port, host=host, certfile=str(cert), pkeyfile=str(key))
        if args.webhook_configuration:
            settings.admission.managed = args.webhook_configuration
    return settings


def register_engine_image(registry: kopf.OperatorRegistry, image: str, namespaces: list[str]) -> None:
    """A mutating webhook that puts `image` in place of the CRD's default engine image (in `namespaces`, the
    operator's --namespace; elsewhere nothing).

    The CRD's schema default fills spec.image before any webhook runs, so the stock image stands
    for "the operator's default". With failure policy Ignore, an InferenceService created while
    the operator is down keeps the stock image in its spec, and the review settles it to `image`
    (AdmissionPolicy.engine_image), so its pods run the admin's image all the same.
    """

    @kopf.on.mutate(GROUP, VERSION, PLURAL, id="engine-image", operations=webhook.OPERATIONS,
                    ignore_failures=True, registry=registry)
    def engine_image(body: kopf.Body, patch: kopf.Patch, **kwargs: Any) -> None:
        spec = body.get("spec") or {}
        if webhook.spec_untouched(kwargs.get("operation"), kwargs.get("old"), body):
            return  # a metadata-only update changes no spec (the validating webhook lets it through unreviewed)
        if not webhook.serves(kwargs.get("namespace"), namespaces):
            return  # another release's namespace: its own engine image, if any
        if spec.get("image", DEFAULT_IMAGE) == DEFAULT_IMAGE and image != DEFAULT_IMAGE:
            patch.setdefault("spec", {})["image"] = image


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's credentials: the pod's service account in a cluster, else the kubeconfig."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


logger = logging.getLogger(__name__)

# How often the webhook certificate is checked for rotation or renewal.
CERTIFICATE_CHECK_S = 300.0
# A run that lasted this long was healthy: its failure starts a fresh count of quick failures.
HEALTHY_RUN_S = 60.0
# How often a running kopf looks at its restart flag (set by the certificate check).
RESTART_POLL_S = 1.0
# Between tries to read the apiserver's version at start-up.
VERSION_RETRY_S = 2.0


def wait_for_server_version(kube: Kube, retry_s: float = VERSION_RETRY_S) -> tuple[int, int]:
    """The apiserver's (major, minor), asked until it answers: an apiserver away at start-up delays the start, as
    it would kopf's, rather than ending the process or guessing an old version (which would leave fields out)."""
    while True:
        try:
            version = server_version(kube)
        except KubeError as e:
            logger.warning(f"reading the apiserver's version failed, again in {retry_s:g} s: {e}")
            time.sleep(retry_s)
            continue
        logger.info(f"the apiserver is Kubernetes {version[0]}.{version[1]}")
        return version


def run_resiliently(run: Callable[[], None], *, quick_failures: int = 5, backoff_s: float = 2.0) -> None:
    """Call `run` (kopf's whole operator) again when it dies of an error, until it returns.

    kopf's watch streams treat an unexpected API answer as fatal, and the operator ends with them:
    seen here as a `404 page not found` for our CRD's endpoint from an apiserver that had just
    restarted and had not installed the CRD's handlers yet. A pod would be restarted by its
    Deployment, but until then the webhook would not answer (its failure policy lets everything
    through). Starting kopf again in-process rides out such a moment; `quick_failures` failures in
    a row, none lasting `HEALTHY_RUN_S`, still end the process, so a lasting fault stays visible.
    """
    failures = 0
    while True:
        started = time.monotonic()
        try:
            run()
            return  # stopped by a signal: kopf has withdrawn its webhook configurations
        except Exception:
            failures = 1 if time.monotonic() - started > HEALTHY_RUN_S else failures + 1
            if failures >= quick_failures:
                raise
            logger.exception("the operator stopped on an error (%d in a row); starting it again", failures)
            time.sleep(backoff_s)


def main(argv: list[str]) -> int:
    """Run until SIGINT/SIGTERM (kopf then withdraws its webhook configurations)."""
    args = parse_args(argv)
    kopf.configure(verbose=args.verbose, debug=args.debug)
    registry = kopf.OperatorRegistry()
    kopf.on.login(id="login", registry=registry)(login)
    kube = Kube.from_environment(pool_size=apiserver_connections(args.resync_concurrency))
    reconciler = Reconciler(kube, policy=args.policy, server_version=wait_for_server_version(kube))
    stopping = handlers.register(registry, reconciler, args.namespaces, args.resync_seconds, args.resync_concurrency)
    # A ServiceMonitor or KEDA CRD installed after start-up: kopf may miss it (optional_kinds.py).
    optional_kinds = OptionalKinds(reconciler.kube,
                                   functools.partial(handlers.resync_once, reconciler, args.namespaces,
                                                     args.resync_concurrency, stopping))
    optional_kinds.register(registry)
    if args.serving_period > 0:
        serving_reader.register(registry, ServingReader(reconciler.kube, args.namespaces, args.reading,
                                                        on_pod_problem=reconciler.reconcile,
                                                        shown_problems=reconciler.shown_pod_problems,
                                                        deployments=reconciler.own_deployments))
    register_stop_flag_raiser(registry)
    if not args.no_webhook:
        webhook.register(registry, args.policy, args.namespaces)
        if args.engine_image:
            register_engine_image(registry, args.engine_image, args.namespaces)
    while True:
        settings = settings_for(args)  # makes or renews the webhook certificate
        restart = threading.Event()
        server = settings.admission.server
        if isinstance(server, kopf.WebhookServer) and server.certfile is not None:
            _restart_on_new_certificate(Path(server.certfile), restart, CERTIFICATE_CHECK_S)

        def run_kopf(settings: kopf.OperatorSettings = settings, restart: threading.Event = restart) -> None:
            with contextlib.suppress(asyncio.CancelledError):  # as kopf.run
                asyncio.run(operate(restart, registry=registry, settings=settings, standalone=True,
                                    clusterwide=not args.namespaces, namespaces=args.namespaces,
                                    liveness_endpoint=args.liveness or None, insights=optional_kinds.fresh_insights()))

        run_resiliently(run_kopf)
        if not restart.is_set():
            return 0  # stopped by a signal
        logger.info("the webhook certificate changed or is due for renewal: restarting the operator on it")


# The stop flag `operate` gave the kopf running in this context (kopf's tasks copy the context of the one that
# started them), for `register_stop_flag_raiser`'s clean-up handler.
_STOP_FLAG: contextvars.ContextVar[asyncio.Event] = contextvars.ContextVar("stop_flag")


async def operate(restart: threading.Event, **kwargs: Any) -> None:
    """kopf's operator (`kopf.operator(**kwargs)`, what `kopf.run` runs) until it stops, or until `restart` is set.

    kopf waits for a threading.Event stop flag in a thread of the event loop's default executor, and nothing releases
    that thread when kopf stops of an error: `asyncio.run` then waited for it on shutdown until kopf's
    `ultimate_exiting_timeout` SIGKILLed the process (seen: a 404 of a watch, then 15 s without webhook and exit -9,
    never `run_resiliently`'s restart). So kopf gets a flag of its own event loop, raised from here (and by
    `register_stop_flag_raiser`'s clean-up handler when kopf stops for a signal)."""
    stop = asyncio.Event()
    _STOP_FLAG.set(stop)

    async def follow() -> None:
        while not restart.is_set():
            await asyncio.sleep(RESTART_POLL_S)
        stop.set()

    follower = asyncio.create_task(follow())  # before kopf starts: kopf leaves the tasks it found alone
    try:
        await kopf.operator(stop_flag=stop, **kwargs)
    finally:
        follower.cancel()


def register_stop_flag_raiser(registry: kopf.OperatorRegistry) -> None:
    """A clean-up handler that raises `operate`'s stop flag once kopf stops for another reason (SIGTERM).

    kopf waits for its stop flag in a task of its own, which only the flag ends; stopping for a signal, kopf
    leaves that task waiting and, once everything else has stopped, gives such leftover tasks 5 s before cancelling
    them: every SIGTERM cost 5 s of nothing. Clean-up handlers run after the watches and handlers have stopped, so
    raising the flag there ends nothing early; the reconciles still running in threads are waited for all the same
    (`asyncio.run` joins its executor)."""

    @kopf.on.cleanup(id="raise-stop-flag", registry=registry)
    async def raise_stop_flag(**_: Any) -> None:
        stop = _STOP_FLAG.get(None)
        if stop is not None:
            stop.set()


def _restart_on_new_certificate(cert: Path, restart: threading.Event, interval: float) -> None:
    """Set `restart` (kopf's stop flag) once the served certificate must be replaced (certificates.py)."""
    served = cert.read_bytes()

    def watch() -> None:
        while not restart.wait(interval):
            if needs_restart(cert, served):
                restart.set()

    threading.Thread(target=watch, name="certificate-watch", daemon=True).start()
