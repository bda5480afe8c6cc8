//! The schemas `tools/list` gives are portable, and true:
//!
//! - every `inputSchema` and `outputSchema` of the simulator's tools is a
//!   valid draft 2020-12 schema (the `jsonschema` crate's meta-schema
//!   check), names no `format` a validator does not know, and writes no
//!   `type` as an array (what the MCP Inspector flags as unportable);
//! - the outcomes of real calls (successes, conflicts, reads of nothing,
//!   bad arguments, a check) validate against their tool's `outputSchema`,
//!   and the arguments that were accepted against its `inputSchema`;
//! - when Node 22 and the Inspector are installed where `.ci/mcp-node.sh`
//!   puts them, `mcp-inspector --cli --strict ... tools/list` against the
//!   stdio server prints no portability warning.

use test_support as support;

// The conformance suite's fixture: its tools take `serde_json::Value`s,
// whose schema schemars writes as `true`.
#[allow(dead_code)]
#[path = "../src/conformance.rs"]
mod conformance;

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};
use verified_tools::mcp::McpServer;
use verified_tools::mcp::rmcp::model::CallToolRequestParams;
use verified_tools::sim::{FaultLevel, FaultProfile, SimConfig, SimServer};
use verified_tools_suite::llm::tool_set;
use verified_tools_suite::tools::SimClient;

fn server() -> McpServer<SimClient> {
    server_with(FaultProfile::NONE)
}

fn server_with(faults: FaultProfile) -> McpServer<SimClient> {
    let (sim, _oracle) = SimServer::new(SimConfig::new(3, faults));
    McpServer::new(tool_set(SimClient::new(sim, true)).with_checks(100))
}

/// The listing, by name.
fn listed(server: &McpServer<SimClient>) -> Map<String, Value> {
    let Value::Array(tools) = server.tool_set().mcp_tools() else { panic!("a list") };
    tools.into_iter().map(|t| (t["name"].as_str().unwrap().to_owned(), t)).collect()
}

/// A validator of `schema` that knows every format it names, or why not.
fn validator(schema: &Value) -> Result<jsonschema::Validator, String> {
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .should_validate_formats(true)
        .should_ignore_unknown_formats(false)
        .build(schema)
        .map_err(|e| e.to_string())
}

/// Every place in `value` where a `type` is an array, or a property's
/// schema is a boolean (valid JSON Schema that the TypeScript SDK refuses:
/// its client rejects the whole `tools/list`): the paths.
fn type_arrays(value: &Value, path: &str, found: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                if key == "type" && inner.is_array() {
                    found.push(path.to_owned());
                }
                if key == "properties"
                    && let Some(properties) = inner.as_object()
                {
                    let booleans = properties.iter().filter(|(_, schema)| schema.is_boolean());
                    found.extend(booleans.map(|(name, _)| format!("{path}.properties.{name}")));
                }
                type_arrays(inner, &format!("{path}.{key}"), found);
            }
        }
        Value::Array(items) => {
            for (i, inner) in items.iter().enumerate() {
                type_arrays(inner, &format!("{path}[{i}]"), found);
            }
        }
        _ => {}
    }
}

#[test]
fn every_listed_schema_is_a_portable_draft_2020_12_schema() {
    let tools = listed(&server());
    assert_eq!(tools.len(), 10, "{:?}", tools.keys());
    let Value::Array(fixtures) = conformance::fixture_tools().mcp_tools() else { panic!() };
    assert_eq!(fixtures.len(), 13);
    let fixtures = fixtures.into_iter().map(|t| (t["name"].as_str().unwrap().to_owned(), t));
    let mut outputs = 0;
    for (name, tool) in tools.iter().map(|(n, t)| (n.clone(), t.clone())).chain(fixtures) {
        for key in ["inputSchema", "outputSchema"] {
            let Some(schema) = tool.get(key) else { continue };
            outputs += usize::from(key == "outputSchema");
            let errors: Vec<String> = jsonschema::draft202012::meta::validate(schema)
                .err()
                .map(|e| e.to_string())
                .into_iter()
                .collect();
            assert!(errors.is_empty(), "{name}.{key} is not a 2020-12 schema: {errors:?}");
            validator(schema).unwrap_or_else(|e| panic!("{name}.{key}: {e}"));
            let mut arrays = Vec::new();
            type_arrays(schema, key, &mut arrays);
            assert!(arrays.is_empty(), "{name}: `type` arrays at {arrays:?}");
        }
    }
    assert!(outputs >= 9 + 13, "the tools have output schemas");
}

// On paused time: the faulty simulator's lost answers cost timeouts.
#[tokio::test(start_paused = true)]
async fn real_outcomes_validate_against_the_output_schemas() {
    let clean = outcomes_validate(server_with(FaultProfile::NONE)).await;
    assert!(clean.contains("success") && clean.contains("invalid_arguments"), "{clean:?}");
    let faulty = outcomes_validate(server_with(FaultLevel::Extreme.profile())).await;
    assert!(faulty.contains("unknown"), "a call in doubt under faults: {faulty:?}");
}

