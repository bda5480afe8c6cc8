//! Code generation for a checked [`Tool`]. Nothing here reports errors: the
//! compiler's own errors are steered onto the user's tokens with
//! `quote_spanned!` (the verifier path, a parameter's type, the return type,
//! the fn name).

mod json;
mod verifier;

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::Ident;
use syn::ext::IdentExt as _;
use syn::spanned::Spanned as _;

use self::json::{json_entry, schema_items};
pub(crate) use self::verifier::verifier;
use crate::parse::{self, Injected, ToolFn};
use crate::validate::Tool;

/// The generated entry point, the descriptor fn and the checks.
pub(crate) fn tool(tool: &Tool) -> TokenStream {
    let item = &tool.func.item;
    let attrs = &item.attrs;
    let vis = &item.vis;
    let sig = &item.sig;
    let ident = &sig.ident;
    let generics = &sig.generics;
    let where_clause = &generics.where_clause;
    let (ok, err) = (&tool.ok, &tool.err);
    let cx = context_ident();
    let receiver = tool.func.receiver.as_ref().map(|r| quote!(#r,));
    let params = entry_params(&tool.func);

    let spec = spec(tool);
    let spec_fn = descriptor_fn(&tool.func, &spec);

    // The key-relevant parameters (not skipped, not the key), each checked
    // for `Serialize` on its type (one error there), then borrowed into the
    // payload (a stand-in when the check failed, so that the payload and the
    // audit add no error of their own).
    let key_params: Vec<(&Ident, &parse::FnParam, bool)> = tool
        .func
        .params
        .iter()
        .enumerate()
        .filter(|(i, p)| p.is_argument() && !tool.skipped[*i])
        .filter_map(|(i, p)| Some((p.ident.as_ref()?, p, tool.secret[i])))
        .collect();
    let var = |name: &Ident| Ident::new(&format!("__vt_{}", name.unraw()), Span::mixed_site());
    let key_vars: Vec<Ident> = key_params.iter().map(|(name, _, _)| var(name)).collect();
    // `key(..)`: the key is derived from these alone, in declaration order;
    // the fingerprint from every key-relevant parameter.
    let effect_vars: Vec<Ident> = tool
        .func
        .params
        .iter()
        .zip(&tool.effect_key)
        .filter(|(_, on)| **on)
        .filter_map(|(p, _)| p.ident.as_ref().map(var))
        .collect();
    let payload = if effect_vars.is_empty() {
        quote!(let __vt_payload = (#(#key_vars,)*);)
    } else {
        quote! {
            let __vt_all = (#(#key_vars,)*);
            let __vt_effect = (#(#effect_vars,)*);
            let __vt_payload =
                ::verified_tools::key::Effect { identity: &__vt_effect, args: &__vt_all };
        }
    };
    let key_imports = (!key_params.is_empty()).then(|| {
        quote! {
            #[allow(unused_imports)]
            use ::verified_tools::__private::{SerializeKeyValue as _, UnserializableKeyValue as _};
        }
    });
    let key_borrows = key_params.iter().zip(&key_vars).map(|((name, param, _), var)| {
        let span = parse::focus_span(&param.ty);
        let name = ident_at(name, span);
        let value = if param.is_shared_ref() {
            quote_spanned!(span=> #name)
        } else {
            quote_spanned!(span=> &#name)
        };
        quote_spanned! {span=>
            ::verified_tools::__private::key_parameter(#value);
            let #var = ::verified_tools::__private::KeyValue(#value).key_value();
        }
    });
    let audit_fields: Vec<&Ident> = key_params.iter().map(|(name, _, _)| *name).collect();
    let audit_types: Vec<Ident> =
        (0..key_params.len()).map(|i| format_ident!("__VtA{}", i)).collect();
    let audit_generics =
        if audit_types.is_empty() { None } else { Some(quote!(<#(#audit_types),*>)) };
    let audit_values = key_params
        .iter()
        .zip(&key_vars)
        .map(|((_, _, secret), var)| if *secret { quote!("<redacted>") } else { quote!(#var) });

    let audit = quote! {
        #[derive(::verified_tools::__private::Serialize)]
        #[serde(crate = "::verified_tools::__private::serde")]
        struct __VtArgs #audit_generics {
            #(#audit_fields: #audit_types,)*
        }
        let __vt_args = __VtArgs { #(#audit_fields: #audit_values,)* };
    };
    if tool.transactional {
        let preamble = quote! {
            const __VT_SPEC: &::verified_tools::ToolSpec = &#spec;
            #key_imports
            #(#key_borrows)*
            #payload
            #audit
        };
        return transactional(tool, &spec_fn, &params, preamble);
    }
    let dispatch = dispatch(tool);
    let classify =
        tool.classify.as_ref().map(|path| classify_fn(path, err, &quote!(__vt_classify)));
    let verify = match &tool.verify {
        Some(path) => verifier(&tool.func, path, ok, tool.verify_key),
        None => quote!(::verified_tools::engine::no_verifier()),
    };
    // The engine's bounds (`E: Classify`, `T: Clone + Send + Sync + 'static`)
    // are reported on the error type of the user's signature.
    let err_span = parse::focus_span(err);
    let call = quote_spanned! {err_span=>
        ::verified_tools::engine::call(
            #cx,
            __VT_SPEC,
            &__vt_payload,
            &__vt_args,
            __vt_dispatch,
            __vt_verify,
            __vt_codec,
        )
    };
    // With `classify = path` the engine saw `Classified<E>`: the caller gets
    // `E` back.
    let await_call = match &tool.classify {
        Some(_) => quote_spanned! {err_span=>
            ::verified_tools::ToolResult::map_err(__vt_call.await, ::verified_tools::Classified::into_inner)
        },
        None => quote_spanned!(err_span=> __vt_call.await),
    };
    let send_check = if tool.send { send_check(tool) } else { TokenStream::new() };
    let json_entry = if tool.json { json_entry(tool) } else { TokenStream::new() };
    let schema_items = tool.schema.map(|span| schema_items(tool, span)).unwrap_or_default();

    quote! {
        #spec_fn
        #json_entry
        #schema_items

        #(#attrs)*
        #vis async fn #ident #generics (#receiver #cx: &::verified_tools::Context, #(#params),*)
            -> ::verified_tools::ToolResult<#ok, #err>
        #where_clause
        {
            const __VT_SPEC: &::verified_tools::ToolSpec = &#spec;
            #key_imports
            #(#key_borrows)*
            #payload
            #audit
            #classify
            let __vt_dispatch = #dispatch;
            let __vt_verify = #verify;
            // Values that serialize are kept in the ledger for replays in
            // other processes; others are obtained again by verifying.
            let __vt_codec = {
                #[allow(unused_imports)]
                use ::verified_tools::ledger::{SerdeCodec as _, UnrecordedCodec as _};
                (&::verified_tools::ledger::CodecProbe::<#ok>::new()).codec()
            };
            let __vt_call = #call;
            #send_check
            #await_call
        }
    }
}

/// A `transactional` tool's entry point: `name(cx, ledger, client, args..)`,
/// one `PostgresLedger::transact` call whose body is the user's block, with
/// the `&Tx<'_>` parameter bound to the attempt's transaction.
fn transactional(
    tool: &Tool,
    spec_fn: &TokenStream,
    params: &[TokenStream],
    preamble: TokenStream,
) -> TokenStream {
    let item = &tool.func.item;
    let (attrs, vis, block) = (&item.attrs, &item.vis, &item.block);
    let ident = &item.sig.ident;
    let (ok, err) = (&tool.ok, &tool.err);
    let ret = match &item.sig.output {
        syn::ReturnType::Type(_, ty) => quote!(#ty),
        syn::ReturnType::Default => quote!(()),
    };
    let cx = context_ident();
    let ledger = Ident::new("ledger", Span::mixed_site());
    let client = Ident::new("client", Span::mixed_site());
    let tx = Ident::new("__vt_tx", Span::mixed_site());
    let binding = tool.func.params.iter().find(|p| p.injected == Some(Injected::Tx)).map(|p| {
        let (pat, ty) = (&p.pat, &p.ty);
        quote!(let #pat: #ty = #tx;)
    });
    let rebinds = rebinds(tool);
    let err_span = parse::focus_span(err);
    let call = quote_spanned! {err_span=>
        #ledger.transact(#cx, __VT_SPEC, #client, &__vt_payload, &__vt_args, |#tx| {
            #(#rebinds)*
            #binding
            ::std::boxed::Box::pin(::verified_tools::__private::body::<#ret, _>(async move #block))
        })
    };
    quote! {
        #spec_fn

        #(#attrs)*
        #vis async fn #ident(
            #cx: &::verified_tools::Context,
            #ledger: &::verified_tools::ledger::PostgresLedger,
            #client: &mut ::verified_tools::__private::PgClient,
            #(#params),*
        ) -> ::verified_tools::ToolResult<#ok, ::verified_tools::ledger::TxError<#err>> {
            #preamble
            #call.await
        }
    }
}

/// The context parameter of the entry point. Mixed-site hygiene keeps it
/// apart from a user parameter of the same name.
pub(crate) fn context_ident() -> Ident {
    Ident::new("cx", Span::mixed_site())
}

/// The entry point's parameters after the context: the user's, minus the
/// `IdempotencyKey` one, each bound by plain name.
pub(crate) fn entry_params(func: &ToolFn) -> Vec<TokenStream> {
    func.params
        .iter()
        .filter(|p| p.is_argument())
        .map(|p| {
            let attrs = &p.attrs;
            let ty = &p.ty;
            match &p.ident {
                Some(name) => quote!(#(#attrs)* #name: #ty),
                None => {
                    let pat = &p.pat;
                    quote!(#(#attrs)* #pat: #ty)
                }
            }
        })
        .collect()
}

/// `name_spec`: the descriptor fn's name.
pub(crate) fn spec_fn_ident(func: &ToolFn) -> Ident {
    let ident = &func.item.sig.ident;
    Ident::new(&format!("{}_spec", ident.unraw()), ident.span())
}

/// `pub const fn name_spec() -> &'static ToolSpec`.
pub(crate) fn descriptor_fn(func: &ToolFn, spec: &TokenStream) -> TokenStream {
    let vis = &func.item.vis;
    let ident = &func.item.sig.ident;
    let spec_fn = spec_fn_ident(func);
    let doc = format!(
        " The descriptor of the `{ident}` verified tool: its name, side-effect class, \
         verifier, retry budget and parameters, for a tool registry or an LLM-facing listing."
    );
    quote! {
        #[doc = #doc]
        #[allow(dead_code)]
        #vis const fn #spec_fn() -> &'static ::verified_tools::ToolSpec {
            const SPEC: ::verified_tools::ToolSpec = #spec;
            &SPEC
        }
    }
}

/// The `ToolSpec` constant expression.
fn spec(tool: &Tool) -> TokenStream {
    let name = &tool.name;
    let variant = Ident::new(tool.class.variant(), Span::call_site());
    let description = parse::doc_comment(&tool.func.item.attrs);
    let description = (!description.is_empty()).then(|| quote!(.with_description(#description)));
    let verifier = tool.verify.as_ref().map(|_| quote!(.with_verifier()));
    let retries = tool.retries.map(|n| quote!(.with_retries(#n)));
    let timeout =
        tool.timeout_ms.map(|ms| quote!(.with_timeout(::core::time::Duration::from_millis(#ms))));
    let call_timeout = tool
        .call_timeout_ms
        .map(|ms| quote!(.with_call_timeout(::core::time::Duration::from_millis(#ms))));
    let settle =
        tool.settle_ms.map(|ms| quote!(.with_settle(::core::time::Duration::from_millis(#ms))));
    let bucket =
        tool.bucket_ms.map(|ms| quote!(.with_bucket(::core::time::Duration::from_millis(#ms))));
    let verify_response = tool.verify_response.map(|on| quote!(.with_verify_response(#on)));
    let holder = tool
        .func
        .params
        .iter()
        .any(|p| p.injected == Some(Injected::Holder))
        .then(|| quote!(.with_holder()));
    let effect_names: Vec<String> = tool
        .func
        .params
        .iter()
        .zip(&tool.effect_key)
        .filter(|(_, on)| **on)
        .filter_map(|(p, _)| p.ident.as_ref().map(|i| i.unraw().to_string()))
        .collect();
    let effect_key =
        (!effect_names.is_empty()).then(|| quote!(.with_effect_key(&[#(#effect_names),*])));
    let effect_kind = tool.effect.map(|variant| {
        let variant = Ident::new(variant, Span::call_site());
        quote!(.with_effect_kind(::verified_tools::EffectKind::#variant))
    });
    let params =
        tool.func.params.iter().enumerate().filter(|(_, p)| p.is_argument()).map(|(i, p)| {
            let name = p.ident.as_ref().map(|i| i.unraw().to_string()).unwrap_or_default();
            let ty = parse::type_string(&p.ty);
            let skipped = tool.skipped[i].then(|| quote!(.skipped()));
            let secret = tool.secret[i].then(|| quote!(.secret()));
            quote!(::verified_tools::Param::new(#name, #ty) #skipped #secret)
        });
    quote! {
        ::verified_tools::ToolSpec::new(#name, ::verified_tools::SideEffect::#variant)
            #description #verifier #retries #timeout #call_timeout #settle #bucket #verify_response
            #effect_key #effect_kind #holder
            .with_params(&[#(#params),*])
    }
}

/// The per-attempt closure: clones owned parameters, binds the key and the
/// deadline, and runs the user's block as the body of an `async move` block
/// typed by the user's return type (the block is not wrapped in braces of
/// ours, which `unused_braces` would flag on a one-line body). With
/// `classify = path`, the body's errors are classified by `path`.
fn dispatch(tool: &Tool) -> TokenStream {
    let item = &tool.func.item;
    let block = &item.block;
    let ret = match &item.sig.output {
        syn::ReturnType::Type(_, ty) => quote!(#ty),
        syn::ReturnType::Default => quote!(()),
    };
    let rebinds = rebinds(tool);
    let attempt = Ident::new("__vt_attempt", Span::mixed_site());
    let bindings: Vec<TokenStream> = tool
        .func
        .params
        .iter()
        .filter_map(|p| {
            let (pat, ty) = (&p.pat, &p.ty);
            let field = match p.injected? {
                Injected::Key => quote!(key),
                Injected::Deadline => quote!(deadline),
                Injected::Holder => quote!(holder),
                // A transactional tool's: bound by its own expansion.
                Injected::Tx => return None,
            };
            Some(quote!(let #pat: #ty = #attempt.#field;))
        })
        .collect();
    let attempt_arg = if bindings.is_empty() { quote!(_) } else { quote!(#attempt) };
    let body = quote!(::verified_tools::__private::body::<#ret, _>(async move #block));
    let body = match &tool.classify {
        Some(_) => quote!(::verified_tools::__private::classified(__vt_classify, #body)),
        None => body,
    };
    quote! {
        |#attempt_arg: ::verified_tools::engine::Attempt| {
            #(#rebinds)*
            #(#bindings)*
            #body
        }
    }
}

/// The owned parameters cloned for one attempt (a shared reference is
/// copied), each under the user's own `mut`.
fn rebinds(tool: &Tool) -> Vec<TokenStream> {
    tool.func
        .params
        .iter()
        .filter(|p| p.is_argument())
        .filter_map(|p| {
            let name = p.ident.as_ref()?;
            // The user's own `mut`, so that `unused_mut` is theirs.
            let mutability = p.mutability();
            if p.is_shared_ref() {
                // A shared reference is copied: no allocation.
                mutability.map(|m| quote!(let #m #name = #name;))
            } else {
                // Owned parameters are cloned per attempt (a no-op copy for
                // `Copy` types), spanned on the type so a missing `Clone`
                // lands there. A parameter only the key or the verifier reads
                // is not "unused".
                let clone = quote_spanned! {parse::focus_span(&p.ty)=>
                    ::core::clone::Clone::clone(&#name)
                };
                Some(quote! {
                    #[allow(unused_variables)]
                    let #mutability #name = #clone;
                })
            }
        })
        .collect()
}

/// `let <binding>`: `classify = path` as a `fn(&E) -> ErrorClass` pointer, all spanned on the
/// path: a function of another signature is one error there ("expected fn
/// pointer `for<'a> fn(&'a E) -> ErrorClass`, found fn item ..."), and a
/// generic one is instantiated for `E`.
pub(crate) fn classify_fn(path: &syn::Path, err: &syn::Type, binding: &TokenStream) -> TokenStream {
    let span = path.span();
    let err = respan(quote!(#err), span);
    quote_spanned! {span=>
        let #binding: fn(&#err) -> ::verified_tools::ErrorClass = #path;
    }
}

/// `send = true`: the engine's future and every parameter held across its
/// await must be `Send`; reported on the fn name.
fn send_check(tool: &Tool) -> TokenStream {
    let span = tool.func.item.sig.ident.span();
    let receiver =
        tool.func.receiver.as_ref().map(|_| quote_spanned!(span=> __vt_assert_send(&self);));
    let params = tool.func.params.iter().filter(|p| p.is_argument()).filter_map(|p| {
        let name = ident_at(p.ident.as_ref()?, span);
        Some(quote_spanned!(span=> __vt_assert_send(&#name);))
    });
    quote_spanned! {span=>
        fn __vt_assert_send<__VtF: ?::core::marker::Sized + ::core::marker::Send>(_: &__VtF) {}
        __vt_assert_send(&__vt_call);
        #receiver
        #(#params)*
    }
}

/// The same tokens, all at `span` (so a compiler error on them points at one
/// place of the user's code).
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tt| {
            if let proc_macro2::TokenTree::Group(g) = &tt {
                let mut group = proc_macro2::Group::new(g.delimiter(), respan(g.stream(), span));
                group.set_span(span);
                tt = proc_macro2::TokenTree::Group(group);
            } else {
                tt.set_span(span);
            }
            tt
        })
        .collect()
}

/// `name` with mixed-site hygiene (so no parameter can shadow the tool's own
/// name), raw if it was written raw (`r#type`: a keyword as a plain
/// identifier would not compile).
fn hygienic(name: &Ident) -> Ident {
    let plain = name.unraw().to_string();
    if name.to_string().starts_with("r#") {
        Ident::new_raw(&plain, Span::mixed_site())
    } else {
        Ident::new(&plain, Span::mixed_site())
    }
}

/// The same identifier (raw ones included: `Ident::new("r#type")` would
/// panic) at another span.
fn ident_at(ident: &Ident, span: Span) -> Ident {
    let mut ident = ident.clone();
    ident.set_span(span);
    ident
}
