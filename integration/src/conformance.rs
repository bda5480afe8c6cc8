//! The fixture of the official MCP conformance suite
//! (`@modelcontextprotocol/conformance`, `server --url`): the tools its
//! scenarios call, each a `#[verified_tool]` served by `McpServer`, so that
//! the suite exercises the same engine, keys and outcomes as every other
//! tool (`mcp_server --conformance`).
//!
//! A verified tool returns a value, and `McpServer` answers with the
//! outcome (`structuredContent`, and the same JSON as text). The scenarios
//! want MCP content blocks (images, audio, resources): a fixture tool's
//! value carries them under `content`, and [`Conformance`] puts them in
//! the result's `content` ahead of the outcome's text. What a scenario
//! asks of the server around a call (log messages, progress, a sampling or
//! elicitation request to the client) is done here, with the request's
//! peer; what the client answered goes to the verified tool as an argument.
//!
//! Scenarios that cannot apply to a server of tools: `completion-complete`
//! (argument completion is for prompts and resource templates), the
//! `resources-*` and `prompts-*` ones (this server has neither). One of the
//! pending suite does not pass: `server-sse-polling` wants a POST's SSE
//! stream closed mid-call and resumed on a GET with `Last-Event-ID`, which
//! rmcp's server does not do (a SHOULD). `.ci/conformance-baseline.yml`
//! lists them, and `.ci/conformance.sh` runs the suite.

// The suite tests the 2025-11-25 protocol, whose logging and sampling rmcp
// marks deprecated (SEP-2577 drops them from 2026-07-28 on).
#![allow(deprecated)]

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use verified_tools::mcp::McpServer;
use verified_tools::mcp::rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock,
    CreateMessageRequestParams, ElicitRequestParams, ListToolsResult, LoggingLevel,
    LoggingMessageNotificationParam, PaginatedRequestParams, ProgressNotificationParam,
    ServerConfig, SetLevelRequestParams, Tool,
};
use verified_tools::mcp::rmcp::service::RequestContext;
use verified_tools::mcp::rmcp::{ErrorData, RoleServer, ServerHandler};
use verified_tools::toolset::ToolSet;
use verified_tools::{Classify, Context, ErrorClass, verified_tool};

/// The fixture's state: nothing to keep, the tools answer from their
/// arguments.
#[derive(Debug, Default)]
pub struct Fixtures;

