"""The web tier's floor: parse the JSON body (a text, or JSON inputs), answer a constant embedding, on the event loop.

    gunicorn -k funnel.web.transport.protocol.Worker -w 2 -b 127.0.0.1:PORT benchmarks.peers.bare_asgi:app

benchmarks/web_cpu.py runs it for a `bare...` variant, under the web tier's own worker class.
"""

from __future__ import annotations

import orjson

ANSWER = orjson.dumps({"model": "text-embedding", "embedding": [0.05] * 384})
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]
BAD = b'{"error": "text"}'


async def app(scope, receive, send):
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    parsed = orjson.loads(body)
    ok = isinstance(parsed.get("text"), str) or "input" in parsed or "inputs" in parsed  # /v1's item keys
    await send({"type": "http.response.start", "status": 200 if ok else 400,
                "headers": HEADERS if ok else [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": ANSWER if ok else BAD})
