//! A set of verified tools over one shared state: listed for a model,
//! dispatched by name.

use std::fmt;

use serde_json::{Map, Value, json};

use std::time::Duration;

use super::checks::{CHECK_DESCRIPTION, CHECK_TOOL, Pending, Pendings, Reconciled, check_schema};
use super::schema::JsonObject;
use super::{DynTool, Status, ToolDef, ToolOutcome};
use crate::{ArgsError, Context, EffectKind, IdempotencyKey, SideEffect, ToolSpec};

/// One value that lists a group of verified tools in the formats models are
/// given tools in, and dispatches their calls by name.
///
/// Built from the `<name>_tool()` descriptors that
/// `#[verified_tool(schema = true)]` generates, and the state their
/// skipped parameters (or `&self`) borrow: a client, a pool. A call's
/// request identity is the provider's tool-call id
/// ([`Context::for_tool_call`]): the same id is the same logical call,
/// replayed from the ledger or verified first, never executed twice, and the
/// same id with other arguments is refused. A tool that declares its effect
/// identity (`#[verified_tool(key(order))]`) is keyed by it instead, so a
/// model that asks again for the same action, with a new id, meets the same
/// call.
///
/// ```
/// use verified_tools::toolset::{Status, ToolSet};
/// use verified_tools::{verified_tool, Classify, ErrorClass};
/// use serde_json::json;
/// use std::sync::atomic::{AtomicU32, Ordering};
///
/// #[derive(Default)]
/// pub struct Outbox { sent: AtomicU32 }
///
/// #[derive(Debug, thiserror::Error)]
/// #[error("the outbox is full")]
/// pub struct Full;
/// impl Classify for Full {
///     fn classify(&self) -> ErrorClass { ErrorClass::Definitive }
/// }
///
/// /// Queues a message to a customer.
/// #[verified_tool(side_effect = "low", skip(outbox), schema = true,
///                 params(customer = "The customer's id.", text = "What to say."))]
/// pub async fn send_note(outbox: &Outbox, customer: u64, text: &str) -> Result<u32, Full> {
///     let _ = (customer, text);
///     Ok(outbox.sent.fetch_add(1, Ordering::Relaxed) + 1)
/// }
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let tools = ToolSet::new(Outbox::default()).with(send_note_tool());
/// // What the model is given (OpenAI chat completions' `tools`).
/// let listed = tools.openai_tools();
/// assert_eq!(listed[0]["function"]["name"], "send_note");
/// assert_eq!(listed[0]["function"]["parameters"]["required"], json!(["customer", "text"]));
///
/// // The model's tool call, by name, with its id.
/// let args = json!({"customer": 7, "text": "hello"});
/// let first = tools.call("send_note", &args, "call_1").await;
/// assert_eq!(first.status, Status::Success);
/// // The same tool call again: replayed from the ledger, not sent twice.
/// let again = tools.call("send_note", &args, "call_1").await;
/// assert_eq!(serde_json::to_value(&again).unwrap()["proof"], "ledger");
/// assert_eq!(tools.state().sent.load(Ordering::Relaxed), 1);
///
/// // A bad argument is an outcome the model can act on.
/// let bad = tools.call("send_note", &json!({"customer": "seven", "text": "hi"}), "call_2").await;
/// assert_eq!(bad.status, Status::InvalidArguments);
/// assert_eq!(bad.error.as_deref(), Some("field `customer`: expected a non-negative integer, got a string"));
/// # }
/// ```
pub struct ToolSet<S> {
    state: S,
    context: Context,
    tools: Vec<Listed<S>>,
    /// With [`with_checks`](Self::with_checks): the calls to check.
    checks: Option<Pendings>,
}

/// A tool with its name and schemas, read once.
struct Listed<S> {
    name: &'static str,
    tool: Entry<S>,
    input: JsonObject,
    output: Option<JsonObject>,
}

/// A tool of the set. A generated one is kept as it is: it needs neither a
/// box nor a state that lives forever (a `ToolSet<&App>` lists it too).
enum Entry<S> {
    Def(ToolDef<S>),
    Dyn(Box<dyn DynTool<S>>),
}

