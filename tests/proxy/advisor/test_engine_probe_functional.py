"""The advisor's one question to the upstream, which engine it is, over real sockets."""

from __future__ import annotations

import socket

import pytest
from aiohttp import web

from proxy.advisor.web import probe_engine


async def _models(request: web.Request) -> web.Response:
    body = {"object": "list", "data": [{"id": "tiny", "object": "model", "owned_by": "llamacpp"}]}
    return web.json_response(body, headers={"Server": "llama.cpp"})


@pytest.mark.timeout(30)
async def test_the_server_header_and_owned_by_are_read(aiohttp_server):
    app = web.Application()
    app.router.add_get("/v1/models", _models)
    server = await aiohttp_server(app)
    got = await probe_engine(str(server.make_url("/")))
    assert got == {"server": "llama.cpp", "owned_by": "llamacpp", "model": "tiny", "error": None}


@pytest.mark.timeout(30)
async def test_an_upstream_without_models_still_names_its_server(aiohttp_server):
    server = await aiohttp_server(web.Application())  # every path 404
    got = await probe_engine(str(server.make_url("")))
    assert got["server"] is not None
    assert got["server"].startswith("Python/")
    assert got["owned_by"] is None
    assert got["error"] == "GET /v1/models: HTTP 404"


@pytest.mark.timeout(30)
async def test_an_upstream_not_there_is_an_error_not_an_exception():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    got = await probe_engine(f"http://127.0.0.1:{port}", timeout_s=2.0)
    assert got["server"] is None
    assert got["error"] is not None
    assert got["error"].startswith("GET /v1/models: ")
