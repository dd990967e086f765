"""Hostile JSON schemas cost bounded time and memory: llama.cpp's own converter (issue 36, A1-A2).

Each probe goes to a fresh `llamaplug serve` (loopback, bounded): the request ends in a 4xx or a success
within a time limit, /health answers within 0.5 s while it runs, resident memory grows by at most
256 MiB, and the server is still up after. The converter's growth is measured on generated schemas:
grammar size and conversion time grow at most linearly with the schema (its digits, its properties, and a
hypothesis-generated set of nested schemas, where each verdict and grammar also equals llama.cpp's converter's
as the pin's tools build it).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llamaplug_testing import llamaplug_server, post_status

from llamaplug.blocks.json_schema import MAX_OPTIONAL, UnsupportedSchemaError, schema_to_gbnf

MIB = 1024 * 1024


def _health_ms(port: int) -> float:
    start = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
        assert resp.status == 200
    return (time.perf_counter() - start) * 1000


def _optional_props(n: int) -> dict:
    return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(n)}}


PROBES = {
    "huge-integer-range": {"response_format": {"type": "json_schema", "json_schema": {
        "name": "n", "schema": {"type": "integer", "minimum": -1e300, "maximum": 1e300}}}},
    # refused (MAX_OPTIONAL): llama.cpp's converter would take minutes
    "4000-optional-properties": {"response_format": {"type": "json_schema", "json_schema": {
        "name": "o", "schema": _optional_props(4000)}}},
    "forced-tool-with-huge-range": {"tool_choice": "required", "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {
            "n": {"type": "integer", "minimum": -1e300, "maximum": 1e300}}, "required": ["n"]}}}]},
    "maximum-1e400": {"raw": b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, '
                             b'"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": '
                             b'{"type": "number", "maximum": 1e400}}}}'},
    "deep-pattern": {"response_format": {"type": "json_schema", "json_schema": {
        "name": "p", "schema": {"type": "string", "pattern": "(" * 400 + "a" + ")" * 400}}}},
}


@pytest.mark.parametrize("probe", PROBES)
def test_a_hostile_schema_is_answered_quickly_and_the_server_stays_up(probe, smollm2_path):
    body = {"messages": [{"role": "user", "content": "A number:"}], "max_tokens": 8, **PROBES[probe]}
    raw = body.pop("raw", None)
    with llamaplug_server(smollm2_path, "-c", "2048", "-np", "2") as (port, proc):
        before = psutil.Process(proc.pid).memory_info().rss
        result: dict = {}

        def send() -> None:
            if raw is not None:
                request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=raw,
                                                 headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(request, timeout=60) as resp:
                        result["status"] = resp.status
                except urllib.error.HTTPError as err:
                    result["status"] = err.code
            else:
                result["status"], result["body"] = post_status(port, "/v1/chat/completions", body, timeout=60)

        worker = threading.Thread(target=send)
        start = time.monotonic()
        worker.start()
        slowest = 0.0
        while worker.is_alive() and time.monotonic() - start < 30:
            slowest = max(slowest, _health_ms(port))
            time.sleep(0.05)
        worker.join(timeout=30)
        elapsed = time.monotonic() - start
        assert not worker.is_alive(), f"{probe}: no answer in 60 s"
        assert elapsed < 30, f"{probe}: took {elapsed:.1f} s"
        status = result["status"]
        assert status == 200 or 400 <= status < 500, (probe, result)
        assert slowest < 500, f"/health took {slowest:.0f} ms while {probe} ran"
        grown = psutil.Process(proc.pid).memory_info().rss - before
        assert grown < 256 * MIB, f"{probe}: resident memory grew {grown / MIB:.0f} MiB"
        assert proc.poll() is None and _health_ms(port) < 500


def test_300_optional_properties_are_accepted_as_llama_server_does():
    grammar = schema_to_gbnf(_optional_props(300))
    assert "p299" in grammar


def test_nan_and_infinities_are_refused_before_the_converter():
    for bad in (float("nan"), float("inf"), 10 ** 80):
        with pytest.raises(UnsupportedSchemaError) as err:
            schema_to_gbnf({"type": "number", "maximum": bad})
        assert err.value.field == "schema" and "#/maximum" in str(err.value)


@settings(max_examples=25, deadline=None)
@given(digits=st.integers(min_value=1, max_value=300))
def test_integer_ranges_cost_the_same_whatever_their_digits(digits):
    """The bounds of 10^digits: a grammar no larger than int64's range makes, or llama.cpp's refusal (past
    int64 it reads no bound); either way at once (the converter once doubled its grammar per digit)."""
    small = len(schema_to_gbnf({"type": "integer", "minimum": -(10 ** 18), "maximum": 10 ** 18}))
    start = time.perf_counter()
    try:
        size = len(schema_to_gbnf({"type": "integer", "minimum": -float(f"1e{digits}"),
                                   "maximum": float(f"1e{digits}")}))
    except UnsupportedSchemaError:
        size = 0
    assert time.perf_counter() - start < 1
    assert size <= 2 * small


@settings(max_examples=15, deadline=None)
@given(n=st.integers(min_value=1, max_value=MAX_OPTIONAL))
def test_optional_properties_grow_linearly_up_to_the_cap(n):
    one = len(schema_to_gbnf(_optional_props(1)))
    grammar = schema_to_gbnf(_optional_props(n))
    assert len(grammar) <= 200 * n + 10 * one


def test_more_optional_properties_than_the_cap_are_refused_naming_where():
    schema = {"type": "object", "properties": {"inner": _optional_props(MAX_OPTIONAL + 1)}}
    with pytest.raises(UnsupportedSchemaError) as err:
        schema_to_gbnf(schema)
    assert "#/properties/inner/properties" in str(err.value) and str(MAX_OPTIONAL) in str(err.value)
    required = dict(_optional_props(MAX_OPTIONAL + 1), required=[f"p{i}" for i in range(MAX_OPTIONAL + 1)])
    assert "p512" in schema_to_gbnf(required)  # required ones have no such cost


# Generated schemas of bounded size (up to ~3 KB): the shapes the converter handles (scalars with their bounds,
# enums, arrays, objects with required and optional properties, anyOf), nested, and two it refuses.
_NAMES = st.text(alphabet="abcdefghij_", min_size=1, max_size=6)
_SCALARS = st.one_of(
    st.just({"type": "string"}), st.just({"type": "boolean"}), st.just({"type": "null"}),
    st.builds(lambda lo, n: {"type": "string", "minLength": lo, "maxLength": lo + n},
              st.integers(0, 20), st.integers(0, 20)),
    st.builds(lambda lo, n: {"type": "integer", "minimum": lo, "maximum": lo + n},
              st.integers(-10 ** 9, 10 ** 9), st.integers(0, 10 ** 9)),
    st.builds(lambda lo: {"type": "integer", "minimum": lo}, st.integers(-10 ** 6, 10 ** 6)),
    st.just({"type": "number"}),
    st.builds(lambda values: {"enum": values}, st.lists(st.one_of(st.integers(-99, 99), _NAMES), min_size=1,
                                                          max_size=5, unique=True)),
    st.builds(lambda v: {"const": v}, _NAMES),
    # what llama.cpp refuses, so that the set has refusals to agree on too
    st.just({"$ref": "#/$defs/missing"}), st.just({"type": "integer", "minimum": 5, "maximum": 2}),
)


def _nested(children: st.SearchStrategy) -> st.SearchStrategy:
    def obj(props: dict, n_required: int, extra: bool) -> dict:
        names = list(props)
        return {"type": "object", "properties": props, "required": names[:n_required],
                "additionalProperties": extra}

    return st.one_of(
        st.builds(lambda items, lo, n: {"type": "array", "items": items, "minItems": lo, "maxItems": lo + n},
                  children, st.integers(0, 3), st.integers(0, 5)),
        st.builds(obj, st.dictionaries(_NAMES, children, min_size=1, max_size=6), st.integers(0, 6), st.booleans()),
        st.builds(lambda options: {"anyOf": options}, st.lists(children, min_size=2, max_size=3)),
    )


SCHEMAS = st.recursive(_SCALARS, _nested, max_leaves=40)


@pytest.fixture(scope="module")
def converter_reference(native_tools):
    """llama.cpp's converter as the pin's tools build it: (refused, grammar)."""
    import subprocess

    import native_tools as tools

    path = tools.json_schema_reference()

    def convert(schema: dict) -> tuple[bool, str]:
        done = subprocess.run([str(path)], input=json.dumps(schema), capture_output=True, text=True, timeout=60)
        return done.returncode != 0, done.stdout

    return convert


@settings(max_examples=150, deadline=None)
@given(schema=SCHEMAS)
def test_generated_schemas_convert_in_linear_size_and_time_as_llama_cpp_converts_them(schema, converter_reference):
    size = len(json.dumps(schema))
    start = time.perf_counter()
    try:
        grammar, refused = schema_to_gbnf(schema), False
    except UnsupportedSchemaError:
        grammar, refused = "", True
    took = time.perf_counter() - start
    assert (refused, grammar) == converter_reference(schema)  # the same verdict and the same grammar
    assert len(grammar) <= 40 * size + 3000, (size, len(grammar))
    assert took <= 0.25 + size * 1e-4, (size, took)  # 0.1 ms a schema character: far above linear noise