impl<S> Listed<S> {
    fn tool(&self) -> &dyn DynTool<S> {
        match &self.tool {
            Entry::Def(def) => def,
            Entry::Dyn(tool) => &**tool,
        }
    }

    /// A generated tool is called through its entry point directly.
    fn call<'a>(
        &'a self,
        cx: &'a Context,
        state: &'a S,
        arguments: &'a Value,
    ) -> super::ToolFuture<'a> {
        match &self.tool {
            Entry::Def(def) => def.call(cx, state, arguments),
            Entry::Dyn(tool) => tool.call(cx, state, arguments),
        }
    }

    /// What every listing format has: `name`, `description` (when there is
    /// one) and the arguments' schema under `schema_key`.
    fn entry(&self, schema_key: &str) -> Map<String, Value> {
        let mut entry = Map::new();
        entry.insert("name".to_owned(), self.name.into());
        if let Some(description) = description(self.tool().spec()) {
            entry.insert("description".to_owned(), description.into());
        }
        entry.insert(schema_key.to_owned(), Value::Object(self.input.clone()));
        entry
    }
}

impl<S> ToolSet<S> {
    /// An empty set over `state`, calling with `Context::new("verified-tools")`
    /// (an in-memory ledger; see [`with_context`](Self::with_context)).
    pub fn new(state: S) -> Self {
        Self { state, context: Context::new("verified-tools"), tools: Vec::new(), checks: None }
    }

    /// Keeps the calls that did not succeed (`unknown`, `escalated`,
    /// `not_applied`) by key, at most `capacity` of them, and lists one more
    /// tool, [`CHECK_TOOL`] (`check_call {key}`), with which the model learns
    /// what became of such a call without doing anything again: the call is
    /// made again as a check ([`Context::for_check`]), in its own context
    /// and under its own key (see [`check`](Self::check)), so a call in doubt is
    /// verified, a proven effect is recorded as a success, and nothing is
    /// dispatched. [`reconcile`](Self::reconcile) checks them all.
    ///
    /// The set keeps them in memory: a restarted process knows only the
    /// ledger's records, which an operator lists and resolves
    /// ([`Ledger::in_doubt`](crate::ledger::Ledger::in_doubt)).
    #[must_use]
    pub fn with_checks(mut self, capacity: usize) -> Self {
        assert!(
            self.get(CHECK_TOOL).is_none(),
            "a tool is named `{CHECK_TOOL}`: give it another `name = \"..\"` to list checks"
        );
        self.checks = Some(Pendings::new(capacity));
        self
    }

    /// How many calls wait to be checked ([`with_checks`](Self::with_checks)).
    pub fn pending_checks(&self) -> usize {
        self.checks.as_ref().map_or(0, Pendings::len)
    }

    /// Adds a tool: what `<name>_tool()` returns.
    ///
    /// # Panics
    ///
    /// If a tool of the same name is already in the set (a model could not
    /// tell them apart), or the tool is named [`CHECK_TOOL`] in a set that
    /// lists checks.
    #[must_use]
    pub fn with(self, tool: ToolDef<S>) -> Self {
        self.listing(Entry::Def(tool))
    }

    /// Adds a tool defined at run time (one proxied to another MCP server,
    /// say): anything that implements [`DynTool`]. It is listed, called,
    /// checked and served over MCP as a generated tool is.
    ///
    /// # Panics
    ///
    /// As [`with`](Self::with): a name already in the set, or
    /// [`CHECK_TOOL`] in a set that lists checks.
    #[must_use]
    pub fn with_dyn(self, tool: impl DynTool<S> + 'static) -> Self {
        self.listing(Entry::Dyn(Box::new(tool)))
    }

    fn listing(mut self, tool: Entry<S>) -> Self {
        let mut listed = Listed { name: "", tool, input: JsonObject::new(), output: None };
        let name = listed.tool().name();
        listed.name = name;
        assert!(
            self.get(name).is_none() && (self.checks.is_none() || name != CHECK_TOOL),
            "tool `{name}` is already in the set: give one of them another `name = \"..\"`",
        );
        listed.input = listed.tool().input_schema();
        listed.output = listed.tool().output_schema();
        self.tools.push(listed);
        self
    }

