"""How the CLI shows the client's errors: message, code, hint and exit code.

The client's own mapping (statuses, transport failures, pagination) is tested in
tests/client; here each RegistryError kind becomes the CliError a person sees.
"""

from __future__ import annotations

import httpx
import pytest

from loraplane.client import InvalidSource, RegistryClient, RegistryError, TimedOut
from loraplane.netutil import free_port
from loraplane_cli.client import CliError, cli_error


def error_for(response: httpx.Response, token: str | None = "tok") -> RegistryError:
    transport = httpx.MockTransport(lambda _: response)
    with RegistryClient("http://registry.test", token, transport=transport) as client, \
            pytest.raises(RegistryError) as caught:
        client.get_adapter("x")
    return caught.value


def test_the_registry_error_shape_becomes_code_message_and_detail() -> None:
    body = {"error": {"code": "adapter_not_found", "message": "adapter 'x' not found",
                      "detail": {"adapter": "x"}}}
    error = cli_error(error_for(httpx.Response(404, json=body)), has_token=True)
    assert (error.code, error.message, error.status) == ("adapter_not_found",
                                                         "adapter 'x' not found", 404)
    assert error.detail == {"adapter": "x"} and error.exit_code == 1 and error.hint is None
    assert error.as_json() == {"error": {"code": "adapter_not_found",
                                         "message": "adapter 'x' not found",
                                         "detail": {"adapter": "x"}, "status": 404}}


def test_401_without_a_token_hints_where_tokens_come_from() -> None:
    body = {"error": {"code": "missing_token", "message": "a bearer token is required"}}
    error = cli_error(error_for(httpx.Response(401, json=body), token=None), has_token=False)
    assert error.message == "a bearer token is required"
    assert error.hint is not None and "LORAPLANE_TOKEN" in error.hint
    assert cli_error(error_for(httpx.Response(401, json=body)), has_token=True).hint is None


def test_connection_refused_names_the_registry_url_with_a_hint() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with RegistryClient(url, "tok", timeout_s=5) as client, \
            pytest.raises(RegistryError) as caught:
        client.list_adapters()
    error = cli_error(caught.value, has_token=True)
    assert error.code == "unreachable" and error.exit_code == 1
    assert error.message.startswith(f"cannot reach the registry at {url}")
    assert error.hint is not None and "LORAPLANE_REGISTRY" in error.hint


def test_a_bad_registry_url_is_a_usage_error() -> None:
    with RegistryClient("ftp://example.invalid", "tok") as client, \
            pytest.raises(RegistryError) as caught:
        client.list_adapters()
    error = cli_error(caught.value, has_token=True)
    assert (error.code, error.exit_code) == ("invalid_url", 2)


@pytest.mark.parametrize(("code", "exit_code"), [
    ("missing_file", 2), ("not_an_adapter", 2), ("not_found", 2), ("file_unreadable", 1),
    ("file_changed", 1),
])
def test_a_bad_source_is_a_usage_error_unless_it_failed_to_read(code: str,
                                                                exit_code: int) -> None:
    error = cli_error(InvalidSource("bad", code=code), has_token=True)
    assert isinstance(error, CliError) and (error.code, error.exit_code) == (code, exit_code)


def test_a_registry_that_never_answers_hints_at_the_timeout_option() -> None:
    error = cli_error(TimedOut("the registry at http://x did not answer in time"),
                      has_token=True)
    assert error.code == "timeout" and error.hint is not None and "--timeout" in error.hint
