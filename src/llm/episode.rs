//! One episode with a model planning: the conversation, the tool calls,
//! the score.

use std::time::Duration;

use serde_json::{Value, json};

use super::client::ModelClient;
use verified_tools::UnknownReason;
use verified_tools::toolset::{Status, ToolOutcome, ToolSet};

use super::{
    CallRecord, LlmConfig, LlmEpisode, LlmError, SYSTEM_PROMPT, episode_tools, task_prompt,
};
use crate::experiment::{EpisodeSpec, Shared};
use crate::tools::SimClient;

/// How long the ground truth waits for late arrivals to land once the
/// model has stopped: the simulator's heavy tail can exceed any bound, and
/// a run must end.
const TRUTH_WAIT: Duration = Duration::from_secs(30);

/// Runs one episode of `spec` (its task, faults, seed and method) with the
/// model at `config`: the conversation goes on until the model answers
/// without a tool call or the turns run out; then the ground truth is read
/// (after letting late arrivals land, for at most 30 s). Its calls are
/// recorded in `shared`'s ledger if given, else in one of its own.
///
/// # Errors
///
/// [`LlmError::BaseUrl`] at once for a base URL that is not `http://`;
/// when the model server keeps failing a request past
/// [`LlmConfig::retries`], [`LlmError::Exhausted`] with its last error; a
/// refusal that a re-send would not change (an HTTP 4xx but 408 and 429),
/// at once. A model that misuses the tools is not an error: its mistakes
/// are outcomes it is shown.
pub async fn run_episode(
    config: &LlmConfig,
    spec: &EpisodeSpec,
    shared: Option<&Shared>,
) -> Result<LlmEpisode, LlmError> {
    let client = ModelClient::new(config)?;
    let started = tokio::time::Instant::now();
    let (tools, oracle) = episode_tools(spec, shared);
    let listed = tools.openai_tools();
    let mut messages = vec![
        json!({"role": "system", "content": SYSTEM_PROMPT}),
        json!({"role": "user", "content": task_prompt(&spec.task)}),
    ];
    let mut calls = Vec::new();
    let (mut turns, mut resent) = (0, 0);
    let mut final_message = None;
    while turns < config.max_turns {
        turns += 1;
        let mut request = json!({
            "model": config.model,
            "messages": messages,
            "tools": listed,
            "tool_choice": "auto",
        });
        if let Some(t) = config.temperature {
            request["temperature"] = json!(t);
        }
        let (reply, again) = client.complete(&request, turns).await?;
        resent += again;
        if reply.calls.is_empty() {
            final_message = Some(reply.content.unwrap_or_default());
            break;
        }
        messages.push(json!({
            "role": "assistant",
            "content": reply.content,
            "tool_calls": reply.calls.iter().map(|c| json!({
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            })).collect::<Vec<Value>>(),
        }));
        for call in reply.calls {
            let record = dispatch(config, &tools, call.id, call.name, call.arguments).await;
            let content = serde_json::to_string(&record.outcome)
                .unwrap_or_else(|e| format!("{{\"status\":\"failed\",\"error\":\"{e}\"}}"));
            messages.push(json!({"role": "tool", "tool_call_id": record.id, "content": content}));
            calls.push(record);
        }
    }
    let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let truth = match tokio::time::timeout(TRUTH_WAIT, oracle.final_truth()).await {
        Ok(truth) => truth,
        Err(_) => oracle.truth(),
    };
    let claimed_success = final_message
        .as_deref()
        .is_some_and(|m| m.trim_start().to_ascii_uppercase().starts_with("SUCCESS"));
    Ok(LlmEpisode {
        claimed_success,
        success: spec.task.holds(&truth),
        duplicate: truth.has_duplicates(),
        turns,
        resent,
        calls,
        dispatches: tools.state().calls(),
        verifier_reads: tools.state().verifier_reads(),
        elapsed_ms,
        final_message,
    })
}

/// Whether re-issuing a call in doubt can resolve it: not when its retries
/// ran out with no verifier read (the retry-only arms), where the engine
/// would neither send nor look.
fn may_reissue(outcome: &ToolOutcome) -> bool {
    outcome.status == Status::Unknown && outcome.reason != Some(UnknownReason::RetriesExhausted)
}

/// Dispatches one call by name with its id; re-issues it, same id, while
/// it stays in doubt and re-issues are left.
async fn dispatch(
    config: &LlmConfig,
    tools: &ToolSet<SimClient>,
    id: String,
    name: String,
    arguments: String,
) -> CallRecord {
    let mut outcome = tools.call_text(&name, &arguments, &id).await;
    let mut reissued = 0;
    while may_reissue(&outcome) && reissued < config.reissues {
        tokio::time::sleep(config.reissue_after).await;
        reissued += 1;
        outcome = tools.call_text(&name, &arguments, &id).await;
    }
    CallRecord { id, name, arguments, outcome, reissued }
}