    /// The context calls are made in (agent id, ledger, policies, audit);
    /// each call is scoped to its tool-call id on top of it. Share one
    /// ledger between the sets (and processes) that must see each other's
    /// calls.
    #[must_use]
    pub fn with_context(mut self, context: Context) -> Self {
        self.context = context;
        self
    }

    /// The shared state.
    pub fn state(&self) -> &S {
        &self.state
    }

    /// The context calls are made in.
    pub fn context(&self) -> &Context {
        &self.context
    }

    /// The tools, in the order they were added.
    pub fn tools(&self) -> impl ExactSizeIterator<Item = &dyn DynTool<S>> {
        self.tools.iter().map(Listed::tool)
    }

    /// The tool named `name`.
    pub fn get(&self, name: &str) -> Option<&dyn DynTool<S>> {
        self.listed(name).map(Listed::tool)
    }

    fn listed(&self, name: &str) -> Option<&Listed<S>> {
        self.tools.iter().find(|t| t.name == name)
    }

    /// Whether the set answers calls of `name`: one of its tools, or
    /// [`CHECK_TOOL`] when it lists checks.
    pub fn lists(&self, name: &str) -> bool {
        self.get(name).is_some() || (self.checks.is_some() && name == CHECK_TOOL)
    }

    /// The tools' names, in order.
    pub fn names(&self) -> impl ExactSizeIterator<Item = &'static str> + '_ {
        self.tools.iter().map(|t| t.name)
    }

    /// The tools as OpenAI chat completions' `tools` (also what vLLM,
    /// llama.cpp and Ollama accept): `[{"type": "function", "function":
    /// {"name", "description", "parameters"}}]`.
    pub fn openai_tools(&self) -> Value {
        let function = |entry| json!({"type": "function", "function": entry});
        let tools = self.tools.iter().map(|t| function(t.entry("parameters")));
        Value::Array(tools.chain(self.check_entry("parameters").map(function)).collect())
    }

    /// The tools as Anthropic's Messages API `tools`: `[{"name",
    /// "description", "input_schema"}]`.
    pub fn anthropic_tools(&self) -> Value {
        let tools = self.tools.iter().map(|t| Value::Object(t.entry("input_schema")));
        Value::Array(tools.chain(self.check_entry("input_schema").map(Value::Object)).collect())
    }

    /// The check tool's listing entry, when the set lists it.
    fn check_entry(&self, schema_key: &str) -> Option<Map<String, Value>> {
        self.checks.as_ref()?;
        let mut entry = Map::new();
        entry.insert("name".to_owned(), CHECK_TOOL.into());
        entry.insert("description".to_owned(), CHECK_DESCRIPTION.into());
        entry.insert(schema_key.to_owned(), Value::Object(check_schema()));
        Some(entry)
    }

    /// The tools as MCP `Tool`s (the `tools` of a `tools/list` answer):
    /// `name`, `description`, `inputSchema`, `outputSchema` where the value
    /// type has a schema, and the `annotations` that follow from the
    /// tool's side-effect class, effect kind and effect identity
    /// ([`mcp_annotations`]).
    pub fn mcp_tools(&self) -> Value {
        Value::Array(
            self.tools
                .iter()
                .map(|t| {
                    let mut tool = t.entry("inputSchema");
                    if let Some(output) = &t.output {
                        tool.insert("outputSchema".to_owned(), Value::Object(output.clone()));
                    }
                    tool.insert("annotations".to_owned(), mcp_annotations(t.tool().spec()));
                    Value::Object(tool)
                })
                .chain(self.check_entry("inputSchema").map(|mut entry| {
                    entry.insert("annotations".to_owned(), mcp_annotations(&CHECK_SPEC));
                    Value::Object(entry)
                }))
                .collect(),
        )
    }
}

