//! The benchmarks of verified-tools; this library is empty, the benches are
//! its `[[bench]]` targets (see `Cargo.toml` and BENCHMARKS.md).