/// The failure `test_error_handling` reports, on purpose.
#[derive(Debug)]
pub struct FixtureError(&'static str);

impl std::fmt::Display for FixtureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for FixtureError {}

impl Classify for FixtureError {
    fn classify(&self) -> ErrorClass {
        // Certain, and not worth a retry: the call failed, and said so.
        ErrorClass::Definitive
    }
}

/// A red pixel, as PNG.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";

/// A silent WAV of one sample.
const WAV: &str = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAIA+AAACABAAZGF0YQIAAAAAAA==";

fn text(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

fn image() -> Value {
    json!({"type": "image", "data": PNG, "mimeType": "image/png"})
}

fn resource() -> Value {
    json!({
        "type": "resource",
        "resource": {
            "uri": "test://embedded-resource",
            "mimeType": "text/plain",
            "text": "This is an embedded resource content."
        }
    })
}

/// Returns a line of text.
#[verified_tool(side_effect = "none", skip(fixtures), schema = true)]
pub async fn test_simple_text(fixtures: &Fixtures) -> Result<Value, FixtureError> {
    let _ = fixtures;
    Ok(json!({"content": [text("This is a simple text response for testing.")]}))
}

/// Returns an image.
#[verified_tool(side_effect = "none", skip(fixtures), schema = true)]
pub async fn test_image_content(fixtures: &Fixtures) -> Result<Value, FixtureError> {
    let _ = fixtures;
    Ok(json!({"content": [image()]}))
}

/// Returns a sound.
#[verified_tool(side_effect = "none", skip(fixtures), schema = true)]
pub async fn test_audio_content(fixtures: &Fixtures) -> Result<Value, FixtureError> {
    let _ = fixtures;
    Ok(json!({"content": [{"type": "audio", "data": WAV, "mimeType": "audio/wav"}]}))
}

/// Returns a resource, embedded.
#[verified_tool(side_effect = "none", skip(fixtures), schema = true)]
pub async fn test_embedded_resource(fixtures: &Fixtures) -> Result<Value, FixtureError> {
    let _ = fixtures;
    Ok(json!({"content": [resource()]}))
}

/// Returns text, an image and a resource.
#[verified_tool(side_effect = "none", skip(fixtures), schema = true)]
pub async fn test_multiple_content_types(fixtures: &Fixtures) -> Result<Value, FixtureError> {
    let _ = fixtures;
    Ok(json!({"content": [text("Multiple content types test:"), image(), resource()]}))
}

/// Logs while it works (the log messages are sent around the call).
#[verified_tool(side_effect = "none", skip(fixtures), schema = true)]
pub async fn test_tool_with_logging(fixtures: &Fixtures) -> Result<Value, FixtureError> {
    let _ = fixtures;
    Ok(json!({"content": [text("Tool with logging completed")]}))
}

/// Reports its progress (the notifications are sent around the call).
#[verified_tool(side_effect = "none", skip(fixtures), schema = true)]
pub async fn test_tool_with_progress(fixtures: &Fixtures) -> Result<Value, FixtureError> {
    let _ = fixtures;
    Ok(json!({"content": [text("Tool with progress completed")]}))
}

/// Fails, as a tool result (`isError: true`) rather than a protocol error.
#[verified_tool(side_effect = "none", skip(fixtures), schema = true)]
pub async fn test_error_handling(fixtures: &Fixtures) -> Result<Value, FixtureError> {
    let _ = fixtures;
    Err(FixtureError("This tool intentionally returns an error for testing"))
}

/// Asks the client's model (the sampling request is sent before the call;
/// the model's answer is `response`).
#[verified_tool(side_effect = "none", skip(fixtures), schema = true)]
pub async fn test_sampling(
    fixtures: &Fixtures,
    prompt: &str,
    response: Option<String>,
) -> Result<Value, FixtureError> {
    let _ = fixtures;
    let said = response.unwrap_or_default();
    Ok(json!({"content": [text(&format!("LLM response to {prompt:?}: {said}"))]}))
}

/// Asks the user (the elicitation request is sent before the call; what
/// they answered is `answer`).
#[verified_tool(side_effect = "none", skip(fixtures), schema = true)]
pub async fn test_elicitation(
    fixtures: &Fixtures,
    message: &str,
    answer: Option<Value>,
) -> Result<Value, FixtureError> {
    let _ = fixtures;
    let answer = answer.unwrap_or(Value::Null);
    Ok(json!({"content": [text(&format!("{message}: the user answered {answer}"))]}))
}

/// Asks the user with defaults (SEP-1034).
#[verified_tool(side_effect = "none", skip(fixtures), schema = true)]
pub async fn test_elicitation_sep1034_defaults(
    fixtures: &Fixtures,
    answer: Option<Value>,
) -> Result<Value, FixtureError> {
    let _ = fixtures;
    let answer = answer.unwrap_or(Value::Null);
    Ok(json!({"content": [text(&format!("Elicitation completed: {answer}"))]}))
}

/// Asks the user to pick from enums (SEP-1330).
#[verified_tool(side_effect = "none", skip(fixtures), schema = true)]
pub async fn test_elicitation_sep1330_enums(
    fixtures: &Fixtures,
    answer: Option<Value>,
) -> Result<Value, FixtureError> {
    let _ = fixtures;
    let answer = answer.unwrap_or(Value::Null);
    Ok(json!({"content": [text(&format!("Elicitation completed: {answer}"))]}))
}

/// Takes a name and an address (SEP-1613: its listing keeps JSON Schema
/// 2020-12's `$schema`, `$defs` and `additionalProperties`).
#[verified_tool(side_effect = "none", skip(fixtures), schema = true)]
pub async fn json_schema_2020_12_tool(
    fixtures: &Fixtures,
    name: Option<String>,
    address: Option<Value>,
) -> Result<Value, FixtureError> {
    let _ = fixtures;
    let address = address.unwrap_or(Value::Null);
    Ok(json!({"content": [text(&format!("{name:?} at {address}"))]}))
}

/// The input schema SEP-1613's scenario lists for
/// [`json_schema_2020_12_tool`]: what the tool reads, in 2020-12 terms
/// the generator does not write (`$schema`, a `$defs` entry for a type
/// that is not recursive).
fn sep1613_schema() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "$defs": {
            "address": {
                "type": "object",
                "properties": {"street": {"type": "string"}, "city": {"type": "string"}}
            }
        },
        "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
        "additionalProperties": false
    })
}