impl<S: Sync> ToolSet<S> {
    /// Calls the tool `name` with `arguments` as the logical call
    /// `tool_call_id` (the id the provider gave the model's tool call): a
    /// repeat of the same id with the same arguments is the same call,
    /// replayed or verified first, never executed twice.
    pub async fn call(&self, name: &str, arguments: &Value, tool_call_id: &str) -> ToolOutcome {
        self.call_in(&self.context.for_tool_call(tool_call_id), name, arguments).await
    }

    /// [`call`](Self::call) with the arguments as the model wrote them: a
    /// JSON text (OpenAI's `function.arguments`). Text that is not JSON, and
    /// an object that gives a field twice (at any depth), are argument
    /// errors naming the field; an empty text reads as `{}`.
    pub async fn call_text(&self, name: &str, arguments: &str, tool_call_id: &str) -> ToolOutcome {
        let tool = match self.get(name) {
            Some(tool) => tool.name(),
            None if self.lists(name) => CHECK_TOOL,
            None => return self.no_such_tool(name),
        };
        // One parse that refuses a field given twice: with serde_json's
        // last-wins, the audited arguments and the executed ones could differ.
        match super::args::parse_arguments(tool, arguments) {
            Ok(arguments) => self.call(name, &arguments, tool_call_id).await,
            Err(error) => ToolOutcome::invalid_arguments(&error),
        }
    }

    /// Calls the tool `name` in a context of the caller's choosing (a
    /// durable step scope, an explicit key, another ledger). With
    /// [`with_checks`](Self::with_checks), `name` may be [`CHECK_TOOL`].
    pub async fn call_in(&self, cx: &Context, name: &str, arguments: &Value) -> ToolOutcome {
        self.call_kept_as(cx, cx, name, arguments).await
    }

    /// [`call_in`](Self::call_in) with `cx`, a call kept for checking in
    /// `kept`: the same context without what lives only as long as the
    /// request that made the call (an MCP request's ledger gate, closed when
    /// its client cancels, would park every later check).
    pub(crate) async fn call_kept_as(
        &self,
        cx: &Context,
        kept: &Context,
        name: &str,
        arguments: &Value,
    ) -> ToolOutcome {
        if self.checks.is_some() && name == CHECK_TOOL {
            return self.check_call(arguments).await;
        }
        let Some(tool) = self.listed(name) else { return self.no_such_tool(name) };
        let outcome = tool.call(cx, &self.state, arguments).await;
        if let Some(checks) = &self.checks {
            let pending =
                || Pending { tool: tool.name, arguments: arguments.clone(), context: kept.clone() };
            checks.note(&outcome, pending);
        }
        outcome
    }

    /// Checks what became of the call with `key` that this set made and
    /// that did not succeed: the call again, as a check, in the context it
    /// was made in and under `key` itself (a time-bucketed call checked in a
    /// later bucket is still that call). `None` when the set keeps no such call (checks are off, the call
    /// succeeded, or it was forgotten past the capacity).
    pub async fn check(&self, key: IdempotencyKey) -> Option<ToolOutcome> {
        let checks = self.checks.as_ref()?;
        let pending = checks.get(key)?;
        let tool = self.listed(pending.tool)?;
        // The call's own context and key: a time-scoped call checked in a
        // later bucket, or a call made in another context, would otherwise
        // be derived a key of another call.
        let cx = pending.context.checking(key);
        let outcome = tool.call(&cx, &self.state, &pending.arguments).await;
        match outcome.status {
            Status::Success | Status::Failed | Status::NotApplied => checks.close(key),
            _ => {}
        }
        Some(outcome)
    }

    /// Checks every call this set keeps for checking
    /// ([`with_checks`](Self::with_checks)), oldest first, and says what
    /// became of them: those proven or settled are closed (their ledger
    /// records say so), the others stay to be checked later. A call whose
    /// last attempt has not settled yet stays in doubt until it has.
    pub async fn reconcile(&self) -> Reconciled {
        let keys = self.checks.as_ref().map(Pendings::keys).unwrap_or_default();
        let mut done = Reconciled::default();
        for key in keys {
            let Some(outcome) = self.check(key).await else { continue };
            done.checked += 1;
            match outcome.status {
                Status::Success => done.applied += 1,
                Status::NotApplied | Status::Failed => done.not_applied += 1,
                _ => done.in_doubt += 1,
            }
        }
        done
    }

