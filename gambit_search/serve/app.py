"""gambit-serve's HTTP app (FastAPI): OpenAI-compatible endpoints over one or more
:class:`~gambit_search.serve.service.SearchService` s.

- ``POST /v1/chat/completions`` and ``POST /v1/completions``: one search per request; the
  message is the voted answer's best trace; ``usage`` counts the prompt, the unique tokens
  the whole search generated and the traces completed; ``gambit`` holds the vote table and
  the tree's statistics. ``stream: true`` sends progress chunks, then the message.
- ``GET /health``, ``GET /v1/models``, ``GET /metrics`` (Prometheus).

Bad input is a 400 with OpenAI's error body; a request that the engine cannot admit within
the timeout is a 503; a client that disconnects has its traces aborted.

    app = build_app(state)          # state: an AppState (services, tokenizer, defaults)
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from gambit_core.errors import InputError
from gambit_search.serve.protocol import (
    ChatRequest,
    CompletionRequest,
    GambitOptions,
    Usage,
    error_body,
    new_id,
    now,
)

__all__ = ["AppState", "build_app"]


@dataclass
class AppState:
    """What the endpoints need: the services (one per data-parallel rank) and the defaults."""

    services: list[Any]
    """One SearchService per rank."""
    model_name: str
    """The name ``/v1/models`` lists and responses carry."""
    prompt_ids: Any
    """question text -> prompt token ids."""
    max_model_len: int
    """The engine's context length."""
    scorer: Any
    """The loaded scorer (None: methods that need one are refused)."""
    defaults: dict[str, Any] = field(default_factory=dict)
    """Server defaults: method, n, rule, the sampling fields, method parameters (flat)."""
    counter: int = 0


def _pick_rank(services: list[Any]) -> Any:
    """The least loaded live rank by Gambit's own accounting (promised live-trace slots),
    first on a tie (:func:`~gambit_search.data_parallel.least_loaded`): every trace and fork
    of one search then stays on that rank's prefix cache. A rank whose engine failed takes
    nothing while another lives (with none alive, rank 0 answers the engine's error)."""
    from gambit_search.data_parallel import least_loaded

    i = least_loaded([s.load() if s.error is None else None for s in services])
    return services[0 if i is None else i]


def make_job(state: AppState, question: str, req: Any, qid: str) -> Any:
    """The driver job of one request, checked: :class:`InputError` (400) for bad input."""
    from gambit_search.engine import SamplingSpec
    from gambit_search.jobs import Job
    from gambit_search.methods import get_method
    from gambit_search.solve.config import flat_names, params_from_flat
    from gambit_search.voting import RULES

    if not question.strip():
        raise InputError("the question is empty")
    g: GambitOptions = req.gambit
    d = state.defaults
    method = get_method(g.method or d["method"])
    known = flat_names(method)
    extra = g.params()
    bad = sorted(set(extra) - known)
    if bad:
        raise InputError(f"gambit: unknown parameters {bad} for method {method.name!r}"
                         f" (known: {', '.join(sorted(known)) or 'none'})")
    flat = {k: v for k, v in d.items() if k in known} | extra
    n = g.n if g.n is not None else d["n"]
    if int(n) < 1:
        raise InputError(f"gambit.n must be >= 1, got {n}")
    bound = method.bind(params_from_flat(method, flat), int(n))
    if method.needs_scorer and state.scorer is None:
        raise InputError(f"method {method.name!r} needs a scorer: the server runs without one")
    rule = g.rule or d.get("rule")
    if rule is not None and rule not in RULES:
        raise InputError(f"gambit.rule must be one of {', '.join(RULES)}, got {rule!r}")
    temperature = req.temperature if req.temperature is not None else d["temperature"]
    top_p = req.top_p if req.top_p is not None else d["top_p"]
    max_tokens = req.max_tokens if req.max_tokens is not None else d["max_tokens"]
    if temperature < 0 or not 0 < top_p <= 1 or max_tokens < 1:  # in the API's field names
        raise InputError("temperature must be >= 0, top_p in (0, 1] and max_tokens >= 1")
    prompt = tuple(state.prompt_ids(question))
    if len(prompt) + max_tokens > state.max_model_len:
        raise InputError(f"the question ({len(prompt)} prompt tokens) plus max_tokens "
                         f"{max_tokens} exceeds the model's context of {state.max_model_len}")
    spec = SamplingSpec(temperature=temperature, top_p=top_p, top_k=d.get("top_k", 0),
                        max_tokens=max_tokens, logprobs=method.logprobs)
    from gambit_core.questions import Question

    return Job(Question(qid, question, "", "serve"), bound, spec, rule=rule, prompt=prompt)


def best_trace(result: dict) -> str:
    """The text of the voted answer's best trace: among completed traces whose answer is the
    voted one, the highest final score (the first, without scores)."""
    from gambit_core.grading import is_equivalent

    texts = result.get("texts") or {}
    answer = result.get("answer")
    best, key = None, None
    for n in result.get("tree", []):
        if n["state"] != "completed" or n["id"] not in texts:
            continue
        if answer is not None and (n["answer"] is None or not is_equivalent(answer, n["answer"])):
            continue
        k = n["scores"][-1][1] if n.get("scores") else float("-inf")
        if best is None or k > key:
            best, key = n["id"], k
    return texts.get(best, "") if best is not None else ""


