//! Compile-time behaviour of `#[verified_tool]`: every supported form compiles
//! (`tests/ui/pass`), every rule is a compile error with a checked-in message
//! (`tests/ui/fail/*.stderr`). Regenerate messages with `TRYBUILD=overwrite`
//! and review the diff.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
