"""The OpenAPI document (/openapi.json) and its Swagger UI page (/docs).

Litestar generates the paths and operations from the route handlers; the handlers read
their bodies themselves (for exact error messages), so their request bodies are added
from the same strict pydantic models the handlers parse with (`schema.REQUEST_MODELS`):
what is documented is what is accepted.

/docs works offline: the Swagger UI page loads its script and style from this server
(/docs-assets/..., the files the `swagger-ui-py` package ships: Swagger UI 5, which reads
OpenAPI 3.1), never from a CDN, and names no external favicon.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import swagger_ui
from litestar import Litestar, Request, Response, get
from litestar._openapi.plugin import OpenAPIPlugin
from litestar.exceptions import NotFoundException
from litestar.openapi.plugins import SwaggerRenderPlugin
from litestar.params import FromPath

from helios_serve.http.messages_schema import MESSAGES_REQUEST_MODELS
from helios_serve.http.schema import REQUEST_MODELS
from helios_serve.responses.schema import ResponsesRequest

# (ResponsesRequest is not in schema.REQUEST_MODELS: its module builds on http.schema)
_BODIES = {**REQUEST_MODELS, **MESSAGES_REQUEST_MODELS, "/v1/responses": ResponsesRequest}


def add_request_bodies(app: Litestar, model_names: list[str]) -> None:
    """Put each POST route's request-body schema into the app's OpenAPI document; the
    `model` field lists the names this server serves."""
    document = app.plugins.get(OpenAPIPlugin).provide_openapi_schema()  # cached dict
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    served = {"type": "string", "enum": model_names}
    for path, model in _BODIES.items():
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        if "model" in schema["properties"]:
            optional = "model" not in schema.get("required", [])
            schema["properties"]["model"] = (
                {"anyOf": [served, {"type": "null"}]} if optional else served)
        schemas[model.__name__] = schema
        document["paths"][path]["post"]["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}
            },
        }


@get("/openapi.json", include_in_schema=False)
async def openapi_json(request: Request) -> dict[str, Any]:
    """The OpenAPI 3.1 document."""
    return request.app.plugins.get(OpenAPIPlugin).provide_openapi_schema()


ASSETS = Path(swagger_ui.__file__).parent / "static"
_ASSET_TYPES = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui-standalone-preset.js": "text/javascript",
    "swagger-ui.css": "text/css",
}


def swagger_plugin() -> SwaggerRenderPlugin:
    """The /docs page, its assets served by `docs_asset`."""
    return SwaggerRenderPlugin(
        path="/", js_url="/docs-assets/swagger-ui-bundle.js",
        css_url="/docs-assets/swagger-ui.css",
        standalone_preset_js_url="/docs-assets/swagger-ui-standalone-preset.js",
        favicon="",
    )  # fmt: skip


@get("/docs-assets/{name:str}", include_in_schema=False, cache=3600)
async def docs_asset(name: FromPath[str]) -> Response:
    """A Swagger UI file (only the three the page loads).

    Raises:
        NotFoundException: any other name (404).
    """
    media_type = _ASSET_TYPES.get(name)
    if media_type is None:
        raise NotFoundException(f"no docs asset {name!r}")
    return Response((ASSETS / name).read_bytes(), media_type=media_type)
