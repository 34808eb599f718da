"""Who may call grout serve: a real server started with --api-key and --allowed-origin
answers /v1 requests that carry its key, from any client, and browsers' CORS requests from
the origins it was given; /health and CORS preflights need no key."""
import httpx
import openai
import pytest

from server_process import cpu_server

ALLOWED = "http://localhost:3000"
KEY = "sk-grout-test-key"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with cpu_server(tmp_path_factory, "server_access", 64, "--allowed-origin", ALLOWED,
                    "--api-key", KEY) as s:
        yield s


def authorized(key=KEY) -> dict:
    return {"Authorization": f"Bearer {key}"}


def test_the_openai_client_with_the_key_is_served(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY)
    r = client.completions.create(model="tiny", prompt="Hello", max_tokens=2, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length")


def test_the_openai_client_with_a_wrong_key_gets_an_authentication_error(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        client.models.list()
    assert e.value.status_code == 401 and e.value.code == "invalid_api_key"


@pytest.mark.parametrize("headers", [{}, {"Authorization": KEY},
                                     {"Authorization": f"Basic {KEY}"}],
                         ids=["no header", "no scheme", "another scheme"])
def test_a_request_without_a_bearer_key_gets_401_with_an_openai_body(server, headers):
    r = httpx.post(f"{server.url}/v1/chat/completions", headers=headers, json={
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json()["error"]["code"] == "invalid_api_key"


def test_health_needs_no_key(server):
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_a_preflight_from_an_allowed_origin_is_answered_without_a_key(server):
    r = httpx.options(f"{server.url}/v1/chat/completions", headers={
        "Origin": ALLOWED, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == ALLOWED
    assert "POST" in r.headers["access-control-allow-methods"]


def test_a_completion_from_an_allowed_origin_carries_the_allow_header(server):
    r = httpx.post(f"{server.url}/v1/completions", headers={"Origin": ALLOWED, **authorized()},
                   json={"model": "tiny", "prompt": "Hello", "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] is not None
    assert r.headers["access-control-allow-origin"] == ALLOWED


def test_a_refusal_for_want_of_a_key_still_reaches_an_allowed_page(server):
    r = httpx.get(f"{server.url}/v1/models", headers={"Origin": ALLOWED})
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == ALLOWED


def test_another_origin_gets_no_allow_header(server):
    r = httpx.get(f"{server.url}/v1/models", headers={"Origin": "http://evil.example",
                                                      **authorized()})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    pre = httpx.options(f"{server.url}/v1/completions", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 400 and "access-control-allow-origin" not in pre.headers


def test_the_log_says_that_requests_need_a_key(server):
    assert "/v1 requests need an API key" in server.log()
