"""The proxies ``bench/agent_proxy_overhead.py --floor-proxies`` measures beside the
agent, each in front of the same vLLM, to show what any proxy's hop costs here:

- ``relay``: ``bench/tcp_relay.py``, bytes across on uvloop with no HTTP parsing: the
  floor of a proxy written in Python on the agent's event loop;
- ``nginx``: Debian's nginx as a reverse proxy keeping its connections to vLLM alive,
  one process (``master_process off``) so its CPU is one process's: a well-kept HTTP
  proxy written in C.

Neither routes: both are sent vLLM's own name for the adapter, as the direct path is.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.common import REPO
from devharness.processes import http_probe
from loraplane.netutil import free_port
from loraplane.process import ChildProcess

READY_TIMEOUT_S = 30.0
NGINX = "/usr/sbin/nginx"


@dataclass(frozen=True)
class FloorProxy:
    name: str
    url: str
    pid: int


def nginx_binary() -> Path:
    found = shutil.which("nginx") or NGINX
    path = Path(found)
    if not path.is_file():
        raise RuntimeError("--floor-proxies needs nginx: ./scripts/ci-tools.sh installs "
                           "Debian's nginx-light")
    return path


def nginx_conf(work: Path, port: int, upstream: str) -> str:
    temp = "\n".join(f"    {kind}_temp_path {work / kind};"
                     for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return f"""daemon off;
master_process off;
worker_processes 1;
pid {work / 'nginx.pid'};
error_log {work / 'error.log'} warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
{temp}
    upstream vllm {{ server {upstream}; keepalive 32; keepalive_timeout 4s; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://vllm;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 300s;
        }}
    }}
}}
"""


def _start(stack: ExitStack, name: str, argv: list[str], work: Path, port: int) -> FloorProxy:
    process = ChildProcess(name, argv, log_path=work / f"{name}.log", cwd=REPO)
    stack.callback(process.stop)
    process.start()
    url = f"http://127.0.0.1:{port}"
    process.wait_ready(http_probe(f"{url}/health"), READY_TIMEOUT_S)
    assert process.pid is not None
    return FloorProxy(name, url, process.pid)


def start_relay(stack: ExitStack, upstream: str, work: Path) -> FloorProxy:
    """``bench/tcp_relay.py`` in front of ``upstream`` (host:port), ready; stopped when
    ``stack`` closes. Its readiness is a GET through it, which the upstream answers."""
    port = free_port()
    return _start(stack, "relay", [sys.executable, "-m", "bench.tcp_relay",
                                   "--port", str(port), "--upstream", upstream],
                  work, port)


@contextmanager
def floor_proxies(vllm_url: str, work: Path) -> Iterator[list[FloorProxy]]:
    """The byte relay and nginx in front of ``vllm_url``, ready; stopped afterwards."""
    upstream = vllm_url.removeprefix("http://").rstrip("/")
    work.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        relay = start_relay(stack, upstream, work)
        nginx_dir = work / "nginx"
        nginx_dir.mkdir(exist_ok=True)
        port = free_port()
        conf = nginx_dir / "nginx.conf"
        conf.write_text(nginx_conf(nginx_dir, port, upstream))
        nginx = _start(stack, "nginx", [str(nginx_binary()), "-c", str(conf),
                                        "-p", str(nginx_dir)], work, port)
        yield [relay, nginx]