/// The fixture tools as a tool set.
pub fn fixture_tools() -> ToolSet<Fixtures> {
    ToolSet::new(Fixtures)
        .with_context(Context::new("mcp-conformance"))
        .with(test_simple_text_tool())
        .with(test_image_content_tool())
        .with(test_audio_content_tool())
        .with(test_embedded_resource_tool())
        .with(test_multiple_content_types_tool())
        .with(test_tool_with_logging_tool())
        .with(test_tool_with_progress_tool())
        .with(test_error_handling_tool())
        .with(test_sampling_tool())
        .with(test_elicitation_tool())
        .with(test_elicitation_sep1034_defaults_tool())
        .with(test_elicitation_sep1330_enums_tool())
        .with(json_schema_2020_12_tool_tool())
}

/// `McpServer` over the fixture tools, with what the scenarios ask of a
/// server around a call, and logging (`logging/setLevel`).
#[derive(Clone)]
pub struct Conformance {
    mcp: McpServer<Fixtures>,
    level: Arc<Mutex<LoggingLevel>>,
}

impl Conformance {
    /// The fixture over `mcp` (an `McpServer` of [`fixture_tools`]).
    pub fn new(mcp: McpServer<Fixtures>) -> Self {
        Self { mcp, level: Arc::new(Mutex::new(LoggingLevel::Info)) }
    }

    /// The fixture in a session of its own (what each HTTP session gets).
    pub fn new_session(&self) -> Self {
        Self { mcp: self.mcp.new_session(), level: Arc::new(Mutex::new(LoggingLevel::Info)) }
    }
}

/// The elicitation schema of SEP-1034: a default for every field.
fn sep1034_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "User name", "default": "John Doe"},
            "age": {"type": "integer", "description": "User age", "default": 30},
            "score": {"type": "number", "description": "User score", "default": 95.5},
            "status": {
                "type": "string", "description": "User status",
                "enum": ["active", "inactive", "pending"], "default": "active"
            },
            "verified": {"type": "boolean", "description": "Verification status", "default": true}
        }
    })
}

/// The elicitation schema of SEP-1330: every kind of enum.
fn sep1330_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
            "titledSingle": {
                "type": "string",
                "oneOf": [
                    {"const": "value1", "title": "First Option"},
                    {"const": "value2", "title": "Second Option"},
                    {"const": "value3", "title": "Third Option"}
                ]
            },
            "legacyEnum": {
                "type": "string",
                "enum": ["opt1", "opt2", "opt3"],
                "enumNames": ["Option One", "Option Two", "Option Three"]
            },
            "untitledMulti": {
                "type": "array",
                "items": {"type": "string", "enum": ["option1", "option2", "option3"]}
            },
            "titledMulti": {
                "type": "array",
                "items": {
                    "anyOf": [
                        {"const": "value1", "title": "First Choice"},
                        {"const": "value2", "title": "Second Choice"},
                        {"const": "value3", "title": "Third Choice"}
                    ]
                }
            }
        }
    })
}

fn internal(what: &str, e: impl std::fmt::Display) -> ErrorData {
    ErrorData::internal_error(format!("{what}: {e}"), None)
}

/// Asks the client to elicit `schema`: its answer, as the tool's argument.
async fn elicit(
    context: &RequestContext<RoleServer>,
    message: &str,
    schema: Value,
) -> Result<Value, ErrorData> {
    let params: ElicitRequestParams =
        serde_json::from_value(json!({"message": message, "requestedSchema": schema}))
            .map_err(|e| internal("the elicitation request", e))?;
    let answer =
        context.peer.create_elicitation(params).await.map_err(|e| internal("elicitation", e))?;
    serde_json::to_value(answer).map_err(|e| internal("the elicitation answer", e))
}

