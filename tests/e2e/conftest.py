"""A real helios-serve (Bootstrap.load -> NativeModel.load -> Server.start) on 127.0.0.1
around the SmolLM2 core exported once per session (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from helios_serve.bootstrap import Bootstrap
from helios_serve.clock import ObservationClock
from helios_serve.config import ServeOptions, resolve
from helios_serve.runtime.native_model import NativeModel
from helios_serve.server import Server


@contextmanager
def served_on_cpu(path: Path, public: Path, namespace: str) -> Iterator[tuple]:
    """`path` served on the cpu backend (2 running requests, a queue of 4) for the
    block: yields (bootstrap, settings, an openai client of its /v1); stops the server
    and closes the core after it."""
    import openai

    bootstrap = Bootstrap.load(path, [public], namespace)
    settings = resolve(ServeOptions(port=0, max_active=2, queue_capacity=4), bootstrap.contract)
    model = NativeModel.load(bootstrap.prepared, bootstrap.core.read_resource, "cpu",
                             max_concurrency=settings.max_active)
    server = Server.start(bootstrap, model, settings, ObservationClock())
    try:
        yield bootstrap, settings, openai.OpenAI(base_url=server.url + "/v1", api_key="unused",
                                                 max_retries=0, timeout=600.0)
    finally:
        server.stop()
        bootstrap.close()


@pytest.fixture(scope="session")
def real_server(smollm2_core_f32):
    core = smollm2_core_f32
    bootstrap = Bootstrap.load(core.path, [core.public_key], core.namespace)
    settings = resolve(ServeOptions(port=0, max_active=4, queue_capacity=8), bootstrap.contract)
    clock = ObservationClock()
    model = NativeModel.load(bootstrap.prepared, bootstrap.core.read_resource, "cpu",
                             max_concurrency=settings.max_active)
    server = Server.start(bootstrap, model, settings, clock)
    yield server
    server.stop()
    bootstrap.close()


@pytest.fixture
def client(real_server):
    import openai

    return openai.OpenAI(base_url=real_server.url + "/v1", api_key="unused", max_retries=0,
                         timeout=300.0)


@pytest.fixture(scope="session")
def tiny_thread_server(tiny_served):
    """A real helios-serve around the tiny model core (context 256): the whole serving
    path with real weights, in about a second; for API tests where the model's answers
    do not matter. The model worker is a thread of this process."""
    core = tiny_served.core
    bootstrap = Bootstrap.load(core.path, [core.public_key], core.namespace)
    settings = resolve(ServeOptions(port=0, max_active=4, queue_capacity=8), bootstrap.contract)
    clock = ObservationClock()
    model = NativeModel.load(bootstrap.prepared, bootstrap.core.read_resource, "cpu",
                             max_concurrency=settings.max_active)
    server = Server.start(bootstrap, model, settings, clock)
    yield server
    server.stop()
    bootstrap.close()


@pytest.fixture(scope="session")
def tiny_engine_server(tiny_served):
    """The same server with `--engine-process`: cli.start spawns the engine process
    (model worker, scheduler, NativeModel); HTTP and the relayed pipelines run here."""
    from helios_serve.cli import start

    core = tiny_served.core
    server = start(core.path, [str(core.public_key)], core.namespace,
                   ServeOptions(port=0, max_active=4, queue_capacity=8, engine_process=True))
    server.serve_in_background()
    yield server
    server.stop()
    server.bootstrap.close()


@pytest.fixture(scope="session", params=["thread", "engine_process"])
def tiny_server(request):
    """The tiny-model server in both modes (model worker thread; engine process)."""
    name = "tiny_thread_server" if request.param == "thread" else "tiny_engine_server"
    return request.getfixturevalue(name)
