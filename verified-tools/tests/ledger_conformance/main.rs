//! The ledger contract, checked against every backend: the same tests
//! (`suite.rs`), instantiated per backend, each with its real store.

use test_support as support;

mod suite;

mod memory;
mod postgres;
mod redis;
mod redis_lost_answers;
mod sqlite;
