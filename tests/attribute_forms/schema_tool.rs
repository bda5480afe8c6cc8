//! `schema = true`: `<name>_tool()` lists and dispatches the tool in a
//! `ToolSet`; a free fn that skips two parts of the state, a method, and a
//! read with a described parameter share one set.
use std::sync::Arc;

use verified_tools::toolset::{Has, ToolSet};
use verified_tools::{ErrorClass, verified_tool};

pub struct Crm;
pub struct Mailer;

pub struct App {
    crm: Crm,
    mailer: Arc<Mailer>,
}

impl Has<Crm> for App {
    fn get(app: &Self) -> &Crm {
        &app.crm
    }
}

impl Has<Arc<Mailer>> for App {
    fn get(app: &Self) -> &Arc<Mailer> {
        &app.mailer
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Bug,
    Question,
}

/// Opens a ticket.
#[verified_tool(
    side_effect = "low",
    skip(crm, mailer),
    schema = true,
    params(title = "A one-line summary.", r#type = "The kind of ticket.")
)]
pub async fn open_ticket(
    crm: &Crm,
    mailer: Arc<Mailer>,
    title: &str,
    r#type: Option<Kind>,
    tags: &[String],
) -> Result<u64, ErrorClass> {
    let _ = (crm, mailer, r#type);
    Ok(title.len() as u64 + tags.len() as u64)
}

impl Crm {
    /// Counts tickets.
    #[verified_tool(side_effect = "none", schema = true, params(open = "Only open ones."))]
    pub async fn count(&self, open: bool) -> Result<u64, ErrorClass> {
        Ok(u64::from(open))
    }
}

#[test]
fn compiles_and_runs() {
    let set = ToolSet::new(App { crm: Crm, mailer: Arc::new(Mailer) })
        .with(open_ticket_tool())
        .with(Crm::count_tool());
    let listed = set.mcp_tools();
    assert_eq!(listed[0]["inputSchema"]["required"], serde_json::json!(["title", "tags"]));
    assert_eq!(
        listed[0]["inputSchema"]["properties"]["type"]["description"],
        "The kind of ticket."
    );
    assert_eq!(listed[1]["annotations"]["readOnlyHint"], true);
    // A tool that borrows only a `Crm` fits a set over just a `Crm`.
    let alone = ToolSet::new(Crm).with(Crm::count_tool());
    assert_eq!(alone.names().collect::<Vec<_>>(), ["count"]);
}
