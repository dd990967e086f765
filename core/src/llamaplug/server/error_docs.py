"""The error bodies of the OpenAPI document, given by reference and added to it when it is built.

A route's `responses={400: {"model": ErrorBody}}` makes FastAPI build a validator for that model at every
route, for every status, when the route is added: some 200 of them, 70 ms of a server's start spent on a
document most servers are never asked for. Here a route names its error model and statuses
(`error_responses`); the schema goes into the document's components once, when /openapi.json is first
built (`install`).
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

# component name -> model, for every error model a route named
_MODELS: dict[str, type[BaseModel]] = {}


def _component(model: type[BaseModel]) -> str:
    # By module: the OpenAI and Anthropic families both have an ErrorBody, of different shapes.
    return f"{model.__module__.rsplit('.', 1)[-1]}.{model.__name__}"


def error_responses(model: type[BaseModel], codes: tuple[int, ...]) -> dict[int | str, dict[str, Any]]:
    """A route's `responses=` for these statuses, each a JSON body of `model`."""
    name = _component(model)
    _MODELS[name] = model
    body = {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}
    return {code: {"description": HTTPStatus(code).phrase, "content": body} for code in codes}


def install(app: FastAPI) -> None:
    """Make the app's OpenAPI document carry the schemas of the error models its routes name."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = build()
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            for name, model in _MODELS.items():
                prefix = name.rsplit(".", 1)[0] + "."
                schema = model.model_json_schema(ref_template=f"#/components/schemas/{prefix}{{model}}")
                for inner, inner_schema in schema.pop("$defs", {}).items():
                    schemas[prefix + inner] = inner_schema
                schemas[name] = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
