"""grout serve --allowed-origin: a real server answers browsers' CORS requests from the
origins it was given, and only from them."""
import httpx
import pytest

from server_process import cpu_server

ALLOWED = "http://localhost:3000"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with cpu_server(tmp_path_factory, "server_cors", 64, "--allowed-origin", ALLOWED) as s:
        yield s


def test_a_preflight_from_an_allowed_origin_is_answered(server):
    r = httpx.options(f"{server.url}/v1/chat/completions", headers={
        "Origin": ALLOWED, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == ALLOWED
    assert "POST" in r.headers["access-control-allow-methods"]


def test_a_completion_from_an_allowed_origin_carries_the_allow_header(server):
    r = httpx.post(f"{server.url}/v1/completions", headers={"Origin": ALLOWED}, json={
        "model": "tiny", "prompt": "Hello", "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] is not None
    assert r.headers["access-control-allow-origin"] == ALLOWED


def test_another_origin_gets_no_allow_header(server):
    r = httpx.get(f"{server.url}/v1/models", headers={"Origin": "http://evil.example"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    pre = httpx.options(f"{server.url}/v1/completions", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 400 and "access-control-allow-origin" not in pre.headers