impl ServerHandler for Conformance {
    fn get_info(&self) -> ServerConfig {
        let mut info = self.mcp.get_info();
        info.capabilities.logging = Some(Default::default());
        info
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        *self.level.lock().unwrap_or_else(|e| e.into_inner()) = request.level;
        Ok(())
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let mut listed = self.mcp.list_tools(request, context).await?;
        listed.tools.iter_mut().for_each(with_sep1613_schema);
        Ok(listed)
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        let mut tool = self.mcp.get_tool(name)?;
        with_sep1613_schema(&mut tool);
        Some(tool)
    }

    async fn call_tool(
        &self,
        mut request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = request.arguments.get_or_insert_default();
        let peer = &context.peer;
        match request.name.as_ref() {
            "test_tool_with_logging" => {
                for (i, data) in ["Tool execution started", "Tool processing data", "Tool done"]
                    .into_iter()
                    .enumerate()
                {
                    let param: LoggingMessageNotificationParam = serde_json::from_value(json!({
                        "level": "info", "logger": "conformance", "data": format!("{i}: {data}")
                    }))
                    .map_err(|e| internal("a log message", e))?;
                    peer.notify_logging_message(param).await.map_err(|e| internal("log", e))?;
                }
            }
            "test_tool_with_progress" => {
                if let Some(token) = context.meta.get_progress_token() {
                    for progress in [0, 50, 100] {
                        let param: ProgressNotificationParam = serde_json::from_value(json!({
                            "progressToken": token, "progress": progress, "total": 100
                        }))
                        .map_err(|e| internal("a progress notification", e))?;
                        peer.notify_progress(param).await.map_err(|e| internal("progress", e))?;
                    }
                }
            }
            "test_sampling" => {
                let prompt = arguments.get("prompt").and_then(Value::as_str).unwrap_or_default();
                let params: CreateMessageRequestParams = serde_json::from_value(json!({
                    "messages": [{"role": "user", "content": {"type": "text", "text": prompt}}],
                    "maxTokens": 100
                }))
                .map_err(|e| internal("the sampling request", e))?;
                let answer =
                    peer.create_message(params).await.map_err(|e| internal("sampling", e))?;
                let answer = serde_json::to_value(answer).unwrap_or_default();
                let said = answer["content"]["text"].as_str().unwrap_or_default().to_owned();
                arguments.insert("response".to_owned(), said.into());
            }
            "test_elicitation" => {
                let message =
                    arguments.get("message").and_then(Value::as_str).unwrap_or_default().to_owned();
                let schema = json!({
                    "type": "object",
                    "properties": {
                        "username": {"type": "string", "description": "Your username"},
                        "email": {"type": "string", "description": "Your email address"}
                    },
                    "required": ["username", "email"]
                });
                let answer = elicit(&context, &message, schema).await?;
                arguments.insert("answer".to_owned(), answer);
            }
            "test_elicitation_sep1034_defaults" => {
                let message = "Please review and update the form fields with defaults";
                let answer = elicit(&context, message, sep1034_schema()).await?;
                arguments.insert("answer".to_owned(), answer);
            }
            "test_elicitation_sep1330_enums" => {
                let message = "Please select options from the enum fields";
                let answer = elicit(&context, message, sep1330_schema()).await?;
                arguments.insert("answer".to_owned(), answer);
            }
            _ => {}
        }
        // rmcp moved the params' `_meta` into the context: `call` reads it
        // from the params.
        request.meta = Some(context.meta.clone());
        let result = self.mcp.call(request).await?;
        Ok(CallToolResponse::from(with_content(result)))
    }
}

fn with_sep1613_schema(tool: &mut Tool) {
    if tool.name == "json_schema_2020_12_tool"
        && let Value::Object(schema) = sep1613_schema()
    {
        tool.input_schema = Arc::new(schema);
    }
}

/// The result with the content blocks of the tool's value ahead of the
/// outcome's text.
fn with_content(mut result: CallToolResult) -> CallToolResult {
    let blocks: Vec<ContentBlock> = result
        .structured_content
        .as_ref()
        .and_then(|outcome| outcome["value"]["content"].as_array())
        .map(|blocks| {
            blocks
                .iter()
                .filter_map(|b| serde_json::from_value::<ContentBlock>(b.clone()).ok())
                .collect()
        })
        .unwrap_or_default();
    if !blocks.is_empty() {
        let outcome_text = std::mem::take(&mut result.content);
        result.content = blocks.into_iter().chain(outcome_text).collect();
    }
    result
}
