//! One `tools/call` answered: whose it is, which logical call it is (its
//! key scope, as the module docs' table says), driven as a long call, and
//! its outcome as an MCP result. Apart so that the server reads as what it
//! is set up with and what it serves.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult, RequestMetaObject};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde_json::Value;

#[cfg(doc)]
use super::Authenticate;
use super::long_call::LongCall;
use super::wire::MAX_IDEMPOTENCY_KEY_BYTES;
use super::{IDEMPOTENCY_KEY_META, McpServer, Principal, TOOL_CALL_ID_META};
use crate::KeyScope;
use crate::toolset::ToolOutcome;

/// What a call the client cancelled ends with (rmcp sends it nowhere).
const CANCELLED: &str = "the client cancelled this call: nothing more was sent under its key, \
     and a repeat of it checks first";

impl<S: Send + Sync + 'static> McpServer<S> {
    /// The principal of a request: the one its bearer token named (HTTP
    /// with an [`Authenticate`]), else the server's. A session serves the
    /// principal that opened it alone.
    pub(super) fn principal_of(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Result<Arc<str>, ErrorData> {
        let parts = context.extensions.get::<hyper::http::request::Parts>();
        let Some(principal) = parts.and_then(|p| p.extensions.get::<Principal>()) else {
            return Ok(Arc::clone(&self.principal));
        };
        let bound = self.bound.get_or_init(|| principal.clone());
        if bound != principal {
            return Err(ErrorData::invalid_request(
                "this session was opened by another principal: open a session of your own",
                None,
            ));
        }
        Ok(Arc::clone(principal.name()))
    }

    pub(super) async fn call_as(
        &self,
        request: CallToolRequestParams,
        meta: &RequestMetaObject,
        principal: &str,
        live: Option<&RequestContext<RoleServer>>,
    ) -> Result<CallToolResult, ErrorData> {
        let name = request.name.as_ref();
        if !self.set.lists(name) {
            let outcome = ToolOutcome::no_such_tool(name, self.set.names());
            let message = format!(
                "{}. {}",
                outcome.error.as_deref().unwrap_or_default(),
                outcome.instruction.as_deref().unwrap_or_default()
            );
            return Err(ErrorData::invalid_params(message, Some(to_json(&outcome))));
        }
        let window = self.set.get(name).and_then(|t| t.spec().bucket);
        let scope = scope(
            meta_str(meta, IDEMPOTENCY_KEY_META)?,
            meta_str(meta, TOOL_CALL_ID_META)?,
            principal,
            &self.session,
            window.unwrap_or(DEFAULT_WINDOW),
        );
        let arguments = Value::Object(request.arguments.unwrap_or_default());
        let cx = self.set.context().clone().with_scope(scope);
        let outcome = match live {
            None => self.set.call_in(&cx, name, &arguments).await,
            Some(context) => {
                let spec = self.set.get(name).map(|t| t.spec());
                let (watched, call) = LongCall::watch(cx.clone(), spec, context);
                match call.drive(self.set.call_kept_as(&watched, &cx, name, &arguments)).await {
                    Some(outcome) => outcome,
                    // rmcp sends no answer to a cancelled request.
                    None => return Err(ErrorData::internal_error(CANCELLED, None)),
                }
            }
        };
        let structured = to_json(&outcome);
        Ok(if outcome.is_success() {
            CallToolResult::structured(structured)
        } else {
            CallToolResult::structured_error(structured)
        })
    }
}

/// The window of a call without an id, when the tool sets no `bucket`.
const DEFAULT_WINDOW: Duration = Duration::from_secs(300);

/// The key scope of one `tools/call`: the client's idempotency key, else
/// its tool-call id (both for the principal), else the session's window.
/// A tool's declared effect identity overrides all three in the engine.
fn scope(
    idempotency_key: Option<&str>,
    tool_call_id: Option<&str>,
    principal: &str,
    session: &str,
    window: Duration,
) -> KeyScope {
    let principal = escaped(principal);
    match (idempotency_key, tool_call_id) {
        (Some(key), _) => KeyScope::ToolCall(format!("{principal}/idempotency-key/{key}")),
        (None, Some(id)) => KeyScope::ToolCall(format!("{principal}/tool-call/{id}")),
        (None, None) => KeyScope::window(session, window),
    }
}