def response_body(state: AppState, result: dict, prompt_len: int, chat: bool, rid: str,
                  rank: int = 0) -> dict:
    """The OpenAI response of a finished search (``rank``: the data-parallel rank it ran on)."""
    text = best_trace(result)
    stats = result.get("tree_stats", {})
    usage = Usage(prompt_tokens=prompt_len, completion_tokens=result.get("unique_tokens", 0),
                  total_tokens=prompt_len + result.get("unique_tokens", 0),
                  traces_completed=stats.get("completions", 0))
    choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {
        "id": rid, "object": "chat.completion" if chat else "text_completion",
        "created": now(), "model": state.model_name, "choices": [choice],
        "usage": usage.model_dump(),
        "gambit": {"answer": result.get("answer"), "method": result.get("method"),
                   "rule": result.get("rule"), "votes": result.get("votes", []),
                   "tree_stats": stats, "wall_s": result.get("wall_s"), "rank": rank},
    }


def build_app(state: AppState) -> Any:
    """The FastAPI app over ``state``."""
    from gambit_search.serve.metrics import Metrics
    from gambit_search.serve.service import NotAdmitted

    app = FastAPI(title="gambit-serve")
    metrics = Metrics(state.services)

    @app.exception_handler(RequestValidationError)
    async def _bad_body(_req: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        msg = f"{where}: {first.get('msg', 'invalid request')}" if where else \
            first.get("msg", "invalid request body")
        return JSONResponse(error_body(msg, param=where or None), status_code=400)

    @app.get("/health")
    async def health() -> JSONResponse:
        dead = [s.rank for s in state.services if s.error is not None]
        if dead:
            return JSONResponse({"status": "error", "failed_ranks": dead}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": state.model_name, "object": "model",
                                            "created": now(), "owned_by": "gambit"}]}

    @app.get("/metrics")
    async def prom() -> PlainTextResponse:
        body, ctype = metrics.render()
        return PlainTextResponse(body, media_type=ctype)

    async def _search(request: Request, req: Any, question: str, chat: bool) -> Any:
        rid = new_id("chatcmpl" if chat else "cmpl")
        try:
            job = make_job(state, question, req, rid)
        except (InputError, ValueError) as e:
            return JSONResponse(error_body(str(e)), status_code=400)
        svc = _pick_rank(state.services)
        loop = asyncio.get_running_loop()
        progress: asyncio.Queue = asyncio.Queue()

        def on_progress(p: dict) -> None:
            loop.call_soon_threadsafe(progress.put_nowait, p)

        fut = asyncio.wrap_future(svc.submit(job, on_progress if req.stream else None))
        prompt_len = len(job.prompt)

        if req.stream:
            return StreamingResponse(_stream(request, svc, rid, fut, progress, prompt_len, chat),
                                     media_type="text/event-stream")
        try:
            while True:
                done, _ = await asyncio.wait({fut}, timeout=0.1)
                if done:
                    break
                if await request.is_disconnected():
                    svc.cancel(rid)
                    return JSONResponse(error_body("client disconnected", code=499),
                                        status_code=499)
            result = fut.result()
        except NotAdmitted as e:
            return JSONResponse(error_body(str(e), type_="server_overloaded", code=503),
                                status_code=503)
        except RuntimeError as e:  # the engine failed under this request
            return JSONResponse(error_body(str(e), type_="server_error", code=500),
                                status_code=500)
        if result.get("error"):
            return JSONResponse(error_body(result["error"], type_="server_error", code=500),
                                status_code=500)
        return JSONResponse(response_body(state, result, prompt_len, chat, rid, svc.rank))

    async def _stream(request: Request, svc: Any, rid: str, fut: Any, progress: asyncio.Queue,
                      prompt_len: int, chat: bool) -> AsyncIterator[str]:
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta: dict, gambit: dict | None = None, finish: str | None = None) -> str:
            c: dict[str, Any] = {"index": 0, "finish_reason": finish}
            c["delta" if chat else "text"] = delta if chat else delta.get("content", "")
            body: dict[str, Any] = {"id": rid, "object": obj, "created": now(),
                                    "model": state.model_name, "choices": [c]}
            if gambit is not None:
                body["gambit"] = gambit
            return f"data: {json.dumps(body)}\n\n"

        try:
            if chat:
                yield chunk({"role": "assistant", "content": ""})
            while not fut.done():
                try:
                    p = await asyncio.wait_for(progress.get(), timeout=0.25)
                    yield chunk({}, gambit={"progress": p})
                except TimeoutError:
                    pass
                if await request.is_disconnected():
                    svc.cancel(rid)
                    return
            try:
                result = fut.result()
            except NotAdmitted as e:
                yield f"data: {json.dumps(error_body(str(e), type_='server_overloaded', code=503))}\n\n"
                return
            except RuntimeError as e:
                yield f"data: {json.dumps(error_body(str(e), type_='server_error', code=500))}\n\n"
                return
            if result.get("error"):
                yield f"data: {json.dumps(error_body(result['error'], type_='server_error', code=500))}\n\n"
                return
            body = response_body(state, result, prompt_len, chat, rid, svc.rank)
            text = body["choices"][0]["message"]["content"] if chat else body["choices"][0]["text"]
            yield chunk({"content": text}, gambit=body["gambit"] | {"usage": body["usage"]},
                        finish="stop")
            yield "data: [DONE]\n\n"
        except asyncio.CancelledError:
            svc.cancel(rid)
            raise

    @app.post("/v1/chat/completions")
    async def chat(request: Request, req: ChatRequest) -> Any:
        users = [m.content for m in req.messages if m.role == "user"]
        if not users:
            return JSONResponse(error_body("messages holds no user message", param="messages"),
                                status_code=400)
        return await _search(request, req, users[-1], chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request, req: CompletionRequest) -> Any:
        return await _search(request, req, req.prompt, chat=False)

    return app
