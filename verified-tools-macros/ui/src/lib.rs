//! Nothing: the package exists for its tests (`tests/ui.rs`).
