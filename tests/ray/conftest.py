"""One local Ray cluster for the Ray tests (starting one takes ~20 s on the CI machine).

test_replicas.py drives it in-process (Serve's Python API); test_cli.py's end-to-end test
joins it with `helios-serve-ray --ray-address`. Each starts Serve on the cluster and shuts
it down when done, so either may run first, or alone.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # before Ray reads it: see cli.py


@pytest.fixture(scope="session")
def ray_cluster() -> str:
    """A local Ray cluster (4 CPUs, no dashboard) with this process as a driver; yields its
    GCS address (`HOST:PORT`), which other drivers join."""
    # Imported here: the Ray tests that need no cluster (routing rules, options) do not
    # pay for importing Ray, and a missing Ray skips only the tests that use a cluster.
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=4, include_dashboard=False, logging_level="WARNING",
             log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()
