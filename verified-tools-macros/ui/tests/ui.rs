//! Every rule of `#[verified_tool]` is a compile error with a checked-in
//! message (`tests/ui/fail/*.stderr`). Regenerate messages with
//! `TRYBUILD=overwrite` and review the diff. The forms it accepts are tests
//! of the root package (`tests/attribute_forms/`): with compile-fail cases
//! only, trybuild checks them all in one `cargo check`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
}
