"""A stand-in for vLLM that implements only the calls an agent makes to it, for fleet
benchmarks where a real vLLM per agent would not fit on one machine.

It is not vLLM and runs no model. It answers what ``inference_agent/node/vllm_client.py``
asks, the way vLLM's OpenAI server does (see docs/vllm.md): ``GET /v1/models`` (the base
model and every loaded adapter with ``parent``), ``POST /v1/load_lora_adapter`` (200;
400 "has already been loaded"; 404 for a path that does not exist),
``POST /v1/unload_lora_adapter`` (200, or 404 for an unknown name), ``GET /health``
and ``GET /metrics`` (an empty page: the agent's mirror of vLLM's series then has
nothing to pass on). ``POST /v1/completions`` and ``POST /v1/chat/completions`` answer
for the base model or a name loaded on that port (404 otherwise), plain or streamed,
after a delay (``--delay-s``, 20 ms by default); the text is the model's name and a
counter (``devharness/standin_answers.py``).

Faults, for the whole stand-in (every port): ``POST /_standin/faults`` with
``{"model": "bot@2", "error_every": 20, "delay_s": 0.03, "load_status": 500}`` makes
exactly every 20th generation of ``bot@2`` answer 500, each one wait 30 ms, and every
load of ``bot@2`` fail with 500; ``GET`` lists the faults (with the generations each
counted), ``DELETE`` clears them (``?model=`` one only).

One process listens on many ports, one per agent, each with its own set of loaded
names, so a hundred agents need one stand-in. Every load and unload is recorded with
its wall-clock time and port; ``GET /_standin/calls?after=N`` lists them (from any
port), which is how a benchmark counts the moves that follow a fleet change.

    python -m devharness.vllm_standin --ports 100 --ports-file ports.json [--delay-s 0.02]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from devharness import standin_answers as answers
from devharness.standin_answers import Fault

BASE_MODEL = "base"
DELAY_S = 0.02


@dataclass(frozen=True)
class Call:
    """One load or unload the stand-in answered 200."""

    seq: int
    at: float
    port: int
    action: str
    name: str


class StandIn:
    """The state of every port: the names loaded there, and the calls so far."""

    def __init__(self, base_model: str = BASE_MODEL, delay_s: float = DELAY_S) -> None:
        """``delay_s``: how long a generation takes unless its model's fault says."""
        self.base_model = base_model
        self.delay_s = delay_s
        self.loaded: dict[int, set[str]] = {}
        self.calls: list[Call] = []
        self.faults: dict[str, Fault] = {}

    def _record(self, port: int, action: str, name: str) -> None:
        self.calls.append(Call(len(self.calls) + 1, time.time(), port, action, name))

    def models(self, port: int) -> dict[str, Any]:
        data = [{"id": self.base_model, "object": "model", "parent": None}]
        data += [{"id": name, "object": "model", "parent": self.base_model}
                 for name in sorted(self.loaded.get(port, ()))]
        return {"object": "list", "data": data}

    def load(self, port: int, name: str, path: str) -> Response:
        names = self.loaded.setdefault(port, set())
        if name in names:
            return _error(400, f"The lora adapter '{name}' has already been loaded. "
                               "If you want to load the adapter in place, set 'load_inplace'"
                               " to True.")
        if not Path(path).is_dir():
            return _error(404, f"No adapter found for {path}")
        fault = self.faults.get(name)
        if fault is not None and fault.load_status is not None:
            return _error(fault.load_status, f"Failed to load LoRA adapter '{name}' "
                                             "(a fault the stand-in was told to inject)")
        names.add(name)
        self._record(port, "load", name)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    def unload(self, port: int, name: str) -> Response:
        names = self.loaded.setdefault(port, set())
        if name not in names:
            return _error(404, f"The lora adapter '{name}' cannot be found.")
        names.discard(name)
        self._record(port, "unload", name)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

    async def generate(self, port: int, body: dict[str, Any], *, chat: bool) -> Response:
        """A completion (``chat``: a chat completion) of ``body["model"]``, after its
        delay; 500 if its fault says this one fails."""
        model = body.get("model") or self.base_model
        if not isinstance(model, str) or (model != self.base_model
                                          and model not in self.loaded.get(port, ())):
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError")
        fault = self.faults.get(model)
        delay = fault.delay_s if fault is not None and fault.delay_s is not None \
            else self.delay_s
        if delay > 0:
            await asyncio.sleep(delay)
        if fault is not None and fault.fails_next():
            return _error(500, f"an injected fault: one in {fault.error_every} requests of "
                               f"{model} fails", "InternalServerError")
        if body.get("stream"):
            return StreamingResponse(answers.stream(model, body, chat=chat),
                                     media_type="text/event-stream")
        return JSONResponse(answers.answer(model, body, chat=chat))

    def set_fault(self, body: dict[str, Any]) -> Response:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return _error(400, "`model` must name a model")
        try:
            self.faults[model] = Fault.parse(body)
        except (TypeError, ValueError) as exc:
            return _error(400, str(exc))
        return self.shown_faults()

    def clear_faults(self, model: str | None) -> Response:
        if model is None:
            self.faults.clear()
        else:
            self.faults.pop(model, None)
        return self.shown_faults()

    def shown_faults(self) -> Response:
        return JSONResponse({"faults": {m: f.shown() for m, f in sorted(self.faults.items())}})


