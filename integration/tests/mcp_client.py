"""The official Python MCP SDK as a client of `cargo run -p integration --bin mcp_server`.

Run by `tests/mcp.rs`, which finds the built server, picks a seed whose
first `create_customer` loses its answer (a late arrival that lands
`--late-ms` after it was sent), and checks the exit status. Over stdio the
client starts the server (`--server`); over streamable HTTP it connects to
one the test started (`--url`). Every check raises on failure; the last line
of stdout is a JSON summary.

    python tests/mcp_client.py --server target/debug/mcp_server \
        --level extreme --seed 123 --late-ms 3500
    python tests/mcp_client.py --url http://127.0.0.1:8080/mcp --seed 123 --late-ms 3500
"""

import argparse
import asyncio
import json
import re
import sys
import time

from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

ID_META = "verified-tools/tool_call_id"
TOOLS = [
    "create_customer",
    "set_customer_status",
    "send_welcome",
    "read_customer",
    "update_invoice_row",
    "create_record",
    "update_record_fields",
    "set_record_status",
    "read_record",
    "check_call",
]

# The tools that declare their effect identity (`key(..)`): a repeat under
# any id is the same action.
KEYED = {"create_customer", "send_welcome", "create_record"}
OVERWRITE = {"set_customer_status", "update_invoice_row", "update_record_fields", "set_record_status"}


def check(condition, what):
    if not condition:
        raise AssertionError(what)


async def call(session, name, arguments, call_id=None):
    meta = {ID_META: call_id} if call_id is not None else None
    result = await session.call_tool(name, arguments, meta=meta)
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


def transport(args):
    if args.url:
        return streamable_http_client(args.url)
    server = StdioServerParameters(
        command=args.server, args=["--level", args.level, "--seed", str(args.seed)]
    )
    return stdio_client(server)


async def run(args):
    summary = {"transport": "http" if args.url else "stdio"}
    async with transport(args) as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            check(init.server_info.name == "verified-tools-sim", f"server info: {init.server_info}")
            check("same call again" in (init.instructions or ""), "the instructions say how to repeat a call")

            # tools/list: names, schemas, annotations.
            listed = await session.list_tools()
            tools = {t.name: t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in listed.tools}
            check([t.name for t in listed.tools] == TOOLS, f"tool names: {list(tools)}")
            create = tools["create_customer"]
            check(create["description"] == "Creates the customer (status PENDING).", create.get("description"))
            schema = create["inputSchema"]
            check(schema["type"] == "object" and schema["required"] == ["customer"], f"inputSchema: {schema}")
            check(schema["properties"]["customer"]["type"] == "integer", f"customer: {schema}")
            check(schema["additionalProperties"] is False, "no other arguments")
            status = tools["set_customer_status"]["inputSchema"]
            check(status["required"] == ["customer", "expected_version"], f"set_customer_status: {status}")
            check("version" in status["properties"]["expected_version"]["description"], "described")
            # MCP's definitions: destructive unless the tool says its effect
            # only adds, idempotent when it declares its effect identity or
            # overwrites with the call's value.
            for name, tool in tools.items():
                if name in ("read_customer", "read_record", "check_call"):
                    continue
                expected = {
                    "readOnlyHint": False, "destructiveHint": name in OVERWRITE,
                    "idempotentHint": name in KEYED or name in OVERWRITE, "openWorldHint": True,
                }
                check(tool["annotations"] == expected, f"{name} annotations: {tool['annotations']}")
            check(tools["read_customer"]["annotations"] == {"readOnlyHint": True, "openWorldHint": True},
                  f"read annotations: {tools['read_customer']['annotations']}")
            output = create["outputSchema"]
            check(output["properties"]["value"]["required"] == ["id", "status", "activated_at", "version"],
                  f"outputSchema: {output}")
            summary["tools_list_create_customer"] = create

            # A call whose answer the simulator loses: in doubt, with its key.
            started = time.monotonic()
            lost = await call(session, "create_customer", {"customer": 1001}, "call-doubt")
            check(lost["isError"] is True, f"in doubt is an error: {lost}")
            doubt = lost["structuredContent"]
            check(doubt["status"] == "unknown", f"in doubt: {doubt}")
            check(re.fullmatch("[0-9a-f]{32}", doubt["key"]), f"key: {doubt}")
            check(doubt["instruction"].startswith("Do not repeat this call"), doubt["instruction"])
            check(doubt["key"] in doubt["instruction"], "the instruction gives the key")
            check("value" not in doubt and "proof" not in doubt, "no value in doubt")
            check(json.loads(lost["content"][0]["text"]) == doubt, "the text is the same JSON")
            summary["in_doubt"] = lost

            # A clean call (its OK answer read back, as for every high tool),
            # then the same tool call again: replayed.
            first = await call(session, "create_customer", {"customer": 1002}, "call-clean")
            check(first["isError"] is False, f"success: {first}")
            done = first["structuredContent"]
            check(done["status"] == "success" and done["proof"] == "verifier", f"first: {done}")
            check(done["value"]["status"] == "PENDING" and done["value"]["id"] == 1002, f"value: {done}")
            again = await call(session, "create_customer", {"customer": 1002}, "call-clean")
            replay = again["structuredContent"]
            check(replay["proof"] == "ledger", f"replayed, not executed again: {replay}")
            check(replay["key"] == done["key"] and replay["value"] == done["value"], f"same call: {replay}")
            summary["replay"] = replay

            # Arguments that do not fit: a tool error the model can correct.
            bad = await call(session, "create_customer", {"customer": "seven"}, "call-bad")
            check(bad["isError"] is True, f"bad arguments: {bad}")
            check(bad["structuredContent"] == {
                "status": "invalid_arguments",
                "error": "field `customer`: expected a non-negative integer, got a string",
                "instruction": "Nothing was done. Correct the arguments and call the tool again.",
            }, f"bad arguments: {bad}")

            # An unknown tool: a protocol error, naming the tools.
            try:
                await session.call_tool("create_client", {})
                raise AssertionError("an unknown tool must be a protocol error")
            except MCPError as e:
                check(e.error.code == -32602, f"invalid params: {e.error}")
                check("create_customer" in e.error.message, e.error.message)

            # The call in doubt, repeated with its id once the late arrival
            # has landed: verified, not executed again.
            wait = args.late_ms / 1000 + 0.5 - (time.monotonic() - started)
            if wait > 0:
                await asyncio.sleep(wait)
            repeat = await call(session, "create_customer", {"customer": 1001}, "call-doubt")
            resolved = repeat["structuredContent"]
            check(repeat["isError"] is False, f"resolved: {repeat}")
            check(resolved["status"] == "success" and resolved["proof"] == "verifier", f"verified: {resolved}")
            check(resolved["key"] == doubt["key"], "the same logical call")
            summary["resolved"] = resolved

            # The customer the late arrival created reads back.
            seen = await call(session, "read_customer", {"customer": 1001}, "call-read")
            check(seen["structuredContent"]["value"]["id"] == 1001, f"read: {seen}")
    summary["ok"] = True
    print(json.dumps(summary))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--server", help="the server binary, run over stdio")
    where.add_argument("--url", help="a streamable HTTP endpoint")
    parser.add_argument("--level", default="extreme")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--late-ms", type=int, required=True)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"mcp_client.py: check failed: {e}", file=sys.stderr)
        sys.exit(1)
