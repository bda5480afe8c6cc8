//! The verifier closure and the checks of the user's verifier against the
//! tool's signature, with the messages that say what signature to write.
//! Apart because most of it is diagnostics: items whose only purpose is
//! that a wrong verifier is one error, at `verify = path`, that names the fix.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::Ident;
use syn::spanned::Spanned as _;

use super::{ident_at, respan};
use crate::parse::{self, Injected, ToolFn};

/// The verifier closure, its call spanned on the user's `verify = path` so
/// that every mistake in the verifier is one error there:
///
/// - a verifier of other parameters (another arity, another type): the
///   trait `__VtVerifier` (one impl per form, with and without the key) is
///   not implemented for it, and its message writes out the signature to
///   give it;
/// - a verifier that takes the key or not, against a `verify_key = ..`
///   that says otherwise: `__VtKeyArgument` says what to remove (without
///   `verify_key`, the verifier's arity decides);
/// - a verifier that is not `async`: `__VtAsync`, then a stand-in future
///   (`__private::VerifierRead`) so that the `.await` adds no error;
/// - a verdict of the wrong type: `IntoVerdict`.
pub(crate) fn verifier(
    func: &ToolFn,
    path: &syn::Path,
    ok: &syn::Type,
    with_key: Option<bool>,
) -> TokenStream {
    let span = path.span();
    let is_method = func.receiver.is_some();
    let bare = path.leading_colon.is_none() && path.segments.len() == 1;
    let callee = if is_method && bare { quote_spanned!(span=> Self::#path) } else { quote!(#path) };
    let receiver = is_method.then(|| quote_spanned!(span=> self,));
    let args: Vec<TokenStream> = func
        .params
        .iter()
        .filter(|p| p.is_argument())
        .filter_map(|p| {
            let name = ident_at(p.ident.as_ref()?, span);
            Some(if p.is_shared_ref() {
                quote_spanned!(span=> #name)
            } else {
                quote_spanned!(span=> &#name)
            })
        })
        .collect();
    // The arguments' types, written out: a verifier of another signature
    // is then one error (`__VtVerifier`, whose message writes the signature
    // to give it), not a mismatch of one argument. `impl Trait` parameters
    // cannot be named: inferred.
    let arg_types: Vec<TokenStream> = is_method
        .then(|| quote!(&Self))
        .into_iter()
        .chain(func.params.iter().filter(|p| p.is_argument() && p.ident.is_some()).map(|p| {
            let ty = &p.ty;
            if mentions_impl(quote!(#ty)) {
                quote!(_)
            } else if p.is_shared_ref() {
                quote!(#ty)
            } else {
                quote!(&#ty)
            }
        }))
        .collect();
    let arity = arg_types.len();
    let messages = VerifierMessages::new(func, path, ok, with_key);
    let (sig_message, sig_label, sig_note) =
        (&messages.signature, &messages.signature_label, &messages.signature_note);
    let (key_message, key_label) = (&messages.key, &messages.key_label);
    let (async_message, async_label, async_note) =
        (&messages.not_async, &messages.not_async_label, &messages.not_async_note);
    // Without `verify_key`, the verifier's arity says whether it takes the
    // key: both forms are verifiers, and inference picks the one it fits.
    let expected_key: Vec<TokenStream> = match with_key {
        Some(true) => vec![quote!(TakesKey)],
        Some(false) => vec![quote!(TakesNoKey)],
        None => vec![quote!(TakesNoKey), quote!(TakesKey)],
    };

    let types: Vec<Ident> = (0..arity).map(|i| format_ident!("__VtA{}", i)).collect();
    let values: Vec<Ident> = (0..arity).map(|i| format_ident!("__vt_a{}", i)).collect();
    let key = Ident::new("__vt_key", Span::mixed_site());
    // At the path, so that the errors on the read point there.
    let read = Ident::new("__vt_read", span);
    let call = quote_spanned! {span=>
        __vt_verifier::<(#(#arg_types,)*), _, _>(&#callee, (#receiver #(#args,)*), #key)
    };
    let check_async = quote_spanned!(span=> __vt_async(&#read););
    let verifier_read = quote_spanned! {span=>
        ::verified_tools::__private::VerifierRead(#read).verifier_read()
    };
    let ok = respan(quote!(#ok), span);
    let seen = Ident::new("__vt_seen", span);
    let verdict = quote_spanned!(span=> ::verified_tools::IntoVerdict::<#ok>::into_verdict(#seen));
    // The checks' items, located at the path too (so that rustc's notes on
    // them point there, not at the whole attribute), with the hygiene of
    // the macro (so that no lint of the user's crate applies to them).
    let items = quote! {
        #[diagnostic::on_unimplemented(message = #sig_message, label = #sig_label, note = #sig_note)]
        trait __VtVerifier<__VtArgs, __VtKey> {
            type Read;
            fn __vt_read(&self, args: __VtArgs, key: ::verified_tools::IdempotencyKey) -> Self::Read;
        }
        impl<__VtF, __VtR, #(#types),*> __VtVerifier<(#(#types,)*), ::verified_tools::__private::TakesNoKey>
            for __VtF
        where
            __VtF: ::core::ops::Fn(#(#types),*) -> __VtR,
        {
            type Read = __VtR;
            fn __vt_read(&self, (#(#values,)*): (#(#types,)*), _: ::verified_tools::IdempotencyKey) -> __VtR {
                self(#(#values),*)
            }
        }
        impl<__VtF, __VtR, #(#types),*> __VtVerifier<(#(#types,)*), ::verified_tools::__private::TakesKey>
            for __VtF
        where
            __VtF: ::core::ops::Fn(#(#types,)* ::verified_tools::IdempotencyKey) -> __VtR,
        {
            type Read = __VtR;
            fn __vt_read(&self, (#(#values,)*): (#(#types,)*), key: ::verified_tools::IdempotencyKey) -> __VtR {
                self(#(#values,)* key)
            }
        }
        #[diagnostic::on_unimplemented(message = #key_message, label = #key_label)]
        trait __VtKeyArgument {}
        #(impl __VtKeyArgument for ::verified_tools::__private::#expected_key {})*
        #[diagnostic::on_unimplemented(message = #async_message, label = #async_label, note = #async_note)]
        trait __VtAsync {}
        impl<__VtF: ?::core::marker::Sized + ::core::future::Future> __VtAsync for __VtF {}
        fn __vt_verifier<__VtArgs, __VtKey: __VtKeyArgument, __VtF: __VtVerifier<__VtArgs, __VtKey>>(
            verifier: &__VtF,
            args: __VtArgs,
            key: ::verified_tools::IdempotencyKey,
        ) -> __VtF::Read {
            verifier.__vt_read(args, key)
        }
        fn __vt_async<__VtF: __VtAsync>(_: &__VtF) {}
        #[allow(unused_imports)]
        use ::verified_tools::__private::{AsyncVerifierRead as _, SyncVerifierRead as _};
    };
    let items = respan(items, Span::mixed_site().located_at(span));
    quote! {
        ::core::option::Option::Some({
            #items
            |#key: ::verified_tools::IdempotencyKey| {
                let #read = #call;
                #check_async
                let #read = #verifier_read;
                async move {
                    let #seen = #read.await;
                    #verdict
                }
            }
        })
    }
}

/// Whether the tokens contain `impl` (an `impl Trait` type).
fn mentions_impl(tokens: TokenStream) -> bool {
    tokens.into_iter().any(|tt| match tt {
        proc_macro2::TokenTree::Ident(i) => i == "impl",
        proc_macro2::TokenTree::Group(g) => mentions_impl(g.stream()),
        _ => false,
    })
}

/// What the verifier's compile errors say: the signature to write, named
/// after the user's verifier and tool.
struct VerifierMessages {
    signature: String,
    signature_label: String,
    signature_note: String,
    key: String,
    key_label: String,
    not_async: String,
    not_async_label: String,
    not_async_note: String,
}

impl VerifierMessages {
    fn new(func: &ToolFn, path: &syn::Path, ok: &syn::Type, with_key: Option<bool>) -> Self {
        let with_key = with_key == Some(true);
        let tool = func.item.sig.ident.to_string();
        let written =
            path.segments.iter().map(|s| s.ident.to_string()).collect::<Vec<_>>().join("::");
        let name = path.segments.last().map_or_else(String::new, |s| s.ident.to_string());
        let bare = path.leading_colon.is_none() && path.segments.len() == 1;
        let mut params = Vec::new();
        if func.receiver.is_some() {
            params.push(if bare { "&self".to_owned() } else { "this: &Self".to_owned() });
        }
        for p in func.params.iter().filter(|p| p.is_argument()) {
            let ty = parse::type_string(&p.ty);
            let ty = if p.is_shared_ref() { ty } else { format!("&{ty}") };
            let param = p.ident.as_ref().map_or_else(|| "_".to_owned(), ToString::to_string);
            params.push(format!("{param}: {ty}"));
        }
        let key_name = func
            .params
            .iter()
            .find(|p| p.injected == Some(Injected::Key))
            .and_then(|p| p.ident.as_ref())
            .map_or_else(|| "key".to_owned(), ToString::to_string);
        if with_key {
            params.push(format!("{key_name}: IdempotencyKey"));
        }
        let signature = format!(
            "async fn {name}({}) -> Verdict<{}>",
            params.join(", "),
            parse::type_string(ok)
        );
        // `{` and `}` are format syntax in `on_unimplemented`.
        let escape = |text: String| text.replace('{', "{{").replace('}', "}}");
        let (key, key_label) = if with_key {
            (
                format!(
                    "`verify_key = true` passes the call's `IdempotencyKey` to the verifier as its \
                     last argument, but `{written}` does not take it: write `{signature}`, or \
                     remove `verify_key`"
                ),
                "takes no `IdempotencyKey` last".to_owned(),
            )
        } else {
            (
                format!(
                    "`verify_key = false` says the verifier takes no key, but `{written}` takes \
                     the call's `IdempotencyKey`: remove `verify_key = false` (the verifier's \
                     parameters say it)"
                ),
                "takes the key as its last parameter".to_owned(),
            )
        };
        Self {
            signature: escape(format!(
                "the verifier `{written}` does not take the parameters of `{tool}`: write `{signature}`"
            )),
            signature_label: escape(format!("not a verifier of `{tool}`")),
            signature_note: "a verifier takes the tool's parameters but the `IdempotencyKey`, \
                `Deadline` and `Holder` ones, in order, each by shared reference (`&T` for an owned `T`), then \
                optionally the call's `IdempotencyKey`; it returns `Verdict<T>` or `Result<Verdict<T>, E>`"
                .to_owned(),
            key: escape(key),
            key_label,
            not_async: escape(format!(
                "the verifier `{written}` must be an `async fn` (or return a future), not return "
            )) + "`{Self}`",
            not_async_label: "not an `async fn`".to_owned(),
            not_async_note: escape(format!(
                "write `{signature}`: the wrapper awaits the verifier's read, with the attempt's timeout"
            )),
        }
    }
}
