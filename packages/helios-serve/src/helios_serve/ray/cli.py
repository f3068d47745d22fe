"""`helios-serve-ray`: N Helios replicas of one core behind a Ray Serve ingress.

    helios-serve-ray CORE --trust PUB --accept NAMESPACE [--replicas N] [options]
        [-- HELIOS-SERVE OPTIONS]

The core is verified here first (a bad core, key or namespace is one line and exit 2
before Ray starts); then a local Ray cluster is started (or `--ray-address` joined), the
application deployed, and `Helios is serving N replicas of CORE at URL (Ray Serve)`
printed to stdout once every replica's /health answers (stdout's only line: Ray's own
output goes to stderr). SIGINT or SIGTERM shuts Serve and Ray down (exit 0). A replica
that cannot start is one line and exit 2. Options after `--` go to every replica's
helios-serve (`--backend cuda`, `--max-active 8`, ...).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

import click

from helios_serve.bootstrap import StartupError
from helios_serve.ray.affinity import DEFAULT_IMBALANCE, DEFAULT_MAX_PAGES
from helios_serve.ray.prompt import PromptRouting

EXIT_STARTUP = 2


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _fail(message: str) -> None:
    click.echo(f"helios-serve-ray: error: {message}", err=True)
    sys.exit(EXIT_STARTUP)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("core", type=click.Path())
@click.argument("serve_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--trust", multiple=True, type=click.Path(dir_okay=False), required=True,
              help="Trusted publisher public key (PEM); repeatable.")
@click.option("--accept", required=True, help="Accepted publisher namespace.")
@click.option("--resource-key", type=click.Path(dir_okay=False),
              help="AES-256 key file of an encrypted logical-resource core.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Ingress address.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535),
              help="Ingress port (0: any free port).")
@click.option("--replicas", default=2, show_default=True, type=click.IntRange(min=1),
              help="Replicas (the initial count when autoscaling).")
@click.option("--min-replicas", type=click.IntRange(min=0),
              help="Autoscaling lower bound [1] (needs --max-replicas).")
@click.option("--max-replicas", type=click.IntRange(min=1),
              help="Autoscaling upper bound: turns autoscaling on.")
@click.option("--target-ongoing-requests", default=8.0, show_default=True,
              type=click.FloatRange(min=0, min_open=True),
              help="Autoscaling's target of in-flight requests per replica.")
@click.option("--max-ongoing-requests", default=64, show_default=True,
              type=click.IntRange(min=1), help="Requests one replica is sent at once.")
@click.option("--replica-cpus", default=1.0, show_default=True,
              type=click.FloatRange(min=0), help="Ray CPUs reserved per replica.")
@click.option("--replica-gpus", default=0.0, show_default=True,
              type=click.FloatRange(min=0),
              help="Ray GPUs per replica (1 with `-- --backend cuda`: one card each).")
@click.option("--affinity/--no-affinity", default=True, show_default=True,
              help="Conversation-affine routing (off: power of two choices on load only).")
@click.option("--imbalance", default=DEFAULT_IMBALANCE, show_default=True,
              type=click.IntRange(min=0),
              help="Extra queued requests the replica holding a prefix may carry.")
@click.option("--affinity-pages", default=DEFAULT_MAX_PAGES, show_default=True,
              type=click.IntRange(min=1), help="Leading prompt pages hashed for affinity.")
@click.option("--health-check-period", default=5.0, show_default=True,
              type=click.FloatRange(min=0, min_open=True), help="Seconds between health checks.")
@click.option("--health-check-timeout", default=30.0, show_default=True,
              type=click.FloatRange(min=0, min_open=True), help="Seconds a health check may take.")
@click.option("--ray-address", default=None,
              help="Join this Ray cluster ('auto': the local one) [start a local cluster].")
def main(core, serve_args, trust, accept, resource_key, host, port, replicas, min_replicas,
         max_replicas, target_ongoing_requests, max_ongoing_requests, replica_cpus,
         replica_gpus, affinity, imbalance, affinity_pages, health_check_period,
         health_check_timeout, ray_address) -> None:  # fmt: skip
    """Serve CORE with N Helios replicas behind a Ray Serve ingress (docs/deploy.md)."""
    if min_replicas is not None and max_replicas is None:
        _fail("--min-replicas needs --max-replicas (autoscaling bounds)")
    if max_replicas is not None and not (min_replicas or 1) <= replicas <= max_replicas:
        _fail(f"--replicas {replicas} must lie within the autoscaling bounds "
              f"[{min_replicas if min_replicas is not None else 1}, {max_replicas}]")
    key = None
    if resource_key is not None:
        try:
            key = Path(resource_key).read_bytes()
        except OSError as exc:
            _fail(f"cannot read --resource-key {resource_key}: {exc.strerror}")
    try:  # verify once here: a bad core fails in one line before any replica starts
        PromptRouting.from_core(core, trust, accept, key)
    except StartupError as exc:
        _fail(str(exc))
    # Ray's `uv run` hook would build a fresh environment for every worker; the workers
    # run this interpreter's environment instead.
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    # Ray is imported after that setting (it reads it at import), so here, not at the top.
    import ray
    from ray import serve  # (after the setting above, as `ray`)

    from helios_serve.ray.app import APP_NAME, RayOptions, application  # imports Ray

    options = RayOptions(
        core=str(core), trust=tuple(trust), accept=accept, serve_args=tuple(serve_args),
        replicas=replicas, min_replicas=min_replicas, max_replicas=max_replicas,
        target_ongoing_requests=target_ongoing_requests,
        max_ongoing_requests=max_ongoing_requests, replica_cpus=replica_cpus,
        replica_gpus=replica_gpus, affinity=affinity, imbalance=imbalance,
        max_pages=affinity_pages, health_check_period_s=health_check_period,
        health_check_timeout_s=health_check_timeout, resource_key=key,
    )  # fmt: skip
    port = port or _free_port(host)
    # Ray's driver prints forwarded worker lines and the cluster's error messages (a
    # raylet's warning, a worker that died: tagged as stdout) to whatever sys.stdout is at
    # print time; joining a cluster that already ran jobs prints some at once. They go to
    # stderr, so that stdout carries the banner line alone, first, as scripts read it.
    banner_out, sys.stdout = sys.stdout, sys.stderr
    try:
        ray.init(address=ray_address, include_dashboard=False, logging_level="WARNING")
    except Exception as exc:  # Ray raises a plain Exception (or ConnectionError) here
        _fail(f"Ray did not start: {str(exc).strip().splitlines()[-1]}")
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(application(options, resource_key), name=APP_NAME, route_prefix="/")
    except (RuntimeError, ray.exceptions.RayError) as exc:
        serve.shutdown()
        ray.shutdown()
        _fail(f"the replicas did not start: {str(exc).strip().splitlines()[-1]}")
    click.echo(f"Helios is serving {replicas} replicas of {core} at http://{host}:{port} "
               "(Ray Serve)", file=banner_out)
    banner_out.flush()
    stop = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    signal.sigwait(stop)
    serve.shutdown()
    ray.shutdown()