    /// Runs [`reconcile`](Self::reconcile) every `every`, forever: the
    /// opt-in background reconciler, so that doubt drains instead of piling
    /// up. Spawn it (`tokio::spawn(async move { set.reconcile_every(d).await })`
    /// with the set in an `Arc`) or select on it.
    pub async fn reconcile_every(&self, every: Duration) {
        loop {
            crate::clock::sleep(self.context.clock(), every).await;
            self.reconcile().await;
        }
    }

    /// `check_call {key}`: the model's way to [`check`](Self::check).
    async fn check_call(&self, arguments: &Value) -> ToolOutcome {
        let key = arguments
            .as_object()
            .filter(|o| o.len() == 1)
            .and_then(|o| o.get("key"))
            .and_then(Value::as_str)
            .map(str::parse::<IdempotencyKey>);
        let key = match key {
            Some(Ok(key)) => key,
            Some(Err(e)) => {
                return ToolOutcome::invalid_arguments(&ArgsError::new(
                    CHECK_TOOL,
                    format!("field `key`: {e}"),
                ));
            }
            None => {
                return ToolOutcome::invalid_arguments(&ArgsError::new(
                    CHECK_TOOL,
                    "the arguments must be {\"key\": \"<32 hex digits>\"}",
                ));
            }
        };
        match self.check(key).await {
            Some(outcome) => outcome,
            None => ToolOutcome::invalid_arguments(&ArgsError::new(
                CHECK_TOOL,
                format!(
                    "no call with key {key} is waiting to be checked: it succeeded or failed \
                     already, or it was not made by this tool set since it started. To learn \
                     what became of it, repeat that same call: it checks first"
                ),
            )),
        }
    }

    fn no_such_tool(&self, name: &str) -> ToolOutcome {
        let check = self.checks.as_ref().map(|_| CHECK_TOOL);
        ToolOutcome::no_such_tool(name, self.names().chain(check))
    }
}

impl<S> fmt::Debug for ToolSet<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolSet")
            .field("tools", &self.names().collect::<Vec<_>>())
            .field("context", &self.context)
            .finish_non_exhaustive()
    }
}

fn description(spec: &ToolSpec) -> Option<&'static str> {
    Some(spec.description).filter(|d| !d.is_empty())
}

/// The check tool, as [`mcp_annotations`] sees it: a read.
static CHECK_SPEC: ToolSpec = ToolSpec::new(CHECK_TOOL, SideEffect::None);

