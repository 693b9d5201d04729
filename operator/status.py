"""The InferenceService status as a pydantic model; the CRD's status schema is generated from it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from flotilla.operator.spec import _Model


class Condition(_Model):
    """One status condition, as in metav1.Condition."""

    type: str = Field(description="Valid, FitChecked, Progressing, Ready or Degraded.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str | None = Field(default=None, description="One CamelCase word saying why.")
    message: str | None = Field(default=None, description="What happened and what to do, for people.")
    last_transition_time: str | None = Field(default=None, description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(default=None, description="Generation this condition is about.")


class FitStatus(_Model):
    """The fit check's figures for one replica (operator/fit.py)."""

    verdict: Literal["Fits", "FitsWithWarning", "DoesNotFit", "Unknown"] = Field(description="The outcome.")
    reason: str | None = Field(default=None, description="Why, in one CamelCase word.")
    message: str | None = Field(default=None, description="The figures in words.")
    weight_bytes: int | None = Field(default=None, description="Estimated weight bytes.")
    kv_bytes_per_token: int | None = Field(default=None, description="KV-cache bytes per token.")
    activation_bytes: int | None = Field(default=None, description="Activation and runtime allowance.")
    budget_bytes: int | None = Field(default=None, description="GPUs x memory x gpuMemoryUtilization.")
    kv_budget_bytes: int | None = Field(default=None, description="What is left for the KV cache.")
    max_model_len: int | None = Field(default=None, description="Sequence length the check used.")
    max_concurrency: float | None = Field(
        default=None, description="Sequences of maxModelLen that fit at once.")


class ServingFigures(_Model):
    """How replicas are serving, from their /metrics (operator/serving_status.py); latencies and
    rates over the last window."""

    running: int = Field(description="Requests in the running batch (vllm:num_requests_running).")
    waiting: int = Field(description="Requests queued for admission (vllm:num_requests_waiting).")
    kv_cache_usage_percent: float | None = Field(
        default=None, description="KV-cache blocks in use, % (vllm:kv_cache_usage_perc; replicas' mean).")
    prefix_cache_hit_rate_percent: float | None = Field(
        default=None, description="Prompt tokens found in the prefix cache over the window, %.")
    generation_tokens_per_second: float | None = Field(
        default=None, description="Output tokens per second over the window.")
    ttft_p50_seconds: float | None = Field(default=None, description="Time to first token, median, over the window.")
    ttft_p95_seconds: float | None = Field(default=None, description="Time to first token, p95, over the window.")
    inter_token_latency_p95_seconds: float | None = Field(
        default=None, description="Inter-token latency, p95, over the window.")


class ReplicaServing(ServingFigures):
    """One engine pod's figures."""

    pod: str = Field(description="Pod name.")


class ServingStatus(ServingFigures):
    """Live serving figures of all replicas together, and of each."""

    window_seconds: float = Field(description="Window of the rates and latency percentiles.")
    observed_at: str = Field(description="When the figures were read (RFC 3339).")
    scraped: int = Field(description="Engine pods whose /metrics answered.")
    unreachable: int = Field(default=0, description="Engine pods with an address whose /metrics did not answer.")
    replicas: list[ReplicaServing] = Field(default_factory=list, description="Per-pod figures.")


class InferenceServiceStatus(_Model):
    """Observed state, written by the operator."""

    phase: str | None = Field(
        default=None, description="Pending, Progressing, Ready, ScaledToZero, Degraded or Failed.")
    observed_generation: int | None = Field(default=None, description="Spec generation last reconciled.")
    replicas: int | None = Field(default=None, description="Engine pods that exist (from the Deployment).")
    ready_replicas: int | None = Field(default=None, description="Engine pods that are ready.")
    selector: str | None = Field(
        default=None, description="Label selector of the pods (for the scale subresource).")
    gpus: int | None = Field(default=None, description="GPUs requested by all replicas.")
    url: str | None = Field(default=None, description="In-cluster base URL of the OpenAI API.")
    autoscaler: str | None = Field(default=None, description="Which autoscaler is in use: HPA, KEDA or none.")
    monitoring: str | None = Field(default=None, description="ServiceMonitor created, or why not.")
    fit: FitStatus | None = Field(default=None, description="The fit check's outcome and figures.")
    serving: ServingStatus | None = Field(
        default=None, description="Live serving figures from the engines' /metrics, written on a period.")
    conditions: list[Condition] = Field(
        default_factory=list, description="Valid, FitChecked, Progressing, Ready, Degraded.")
