"""The OpenAPI document (/openapi.json) and its Swagger UI page (/docs).

Litestar generates the paths and operations from the route handlers; the handlers read
their bodies themselves (for exact error messages), so their request bodies are added
from the same strict pydantic models the handlers parse with (`schema.REQUEST_MODELS`):
what is documented is what is accepted.
"""

from __future__ import annotations

from typing import Any

from litestar import Litestar, Request, get
from litestar._openapi.plugin import OpenAPIPlugin

from helios_serve.http.schema import REQUEST_MODELS
from helios_serve.responses.schema import ResponsesRequest

# (ResponsesRequest is not in schema.REQUEST_MODELS: its module builds on http.schema)
_BODIES = {**REQUEST_MODELS, "/v1/responses": ResponsesRequest}


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