/// Calls every tool of `server` a few ways and validates each outcome:
/// the statuses seen.
async fn outcomes_validate(server: McpServer<SimClient>) -> BTreeSet<String> {
    let tools = listed(&server);
    let mut seen = Vec::new();
    let mut call = async |name: &str, arguments: Value| -> Value {
        let tool = &tools[name];
        let Value::Object(args) = arguments.clone() else { unreachable!("an object") };
        let result = server
            .call(CallToolRequestParams::new(name.to_owned()).with_arguments(args))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
        let outcome = result.structured_content.clone().expect("structured content");
        // The check tool's value is another tool's: it lists no schema.
        if let Some(schema) = tool.get("outputSchema") {
            let output = validator(schema).unwrap();
            let errors: Vec<String> = output.iter_errors(&outcome).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "{name}({arguments}) -> {outcome}: {errors:?}");
        } else {
            assert_eq!(name, "check_call", "only the check tool lists no output schema");
        }
        if outcome["status"] != "invalid_arguments" {
            let input = validator(&tool["inputSchema"]).unwrap();
            assert!(input.is_valid(&arguments), "{name}: accepted {arguments}");
        }
        seen.push((name.to_owned(), outcome["status"].as_str().unwrap().to_owned()));
        outcome
    };
    let created = call("create_customer", json!({"customer": 1})).await;
    assert_eq!(created["status"], "success", "{created}");
    let version = created["value"]["version"].clone();
    call("set_customer_status", json!({"customer": 1, "expected_version": version})).await;
    // A stale version: a conflict, described by the same schema.
    call("set_customer_status", json!({"customer": 1, "expected_version": 999})).await;
    call("send_welcome", json!({"customer": 1})).await;
    call("read_customer", json!({"customer": 1})).await;
    // Nothing there: the value is `null`.
    let nothing = call("read_customer", json!({"customer": 404})).await;
    assert_eq!(nothing["value"], Value::Null, "{nothing}");
    let record = call("create_record", json!({"record": 1, "invoice_id": 7, "amount": 100})).await;
    let version = record["value"]["version"].clone();
    let args = json!({"record": 1, "invoice_id": 8, "amount": 200, "expected_version": version});
    let updated = call("update_record_fields", args).await;
    let version = updated["value"]["version"].clone();
    let args = json!({"record": 1, "invoice_id": 8, "amount": 200, "expected_version": version});
    call("set_record_status", args).await;
    call("update_invoice_row", json!({"invoice_id": 7, "row": 1, "amount": 5})).await;
    call("read_record", json!({"record": 1})).await;
    call("read_record", json!({"record": 404})).await;
    call("create_customer", json!({"customer": "seven"})).await;
    call("check_call", json!({"key": created["key"]})).await;
    call("check_call", json!({"key": "0".repeat(32)})).await;
    // Under faults, more of the same: in doubt, conflicts, failures.
    for n in 10..20 {
        let created = call("create_customer", json!({"customer": n})).await;
        let version = created["value"]["version"].as_u64().unwrap_or(1);
        call("set_customer_status", json!({"customer": n, "expected_version": version})).await;
        call("create_record", json!({"record": n, "invoice_id": n, "amount": n})).await;
        let args = json!({"record": n, "invoice_id": 1, "amount": 2, "expected_version": 1});
        call("update_record_fields", args).await;
    }
    seen.into_iter().map(|(_, status)| status).collect()
}

/// Node 22 and the Inspector, where `.ci/mcp-node.sh` installs them (under
/// `target/mcp-node`), or `None` after saying so (a failure under
/// `CI=true`).
fn inspector() -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/mcp-node");
    let bin = root.join("node_modules/.bin");
    let (node, inspector) = (bin.join("node"), bin.join("mcp-inspector"));
    if !node.exists() || !inspector.exists() {
        support::missing(
            "the MCP Inspector",
            "run `bash .ci/mcp-node.sh` (Node 22 and the Inspector from npm), as `.ci/run` does",
        );
        return None;
    }
    Some((node, inspector))
}

#[test]
fn the_inspector_finds_nothing_unportable() {
    let Some((node, inspector)) = inspector() else { return };
    let output = std::process::Command::new(&node)
        .arg(&inspector)
        .args(["--cli", "--strict", env!("CARGO_BIN_EXE_mcp_server"), "--level", "none"])
        .args(["--method", "tools/list"])
        // The Inspector finds `node` on the PATH for what it spawns.
        .env("PATH", prepend_path(node.parent().unwrap()))
        .output()
        .expect("the Inspector runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let listed: Value = serde_json::from_str(&stdout).expect("the listing as JSON");
    assert_eq!(listed["tools"].as_array().map(Vec::len), Some(10), "{stdout}");
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.starts_with("mcp_server:"))
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert!(warnings.is_empty(), "the Inspector warns:\n{}", warnings.join("\n"));
}

fn prepend_path(dir: &std::path::Path) -> std::ffi::OsString {
    let mut paths = vec![dir.to_path_buf()];
    paths.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()));
    std::env::join_paths(paths).expect("a PATH")
}
