"""The Ray Serve request router of the replica deployment: `affinity.choose` over the
replicas Ray offers, with their load.

A replica's queue is the router's own count of requests it has in flight there (Ray's
queue-length cache: fresh on every send and completion) or, before Ray has one, the
waiting + running requests of the replica's last routing stats; its KV use comes from
those stats (`HeliosReplica.record_routing_stats`, every request_routing_stats_period_s).
"""

from __future__ import annotations

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

from helios_serve.ray.affinity import DEFAULT_IMBALANCE, ReplicaLoad, RouteHint, choose


class AffinityRouter(FIFOMixin, RequestRouter):
    """Prefix- and session-affine power of two choices (helios_serve.ray.affinity)."""

    def initialize_state(self, imbalance: int = DEFAULT_IMBALANCE, **kwargs) -> None:
        self.imbalance = imbalance

    def _load(self, replica: RunningReplica) -> ReplicaLoad:
        stats = replica.routing_stats or {}
        queue = self.replica_queue_len_cache.get(replica.replica_id)
        if queue is None:
            queue = int(stats.get("waiting", 0) + stats.get("running", 0))
        return ReplicaLoad(replica.replica_id.unique_id, queue, float(stats.get("kv_usage", 0.0)))

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:  # fmt: skip
        """Ranks of one replica each, best first (Ray tries the next rank when a replica
        refuses: its max_ongoing_requests is reached)."""
        if not candidate_replicas:
            return []
        hint = pending_request.kwargs.get("hint") if pending_request is not None else None
        if not isinstance(hint, RouteHint):
            hint = None
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        order = choose([self._load(r) for r in candidate_replicas], hint,
                       imbalance=self.imbalance)  # fmt: skip
        return [[by_id[i]] for i in order]
