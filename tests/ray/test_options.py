"""helios-serve-ray's options as Ray Serve sees them (no cluster needed)."""

from __future__ import annotations

from helios_serve.ray.app import RayOptions, application


def test_fixed_replicas_or_autoscaling_bounds():
    fixed = RayOptions(core="m.core", trust=("a.pub", "b.pub"), accept="ns", replicas=3,
                       serve_args=("--max-active", "8"))
    assert fixed.scaling() == {"num_replicas": 3}
    assert fixed.serve_argv("key.bin") == ["m.core", "--accept", "ns", "--trust", "a.pub",
                                          "--trust", "b.pub", "--resource-key", "key.bin",
                                          "--max-active", "8"]
    scaled = RayOptions(core="m.core", trust=("a.pub",), accept="ns", replicas=2,
                        min_replicas=1, max_replicas=4, target_ongoing_requests=6)
    assert scaled.scaling() == {"autoscaling_config": {
        "min_replicas": 1, "max_replicas": 4, "initial_replicas": 2,
        "target_ongoing_requests": 6}}


def test_the_replica_deployment_carries_the_options():
    options = RayOptions(core="m.core", trust=("a.pub",), accept="ns", replicas=2,
                         min_replicas=1, max_replicas=4, replica_gpus=1, replica_cpus=2,
                         max_ongoing_requests=16, health_check_period_s=3,
                         health_check_timeout_s=9)
    ingress = application(options)
    (replica,) = ingress._bound_deployment.init_args[:1]  # the ingress's first argument
    config = replica._bound_deployment._deployment_config
    assert config.max_ongoing_requests == 16
    assert (config.health_check_period_s, config.health_check_timeout_s) == (3, 9)
    scaling = config.autoscaling_config
    assert (scaling.min_replicas, scaling.max_replicas, scaling.initial_replicas) == (1, 4, 2)
    assert replica._bound_deployment.ray_actor_options == {"num_cpus": 2, "num_gpus": 1}
    router = config.request_router_config
    assert router.request_router_class.endswith("AffinityRouter")
    assert router.request_router_kwargs == {"imbalance": 4}
