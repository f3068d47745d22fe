"""The Ray Serve application: N Helios replicas behind one ingress (docs/deploy.md).

    application(RayOptions(...)) -> a bound Ray Serve application for serve.run

Replica deployment: `HeliosReplica`, a fixed count or autoscaling bounds, one GPU each on
cuda (`replica_gpus`), Ray's health check on each server's /health, and the
`AffinityRouter`. Ingress deployment: one `HeliosIngress` (its affinity index is its own;
with more ingress replicas each learns separately).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig

from helios_serve.ray.affinity import DEFAULT_IMBALANCE, DEFAULT_MAX_PAGES
from helios_serve.ray.ingress import HeliosIngress, RoutingOptions
from helios_serve.ray.replica import HeliosReplica
from helios_serve.ray.router import AffinityRouter

APP_NAME = "helios"
REPLICA_DEPLOYMENT = "HeliosReplica"
INGRESS_DEPLOYMENT = "HeliosIngress"


@dataclass(frozen=True)
class RayOptions:
    """A deployment of one core on Ray Serve.

    Attributes:
        core, trust, accept: the signed core, trusted public keys, accepted namespace.
        serve_args: further helios-serve options for every replica (--backend, ...).
        replicas: replica count when not autoscaling (>= 1).
        min_replicas, max_replicas: autoscaling bounds; max_replicas set = autoscaling.
        target_ongoing_requests: autoscaling's target of in-flight requests per replica.
        max_ongoing_requests: requests one replica is sent at once (Ray queues the rest).
        replica_cpus, replica_gpus: Ray resources per replica (1 GPU each on cuda).
        affinity: conversation-affine routing (False: power of two choices on load only).
        imbalance: extra queued requests a preferred replica may carry.
        max_pages: leading pages hashed per prompt.
        health_check_period_s, health_check_timeout_s: Ray's health check of each replica.
        start_timeout_s: seconds a replica's server may take to load.
        resource_key: the AES key of an encrypted logical-resource core, or None.
        routing_stats_period_s: how often the router reads each replica's load gauges.
    """

    core: str
    trust: tuple[str, ...]
    accept: str
    serve_args: tuple[str, ...] = ()
    replicas: int = 2
    min_replicas: int | None = None
    max_replicas: int | None = None
    target_ongoing_requests: float = 8.0
    max_ongoing_requests: int = 64
    replica_cpus: float = 1.0
    replica_gpus: float = 0.0
    affinity: bool = True
    imbalance: int = DEFAULT_IMBALANCE
    max_pages: int = DEFAULT_MAX_PAGES
    health_check_period_s: float = 5.0
    health_check_timeout_s: float = 30.0
    start_timeout_s: float = 600.0
    resource_key: bytes | None = field(default=None, repr=False)
    routing_stats_period_s: float = 1.0

    def serve_argv(self, resource_key_file: str | None = None) -> list[str]:
        """helios-serve's arguments for one replica (host and port are the replica's)."""
        argv = [self.core, "--accept", self.accept]
        for key in self.trust:
            argv += ["--trust", key]
        if resource_key_file is not None:
            argv += ["--resource-key", resource_key_file]
        return [*argv, *self.serve_args]

    def scaling(self) -> dict[str, Any]:
        """serve.deployment's scaling options: num_replicas, or autoscaling_config."""
        if self.max_replicas is None:
            return {"num_replicas": self.replicas}
        return {"autoscaling_config": {
            "min_replicas": self.min_replicas if self.min_replicas is not None else 1,
            "max_replicas": self.max_replicas,
            "initial_replicas": self.replicas,
            "target_ongoing_requests": self.target_ongoing_requests,
        }}  # fmt: skip


def application(options: RayOptions, resource_key_file: str | None = None) -> Any:
    """The bound application (serve.run(application(...), name=APP_NAME))."""
    replica = serve.deployment(
        HeliosReplica, name=REPLICA_DEPLOYMENT,
        ray_actor_options={"num_cpus": options.replica_cpus, "num_gpus": options.replica_gpus},
        max_ongoing_requests=options.max_ongoing_requests,
        health_check_period_s=options.health_check_period_s,
        health_check_timeout_s=options.health_check_timeout_s,
        request_router_config=RequestRouterConfig(
            request_router_class=AffinityRouter,
            request_router_kwargs={"imbalance": options.imbalance},
            request_routing_stats_period_s=options.routing_stats_period_s,
        ),
        **options.scaling(),
    )  # fmt: skip
    # The ingress does no model work: it needs no CPU reservation of its own, and takes
    # a high in-flight limit (every stream passes through it).
    ingress = serve.deployment(HeliosIngress, name=INGRESS_DEPLOYMENT, num_replicas=1,
                               ray_actor_options={"num_cpus": 0},
                               max_ongoing_requests=100_000)  # fmt: skip
    routing = RoutingOptions(options.affinity, options.core, options.trust, options.accept,
                             options.resource_key, options.max_pages)  # fmt: skip
    return ingress.bind(replica.bind(options.serve_argv(resource_key_file),
                                     options.start_timeout_s), routing)  # fmt: skip
