"""Which logical call a `tools/call` is, seen from the official Python MCP SDK.

Run by `tests/mcp.rs` against `mcp_server --level none --latency-ms 800`
(every call takes 0.8 s, so a client can time out while the server works).
Over stdio the client starts the server (`--server`); over streamable HTTP it
connects to one the test started (`--url`), and a second session checks that
sessions share nothing but business actions. Every check raises on failure;
the last line of stdout is a JSON summary.
"""

import argparse
import asyncio
import json
import sys

from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

ID_META = "verified-tools/tool_call_id"


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def structured(result):
    dumped = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped["structuredContent"]


async def call(session, name, arguments, call_id=None, timeout=None, progress=None):
    meta = {ID_META: call_id} if call_id is not None else None
    result = await session.call_tool(
        name, arguments, read_timeout_seconds=timeout, progress_callback=progress, meta=meta
    )
    return structured(result)


async def keyed(session, name, arguments, idempotency_key):
    """A `tools/call` with SEP-3182's `idempotencyKey` in its params: the SDK's
    typed call has no field for it, so the params go as they are."""
    params = {"name": name, "arguments": arguments, "idempotencyKey": idempotency_key}
    raw = await session._dispatcher.send_raw_request("tools/call", params, {"timeout": 60})
    return raw.get("structuredContent", raw)


def ran(outcome):
    """The call ran (its answer or the verifier proved it), not replayed."""
    return outcome["status"] == "success" and outcome["proof"] != "ledger"


def row(n):
    return {"row": n, "invoice_id": 10, "amount": 1250}


def transport(args):
    if args.url:
        return streamable_http_client(args.url)
    server = StdioServerParameters(
        command=args.server, args=["--level", "none", "--latency-ms", "800"]
    )
    return stdio_client(server)


async def one_session(args, summary):
    async with transport(args) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            init = await session.initialize()
            check("same call again" in (init.instructions or ""), f"instructions: {init.instructions}")
            caps = init.capabilities.model_dump(by_alias=True, exclude_none=True)
            check("idempotency" in (caps.get("experimental") or {}), f"capabilities: {caps}")

            # 1. The SDK's retry after a timeout: it cancels the request and
            # sends the same call as a new one. The server recognises it.
            try:
                await call(session, "update_invoice_row", row(1), timeout=0.2)
                raise AssertionError("the first call should time out at the client")
            except AssertionError:
                raise
            except Exception:
                pass
            # The first attempt is still out: the cancel lets it finish, and
            # the re-send waits for it (saying so, as progress, when it gets
            # there before the attempt answers) and gets its outcome.
            progress = []

            async def on_progress(value, total, message):
                progress.append((value, message))

            resent = await call(session, "update_invoice_row", row(1), progress=on_progress)
            check(resent["status"] == "success" and resent["proof"] == "ledger", f"re-sent: {resent}")
            check(resent["instruction"].startswith("Replayed"), f"a replay says so: {resent}")
            values = [value for value, _ in progress]
            check(values == sorted(set(values)), f"progress increases: {progress}")
            summary["resent_after_timeout"] = resent
            summary["resent_progress"] = [message for _, message in progress]

            # 2. A tool-call id in `_meta` is the identity of the call.
            a = await call(session, "update_invoice_row", row(2), "call_A")
            b = await call(session, "update_invoice_row", row(2), "call_B")
            check(ran(a) and ran(b) and a["key"] != b["key"], f"two ids, two calls: {a} {b}")
            again = await call(session, "update_invoice_row", row(2), "call_A")
            check(again["proof"] == "ledger" and again["key"] == a["key"], f"the same id: {again}")
            other = await call(session, "update_invoice_row", row(3), "call_A")
            check(other["status"] == "refused", f"the same id, other arguments: {other}")

            # 3. SEP-3182's idempotencyKey.
            k1 = await keyed(session, "update_invoice_row", row(4), "order-4-try-1")
            check(ran(k1), f"a key of its own: {k1}")
            k1b = await keyed(session, "update_invoice_row", row(4), "order-4-try-1")
            check(k1b["proof"] == "ledger" and k1b["key"] == k1["key"], f"the same key: {k1b}")
            k2 = await keyed(session, "update_invoice_row", row(4), "order-4-try-2")
            check(ran(k2) and k2["key"] != k1["key"], f"a new key, on purpose: {k2}")
            try:
                await keyed(session, "update_invoice_row", row(4), 5)
                raise AssertionError("a key that is not a string must be refused")
            except AssertionError:
                raise
            except Exception as e:
                check("idempotencyKey" in str(e), f"names the field: {e}")
            summary["idempotency_key"] = k1b

            # 4. A deliberate repeat without any id: replayed, and said so,
            # with how to do it again on purpose.
            p1 = await call(session, "update_invoice_row", row(5))
            p2 = await call(session, "update_invoice_row", row(5))
            check(ran(p1) and p2["proof"] == "ledger", f"replayed: {p2}")
            check("idempotencyKey" in p2["instruction"], f"how to do it again: {p2}")
            summary["plain_key"] = p1["key"]

            # 5. A business key: the same customer, whatever the id.
            c1 = await call(session, "create_customer", {"customer": 900}, "call_X")
            c2 = await call(session, "create_customer", {"customer": 900}, "call_Y")
            check(ran(c1) and c2["proof"] == "ledger" and c2["key"] == c1["key"], f"{c1} {c2}")
            summary["customer_key"] = c1["key"]


async def second_session(args, summary):
    async with transport(args) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            p = await call(session, "update_invoice_row", row(5))
            check(ran(p) and p["key"] != summary["plain_key"], f"another session's call: {p}")
            c = await call(session, "create_customer", {"customer": 900})
            check(c["proof"] == "ledger" and c["key"] == summary["customer_key"], f"one customer: {c}")
            summary["second_session"] = True


async def run(args):
    summary = {"transport": "http" if args.url else "stdio"}
    await one_session(args, summary)
    if args.url:
        await second_session(args, summary)
    summary["ok"] = True
    print(json.dumps(summary))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--server", help="the server binary, run over stdio")
    where.add_argument("--url", help="a streamable HTTP endpoint")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"mcp_identity.py: check failed: {e}", file=sys.stderr)
        sys.exit(1)
