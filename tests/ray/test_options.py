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


def test_a_failed_replica_ends_each_api_in_its_own_error_shape():
    from helios_serve.ray.ingress import failure_body, failure_event, response_id

    msg = "the replica serving this request failed (ActorDiedError)"
    openai = {"error": {"message": msg, "type": "server_error", "param": None, "code": None}}
    assert failure_body("/v1/chat/completions", msg) == openai
    assert failure_body("/v1/messages", msg) == {
        "type": "error", "error": {"type": "api_error", "message": msg}}
    assert failure_event("/v1/chat/completions", msg, 0) == (
        b'data: {"error":{"message":"' + msg.encode()
        + b'","type":"server_error","param":null,"code":null}}\n\n')
    assert failure_event("/v1/messages", msg, 0) == (
        b'event: error\ndata: {"type":"error","error":{"type":"api_error","message":"'
        + msg.encode() + b'"}}\n\n')
    assert failure_event("/v1/responses", msg, 7) == (
        b'event: error\ndata: {"type":"error","sequence_number":7,"code":"server_error",'
        b'"message":"' + msg.encode() + b'","param":null}\n\n')
    # The id the ingress pins a continuation to: a JSON body's, or response.created's.
    assert response_id("application/json", b'{"id": "resp_1", "object": "response"}') == "resp_1"
    created = b'event: response.created\ndata: {"type":"response.created","response":{"id":"r2"}}'
    assert response_id("text/event-stream", created) is None  # the event is not complete yet
    assert response_id("text/event-stream", created + b"\n\n") == "r2"
    assert response_id("application/json", b"{cut") is None