/// The principal with no `/` in it, so that the first `/` of a scope ends
/// it: principal `a/tool-call/b` with id `c` and principal `a` with id
/// `b/tool-call/c` are two calls. A principal without `/` or `%` is kept
/// as it is (the keys its calls had stay theirs).
fn escaped(principal: &str) -> std::borrow::Cow<'_, str> {
    if principal.contains(['/', '%']) {
        principal.replace('%', "%25").replace('/', "%2F").into()
    } else {
        principal.into()
    }
}

/// An identity a client gave in `_meta`: absent (or `null`), or a
/// non-empty string of at most [`MAX_IDEMPOTENCY_KEY_BYTES`]. Anything else
/// is refused, not ignored: the client meant to name the call, and keyed by
/// its session's window instead, a repeat after the window would be done
/// again.
fn meta_str<'m>(meta: &'m RequestMetaObject, key: &str) -> Result<Option<&'m str>, ErrorData> {
    let problem = match meta.get(key) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) if !s.is_empty() && s.len() <= MAX_IDEMPOTENCY_KEY_BYTES => {
            return Ok(Some(s));
        }
        Some(Value::String(s)) if s.is_empty() => "empty".to_owned(),
        Some(Value::String(s)) => format!("{} bytes long", s.len()),
        Some(other) => format!("not a string: {other}"),
    };
    let message = format!(
        "`_meta[\"{key}\"]` names this call and must be a non-empty string of at most \
         {MAX_IDEMPOTENCY_KEY_BYTES} bytes; it is {problem}"
    );
    Err(ErrorData::invalid_params(message, None))
}

fn to_json(outcome: &ToolOutcome) -> Value {
    serde_json::to_value(outcome).expect("an outcome is JSON")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(key: Option<&str>, id: Option<&str>, principal: &str) -> KeyScope {
        scope(key, id, principal, "session", DEFAULT_WINDOW)
    }

    #[test]
    fn two_principals_never_share_a_scope() {
        let pairs = [
            (
                of(Some("k"), None, "team/idempotency-key/x"),
                of(Some("x/idempotency-key/k"), None, "team"),
            ),
            (of(None, Some("c"), "a/tool-call/b"), of(None, Some("b/tool-call/c"), "a")),
            (of(None, Some("c"), "a%2Ftool-call%2Fb"), of(None, Some("c"), "a/tool-call/b")),
        ];
        for (one, other) in pairs {
            assert_ne!(one, other);
        }
    }

    #[test]
    fn an_identity_in_meta_is_a_non_empty_string_or_refused() {
        let meta = |value: Value| {
            let map: serde_json::Map<String, Value> =
                [(TOOL_CALL_ID_META.to_owned(), value)].into_iter().collect();
            RequestMetaObject::from(map)
        };
        let of =
            |value: Value| meta_str(&meta(value), TOOL_CALL_ID_META).map(|s| s.map(str::to_owned));
        assert_eq!(of(Value::from("call_1")).unwrap(), Some("call_1".to_owned()));
        assert_eq!(of(Value::Null).unwrap(), None);
        assert_eq!(meta_str(&RequestMetaObject::default(), TOOL_CALL_ID_META).unwrap(), None);
        let long = "k".repeat(MAX_IDEMPOTENCY_KEY_BYTES + 1);
        for bad in
            [Value::from(42), Value::from(""), serde_json::json!({"id": 1}), Value::from(long)]
        {
            let error = of(bad.clone()).unwrap_err();
            assert!(error.message.contains(TOOL_CALL_ID_META), "{bad}: {}", error.message);
        }
    }

    #[test]
    fn a_principal_without_a_slash_keeps_its_scopes() {
        assert_eq!(
            of(Some("k"), None, "alice@example.com"),
            KeyScope::ToolCall("alice@example.com/idempotency-key/k".into())
        );
        assert_eq!(
            of(None, Some("call_1"), "anonymous"),
            KeyScope::ToolCall("anonymous/tool-call/call_1".into())
        );
    }
}