def _error(status: int, message: str, kind: str = "BadRequestError") -> JSONResponse:
    return JSONResponse(answers.error_body(status, message, kind), status_code=status)


async def _json(request: Request) -> dict[str, Any] | None:
    try:
        body = await request.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _port(request: Request) -> int:
    server = request.scope.get("server")
    return int(server[1]) if server else 0


def create_app(state: StandIn) -> Starlette:
    async def models(request: Request) -> Response:
        return JSONResponse(state.models(_port(request)))

    async def load(request: Request) -> Response:
        body = await request.json()
        return state.load(_port(request), str(body.get("lora_name")),
                          str(body.get("lora_path")))

    async def unload(request: Request) -> Response:
        body = await request.json()
        return state.unload(_port(request), str(body.get("lora_name")))

    async def metrics(_request: Request) -> Response:
        return PlainTextResponse("")

    async def health(_request: Request) -> Response:
        return PlainTextResponse("")

    async def calls(request: Request) -> Response:
        after = int(request.query_params.get("after", "0"))
        return JSONResponse({"calls": [asdict(c) for c in state.calls[after:]],
                             "loaded": {str(p): sorted(n) for p, n in state.loaded.items()}})

    async def completions(request: Request) -> Response:
        body = await _json(request)
        if body is None:
            return _error(400, "the body must be a JSON object")
        return await state.generate(_port(request), body,
                                    chat=request.url.path.endswith("/chat/completions"))

    async def faults(request: Request) -> Response:
        if request.method == "GET":
            return state.shown_faults()
        if request.method == "DELETE":
            return state.clear_faults(request.query_params.get("model"))
        body = await _json(request)
        return _error(400, "the body must be a JSON object") if body is None \
            else state.set_fault(body)

    return Starlette(routes=[
        Route("/v1/models", models), Route("/v1/load_lora_adapter", load, methods=["POST"]),
        Route("/v1/unload_lora_adapter", unload, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", completions, methods=["POST"]),
        Route("/metrics", metrics), Route("/health", health),
        Route("/_standin/calls", calls),
        Route("/_standin/faults", faults, methods=["GET", "POST", "DELETE"])])


def _listen(count: int) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        sock = socket.create_server(("127.0.0.1", 0), backlog=512)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sockets.append(sock)
    return sockets


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--ports", type=int, required=True, help="how many ports to serve")
    parser.add_argument("--ports-file", type=Path, required=True,
                        help="where to write the ports (JSON), once all listen")
    parser.add_argument("--delay-s", type=float, default=DELAY_S,
                        help="how long a generation takes (a fault may say otherwise)")
    args = parser.parse_args(argv)
    sockets = _listen(args.ports)
    ports = [s.getsockname()[1] for s in sockets]
    tmp = args.ports_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"ports": ports}))
    tmp.replace(args.ports_file)
    config = uvicorn.Config(create_app(StandIn(delay_s=args.delay_s)), log_level="warning",
                            access_log=False)
    asyncio.run(uvicorn.Server(config).serve(sockets=sockets))


if __name__ == "__main__":
    main()
