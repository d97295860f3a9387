"""``loraplane agent`` and ``python -m inference_agent``: flags, LORAPLANE_* variables,
readable refusals with exit 2, and a real process stopped by SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner, Result

from devharness.adapters import make_base_config
from loraplane.netutil import free_port
from loraplane_cli.main import cli


def run(args: list[str], env: dict[str, str] | None = None) -> Result:
    clean = {k: None for k in os.environ if k.startswith("LORAPLANE_")}
    return CliRunner().invoke(cli, args, env={**clean, **(env or {})})


def refused(result: Result, *needles: str) -> str:
    text = result.output + (result.stderr if result.stderr_bytes else "")
    assert result.exit_code == 2, text
    for needle in needles:
        assert needle in text, text
    return text


def keys(folder: Path) -> list[str]:
    """``--keys-file`` with one credential, as --watch-dir without a registry needs."""
    path = folder / "keys"
    path.write_text("# tenant sha256\nlocal " + "0" * 64 + "\n")
    return ["--keys-file", str(path)]


def test_missing_base_model_and_source(tmp_path: Path) -> None:
    refused(run(["agent"]), "--base-model (LORAPLANE_BASE_MODEL)", "Field required")
    refused(run(["agent", "--base-model", "m"]), "nothing to serve")


def test_every_problem_is_named_and_the_token_never_echoed(tmp_path: Path) -> None:
    text = refused(run(["agent", "--base-model", "m", "--registry", "ftp://r",
                        "--token", "sekrit-value", "--vllm-url", "localhost:8000",
                        "--nats-url", "http://n", "--agent-id", "a b"]),
                   "--registry (LORAPLANE_REGISTRY): must be a URL starting with http://",
                   "--vllm-url", "--nats-url (LORAPLANE_NATS_URL): must be a URL starting "
                   "with nats://", "--agent-id")
    assert "sekrit-value" not in text
    refused(run(["agent", "--base-model", "m", "--registry", "http://r"]),
            "--registry needs --token")
    refused(run(["agent", "--base-model", "m", "--watch-dir", str(tmp_path), *keys(tmp_path),
                 "--nats-url", "nats://n:4222"]), "--nats-url needs --registry")


def test_watch_dir_without_a_registry_needs_a_good_keys_file(tmp_path: Path) -> None:
    watch = ["agent", "--base-model", "m", "--watch-dir", str(tmp_path),
             "--cache-dir", str(tmp_path / "cache")]
    refused(run(watch), "--watch-dir without --registry needs --keys-file")
    refused(run([*watch, "--keys-file", str(tmp_path / "nope")]), "is not a file")
    bad = tmp_path / "bad-keys"
    for content, needle in (
            ("local " + "0" * 64 + "\nacme lp_a-secret-token\n", "line 2: expected"),
            ("Not_A_Tenant " + "0" * 64 + "\n", "line 1: expected"),
            ("a " + "0" * 64 + "\nb " + "0" * 64 + "\n", "line 2: this hash is listed"),
            ("# nothing\n", "lists no credential")):
        bad.write_text(content)
        text = refused(run([*watch, "--keys-file", str(bad)]), "--keys-file", needle)
        assert "lp_a-secret-token" not in text
    refused(run([*watch, *keys(tmp_path), "--watch-tenant", "Bad Tenant"]),
            "--watch-tenant")


def test_a_token_file_is_one_token_and_never_echoed(tmp_path: Path) -> None:
    agent = ["agent", "--base-model", "m", "--registry", "http://r"]
    token_file = tmp_path / "agent-token"
    refused(run([*agent, "--token-file", str(token_file)]), "--token-file", "cannot read it")
    for content in ("", "\n", "lp_one lp_two\n"):
        token_file.write_text(content)
        refused(run([*agent, "--token-file", str(token_file)]), "one token on one line")
    token_file.write_text("lp_from-a-file\n")
    text = refused(run([*agent, "--token-file", str(token_file), "--token", "lp_other"]),
                   "give --token or --token-file, not both")
    assert "lp_from-a-file" not in text and "lp_other" not in text
    text = refused(run([*agent, "--token-file", str(token_file), "--port", "70000"]), "--port")
    assert "lp_from-a-file" not in text


def test_flags_checked_by_click_and_by_the_settings(tmp_path: Path) -> None:
    refused(run(["agent", "--base-model", "m", "--port", "70000"]), "--port")
    refused(run(["agent", "--base-model", "m", "--max-loaded", "0"]), "--max-loaded")
    refused(run(["agent", "--base-model", "m", "--watch-dir", str(tmp_path / "nope")]),
            "--watch-dir", "is not a directory")
    refused(run(["agent", "--base-model", "m", "--watch-dir", str(tmp_path), *keys(tmp_path),
                 "--base-model-config", str(tmp_path / "missing.json")]), "is not a file")
    refused(run(["agent", "--base-model", "m", "--watch-dir", str(tmp_path), *keys(tmp_path),
                 "--max-loaded", "1", "--pin", "a,b"]), "more pinned adapters")
    refused(run(["agent", "--base-model", "m", "--watch-dir", str(tmp_path), *keys(tmp_path),
                 "--pin", "Not_A_Name"]), "not adapter names: Not_A_Name")


def test_environment_variables_and_global_flags_count(tmp_path: Path) -> None:
    refused(run(["agent"], env={"LORAPLANE_BASE_MODEL": "m",
                                "LORAPLANE_WATCH_DIR": str(tmp_path),
                                "LORAPLANE_MAX_LOADED": "0"}),
            "--max-loaded (LORAPLANE_MAX_LOADED)")
    for bad in ("-1", "61", "soon"):
        refused(run(["agent", "--base-model", "m", "--watch-dir", str(tmp_path),
                     *keys(tmp_path)], env={"LORAPLANE_STATUS_DEBOUNCE_S": bad}),
                "(LORAPLANE_STATUS_DEBOUNCE_S)")
    # The group's --registry is taken over: without a token that is refused.
    refused(run(["--registry", "http://r:1", "agent", "--base-model", "m"]),
            "--registry needs --token")


def test_an_unusable_base_model_config_is_refused(tmp_path: Path) -> None:
    config = make_base_config(tmp_path / "config.json", model_type="bert")
    refused(run(["agent", "--base-model", "m", "--watch-dir", str(tmp_path), *keys(tmp_path),
                 "--cache-dir", str(tmp_path / "cache"), "--base-model-config", str(config)]),
            "--base-model-config", "'bert' is not supported")
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    refused(run(["agent", "--base-model", "m", "--watch-dir", str(tmp_path), *keys(tmp_path),
                 "--cache-dir", str(blocker / "cache")]),
            "--cache-dir", "is not a writable directory")


def test_python_m_inference_agent_refuses_and_stops_on_sigterm(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LORAPLANE_")}
    bad = subprocess.run([sys.executable, "-m", "inference_agent", "--base-model", "m"],
                         capture_output=True, text=True, env=env, timeout=60, check=False)
    assert bad.returncode == 2 and "nothing to serve" in bad.stderr, bad.stderr
    port = free_port()
    # vLLM is never there: the agent serves /healthz and waits, until told to stop.
    args = [sys.executable, "-m", "inference_agent", "--base-model", "m",
            "--watch-dir", str(tmp_path), *keys(tmp_path), "--cache-dir", str(tmp_path / "cache"),
            "--vllm-url", f"http://127.0.0.1:{free_port()}", "--port", str(port),
            "--agent-id", "gpu-1"]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail(f"agent did not come up: {proc.communicate()[0]}")
                time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, output
    assert "shutting down" in output