/// The MCP tool annotations of a tool, from its side-effect class, its
/// [`EffectKind`] and its effect identity, by the definitions of MCP's
/// `ToolAnnotations`:
///
/// | the tool | `readOnlyHint` | `destructiveHint` | `idempotentHint` | `openWorldHint` |
/// |---|---|---|---|---|
/// | a read (`side_effect = none`) | true | | | true |
/// | `effect = "additive"` | false | false | key | true |
/// | `effect = "overwrite"` | false | true | true | true |
/// | `effect = "delete"` | false | true | key | true |
/// | no effect kind | false | true | key | true |
///
/// ("key": true when the tool declares its effect identity,
/// [`ToolSpec::effect_key`], false otherwise.)
///
/// - `readOnlyHint` is true exactly for the class of reads; read-only tools
///   leave the other hints out, which MCP defines only for tools that
///   write.
/// - `destructiveHint`: "if false, the tool performs only additive
///   updates". So it is false for an additive effect alone: an overwrite
///   loses the value that was there, a delete the thing. A tool that does
///   not say what its effect does gets MCP's own default, true: it may be
///   destructive. The side-effect class does not enter: it says how much a
///   repeat costs, not whether an effect adds or replaces (a payment is
///   irreversible and additive).
/// - `idempotentHint`: "calling the tool repeatedly with the same arguments
///   will have no additional effect". True when the tool declares its
///   effect identity (`key(order)`): the key is the business action, so
///   every repeat, under any tool-call id, is replayed or verified, never
///   done again. True for an overwrite: the same value written again
///   changes nothing more. False otherwise: the ledger replays a repeat
///   only within its key scope (the same tool-call id or idempotency key,
///   or the same time bucket), and a host that re-sends with a new id makes
///   a new call, so a second message is sent, a second record created. A
///   delete is not taken as idempotent by itself: "delete the oldest"
///   repeated deletes another; a delete that names its target declares it
///   as its key.
/// - `openWorldHint` is true: verified tools act on services outside the
///   agent.
///
/// ```
/// use verified_tools::{EffectKind, SideEffect, ToolSpec};
/// use verified_tools::toolset::mcp_annotations;
///
/// let set_status = ToolSpec::new("set_status", SideEffect::High)
///     .with_effect_kind(EffectKind::Overwrite);
/// let hints = mcp_annotations(&set_status);
/// assert_eq!((&hints["destructiveHint"], &hints["idempotentHint"]), (&true.into(), &true.into()));
///
/// let send = ToolSpec::new("send", SideEffect::High).with_effect_kind(EffectKind::Additive);
/// let hints = mcp_annotations(&send);
/// assert_eq!((&hints["destructiveHint"], &hints["idempotentHint"]), (&false.into(), &false.into()));
/// ```
pub fn mcp_annotations(spec: &ToolSpec) -> Value {
    if spec.side_effect == SideEffect::None {
        return json!({"readOnlyHint": true, "openWorldHint": true});
    }
    let destructive = spec.effect_kind != Some(EffectKind::Additive);
    let idempotent = !spec.effect_key.is_empty() || spec.effect_kind == Some(EffectKind::Overwrite);
    json!({
        "readOnlyHint": false,
        "destructiveHint": destructive,
        "idempotentHint": idempotent,
        "openWorldHint": true
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::mcp_annotations;
    use crate::{EffectKind, SideEffect, ToolSpec};

    /// `(destructiveHint, idempotentHint)` of a hand-written spec.
    fn hints(spec: &ToolSpec) -> (bool, bool) {
        let a = mcp_annotations(spec);
        assert_eq!((&a["readOnlyHint"], &a["openWorldHint"]), (&json!(false), &json!(true)));
        (a["destructiveHint"].as_bool().unwrap(), a["idempotentHint"].as_bool().unwrap())
    }

    #[test]
    fn annotations_follow_mcps_definitions() {
        let write = |kind: Option<EffectKind>, key: &'static [&'static str]| {
            let spec = ToolSpec::new("t", SideEffect::High).with_effect_key(key);
            match kind {
                Some(kind) => spec.with_effect_kind(kind),
                None => spec,
            }
        };
        let keyed: &[&str] = &["order"];
        // (kind, declares a key) -> (destructive, idempotent)
        let table = [
            (Some(EffectKind::Additive), false, (false, false)),
            (Some(EffectKind::Additive), true, (false, true)),
            (Some(EffectKind::Overwrite), false, (true, true)),
            (Some(EffectKind::Overwrite), true, (true, true)),
            (Some(EffectKind::Delete), false, (true, false)),
            (Some(EffectKind::Delete), true, (true, true)),
            (None, false, (true, false)),
            (None, true, (true, true)),
        ];
        for (kind, key, expected) in table {
            let spec = write(kind, if key { keyed } else { &[] });
            assert_eq!(hints(&spec), expected, "{kind:?}, key: {key}");
        }
        // The class says what a repeat costs, not what the effect does.
        for class in [SideEffect::Low, SideEffect::High, SideEffect::Irreversible] {
            let spec = ToolSpec::new("t", class).with_effect_kind(EffectKind::Additive);
            assert_eq!(hints(&spec), (false, false), "{class:?}");
        }
        // Reads say only that they read.
        let read = ToolSpec::new("r", SideEffect::None).with_effect_kind(EffectKind::Overwrite);
        assert_eq!(mcp_annotations(&read), json!({"readOnlyHint": true, "openWorldHint": true}));
    }
}
