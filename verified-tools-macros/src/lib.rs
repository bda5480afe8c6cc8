//! The `#[verified_tool]` attribute of the `verified-tools` crate; use it
//! through its re-export `verified_tools::verified_tool`, where it is
//! documented with its examples (they need the runtime, which this crate
//! cannot depend on).
//!
//! The crate is laid out like thiserror's: `parse/` reads the attribute
//! and the signature into typed nodes, `validate.rs` checks the rules,
//! `expand/` generates the code, `fallback.rs` emits a stub next to the
//! errors so one mistake gives one message.

use proc_macro::TokenStream;

mod ctxt;
mod expand;
mod fallback;
mod parse;
mod validate;

#[cfg(test)]
mod tests;

/// Makes an `async fn` a verified tool call: the idempotency key, the
/// verify-before-retry wrapper, the retry budget and a typed `ToolResult`.
#[proc_macro_attribute]
pub fn verified_tool(args: TokenStream, item: TokenStream) -> TokenStream {
    run(args.into(), item.into()).into()
}

/// The whole attribute on `proc_macro2` tokens (what the snapshot tests call).
fn run(args: proc_macro2::TokenStream, item: proc_macro2::TokenStream) -> proc_macro2::TokenStream {
    let item_fn = match syn::parse2::<syn::ItemFn>(item.clone()) {
        Ok(item_fn) => item_fn,
        Err(_) => {
            let error = syn::Error::new(
                proc_macro2::Span::call_site(),
                "#[verified_tool] goes on an `async fn` (a free function or a method with `&self`)",
            );
            let mut out = error.to_compile_error();
            out.extend(item);
            return out;
        }
    };
    let cx = ctxt::Ctxt::default();
    let args = parse::args(args, &cx);
    let func = parse::tool_fn(item_fn);
    let verify = args.verify.clone();
    let classify = args.classify.clone();
    let verify_key = args.verify_key.as_ref().map(|l| l.value);
    match validate::tool(args, func, &cx) {
        Ok(tool) => expand::tool(&tool),
        Err(func) => {
            let mut out = cx.finish().err().map(syn::Error::into_compile_error).unwrap_or_default();
            out.extend(fallback::expand(&func, verify.as_ref(), verify_key, classify.as_ref()));
            out
        }
    }
}
