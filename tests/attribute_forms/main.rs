//! Every form `#[verified_tool]` accepts compiles, without a warning, and
//! runs: a module per form. The forms it rejects are the trybuild cases of
//! `verified-tools-macros/ui/` (the package `verified-tools-ui`).
//!
//! These were trybuild pass cases; trybuild builds each of those as a crate
//! of its own, one after the other (58 s cold on 2 cores for 13 cases). Here
//! they are one test binary sharing the workspace's build, and `deny(warnings)`
//! over all of them says that the generated code adds no lint to the user's.
#![deny(warnings)]

mod classify;
mod deadline_and_settle;
mod generic;
mod high_with_verifier;
mod holder;
mod json_arguments;
mod method;
mod no_warnings;
mod none_and_low_without_verifier;
mod options;
mod raw_identifier;
mod schema_tool;
mod skip_secret_and_key;
mod verifier_returns_result;
mod verifier_takes_key;
