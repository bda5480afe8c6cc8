//! Code generation for a checked [`Tool`]. Nothing here reports errors: the
//! compiler's own errors are steered onto the user's tokens with
//! `quote_spanned!` (the verifier path, a parameter's type, the return type,
//! the fn name).

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::Ident;
use syn::ext::IdentExt as _;
use syn::spanned::Spanned as _;

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

    // The key-relevant parameters (not skipped, not the key), each borrowed
    // once through the Serialize check spanned on its type.
    let key_params: Vec<(&Ident, &syn::Type, bool)> = tool
        .func
        .params
        .iter()
        .enumerate()
        .filter(|(i, p)| p.is_argument() && !tool.skipped[*i])
        .filter_map(|(i, p)| Some((p.ident.as_ref()?, &p.ty, tool.secret[i])))
        .collect();
    let key_vars: Vec<Ident> = key_params
        .iter()
        .map(|(name, _, _)| Ident::new(&format!("__vt_{}", name.unraw()), Span::mixed_site()))
        .collect();
    let key_check = if key_params.is_empty() {
        TokenStream::new()
    } else {
        quote! {
            trait __VtKeyParameter {
                fn key_parameter_must_be_serialize_or_skipped(&self) -> &Self {
                    self
                }
            }
            impl<__VtT: ?::core::marker::Sized + ::verified_tools::__private::Serialize> __VtKeyParameter
                for __VtT
            {
            }
        }
    };
    let key_borrows = key_params.iter().zip(&key_vars).map(|((name, ty, _), var)| {
        let span = parse::focus_span(ty);
        let name = ident_at(name, span);
        quote_spanned! {span=>
            let #var = #name.key_parameter_must_be_serialize_or_skipped();
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

    let dispatch = dispatch(tool);
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
    let await_call = quote_spanned!(err_span=> __vt_call.await);
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
            #key_check
            #(#key_borrows)*
            let __vt_payload = (#(#key_vars,)*);
            #[derive(::verified_tools::__private::Serialize)]
            #[serde(crate = "::verified_tools::__private::serde")]
            struct __VtArgs #audit_generics {
                #(#audit_fields: #audit_types,)*
            }
            let __vt_args = __VtArgs { #(#audit_fields: #audit_values,)* };
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

/// `json = true`: `<name>_json(cx, <skipped params>, &Value)`, which takes
/// the key-relevant arguments from a JSON object (an LLM's tool call) and
/// calls the entry point.
///
/// Each field is deserialized on its own, into a local with mixed-site
/// hygiene (so no parameter can shadow the tool's name), with the type as
/// written: borrowed types (`&str`, `Option<&str>`) borrow from the JSON;
/// `&[T]` arrives as `Vec<T>` and other `&T` as `T`, lent to the call.
/// Errors of `secret` fields never quote the value.
fn json_entry(tool: &Tool) -> TokenStream {
    let func = &tool.func;
    let vis = &func.item.vis;
    let ident = &func.item.sig.ident;
    let cfgs = func.item.attrs.iter().filter(|a| a.path().is_ident("cfg"));
    let json_fn = Ident::new(&format!("{}_json", ident.unraw()), ident.span());
    let (ok, err) = (&tool.ok, &tool.err);
    let cx = context_ident();
    let receiver = func.receiver.as_ref().map(|r| quote!(#r,));
    let arguments = Ident::new("arguments", Span::mixed_site());
    let object = Ident::new("__vt_object", Span::mixed_site());
    let spec_fn = spec_fn_ident(func);
    let spec_path = match func.receiver {
        Some(_) => quote!(Self::#spec_fn()),
        None => quote!(#spec_fn()),
    };
    let mut params = Vec::new();
    let mut reads = Vec::new();
    let mut call_args = Vec::new();
    let mut known = Vec::new();
    for (i, p) in func.params.iter().enumerate() {
        let Some(name) = p.ident.as_ref().filter(|_| p.is_argument()) else { continue };
        let local = hygienic(name);
        let ty = &p.ty;
        if tool.skipped[i] {
            params.push(quote!(#local: #ty));
            call_args.push(quote!(#local));
            continue;
        }
        let field = name.unraw().to_string();
        known.push(field.clone());
        let (read_ty, lent) = read_type(ty);
        let secret = tool.secret[i];
        reads.push(quote! {
            let #local: #read_ty = match #object.get(#field) {
                ::core::option::Option::Some(value) => {
                    ::verified_tools::__private::args::check_depth(#spec_path.name, #field, value)?;
                    ::verified_tools::__private::Deserialize::deserialize(value).map_err(|e| {
                        ::verified_tools::__private::args::field_error(#spec_path.name, #field, &e, #secret)
                    })?
                }
                // Absent reads as null: an `Option` is then `None`.
                ::core::option::Option::None => {
                    ::verified_tools::__private::Deserialize::deserialize(&__VT_NULL).map_err(|_| {
                        ::verified_tools::__private::args::missing_field(#spec_path.name, #field)
                    })?
                }
            };
        });
        call_args.push(if lent { quote!(&#local) } else { quote!(#local) });
    }
    let target = match func.receiver {
        Some(_) => quote!(self.#ident),
        None => quote!(#ident),
    };
    let doc = format!(
        " Calls [`{ident}`] with its key-relevant arguments taken from a JSON object, as an \
         LLM's tool call gives them; the skipped parameters are passed as Rust values. \
         Unknown, missing, ill-typed or too deeply nested fields are an `ArgsError` naming the \
         field, before anything is dispatched."
    );
    quote! {
        #(#cfgs)*
        #[doc = #doc]
        #[allow(dead_code)]
        #vis async fn #json_fn(
            #receiver
            #cx: &::verified_tools::Context,
            #(#params,)*
            #arguments: &::verified_tools::__private::serde_json::Value,
        ) -> ::core::result::Result<::verified_tools::ToolResult<#ok, #err>, ::verified_tools::ArgsError> {
            let ::core::option::Option::Some(#object) = #arguments.as_object() else {
                return ::core::result::Result::Err(
                    ::verified_tools::__private::args::not_an_object(#spec_path.name, #arguments),
                );
            };
            const __VT_KNOWN: &[&str] = &[#(#known),*];
            static __VT_NULL: ::verified_tools::__private::serde_json::Value =
                ::verified_tools::__private::serde_json::Value::Null;
            if let ::core::option::Option::Some(unknown) =
                #object.keys().find(|k| !__VT_KNOWN.contains(&k.as_str()))
            {
                return ::core::result::Result::Err(
                    ::verified_tools::__private::args::unknown_field(#spec_path.name, unknown, __VT_KNOWN),
                );
            }
            #(#reads)*
            ::core::result::Result::Ok(#target(#cx, #(#call_args),*).await)
        }
    }
}

/// The type a JSON field is read as: the parameter's type, except that
/// `&[T]` is read as `Vec<T>` and other `&T` (but `&str`) as `T`, then lent
/// to the call (`true`).
fn read_type(ty: &syn::Type) -> (TokenStream, bool) {
    match parse::peel(ty) {
        syn::Type::Reference(r) => match parse::peel(&r.elem) {
            syn::Type::Path(path) if path.path.is_ident("str") => (quote!(#ty), false),
            syn::Type::Slice(slice) => {
                let elem = &slice.elem;
                (quote!(::std::vec::Vec<#elem>), true)
            }
            elem => (quote!(#elem), true),
        },
        _ => (quote!(#ty), false),
    }
}

/// `schema = true`: `<name>_tool::<S>()`, the tool for a `ToolSet<S>`: its
/// descriptor, the JSON Schema of the arguments `<name>_json` takes, the
/// outcome's schema when the value type has one, and the call, which takes
/// the skipped parameters (or `&self`) from the state. Wrapped in
/// `schema_items!`, which says how to turn on the `schema` feature when it
/// is off.
fn schema_items(tool: &Tool, schema_span: Span) -> TokenStream {
    let func = &tool.func;
    let vis = &func.item.vis;
    let ident = &func.item.sig.ident;
    let cfgs = func.item.attrs.iter().filter(|a| a.path().is_ident("cfg"));
    let tool_fn = Ident::new(&format!("{}_tool", ident.unraw()), ident.span());
    let json_fn = Ident::new(&format!("{}_json", ident.unraw()), ident.span());
    let spec_fn = spec_fn_ident(func);
    let (ok, err) = (&tool.ok, &tool.err);
    let state = Ident::new("__VtS", Span::mixed_site());
    let has = quote!(::verified_tools::toolset::Has);
    let schema = quote!(::verified_tools::__private::schema);
    let generator = Ident::new("__vt_generator", Span::mixed_site());
    let (cx, state_arg, arguments) = (
        Ident::new("cx", Span::mixed_site()),
        Ident::new("state", Span::mixed_site()),
        Ident::new("arguments", Span::mixed_site()),
    );

    let mut bounds = Vec::new();
    let mut state_args = Vec::new();
    let mut properties = Vec::new();
    for (i, p) in func.params.iter().enumerate() {
        let Some(name) = p.ident.as_ref().filter(|_| p.is_argument()) else { continue };
        if tool.skipped[i] {
            let (part, lent) = match parse::peel(&p.ty) {
                syn::Type::Reference(r) => (&*r.elem, true),
                other => (other, false),
            };
            bounds.push(quote!(#has<#part>));
            let get = quote!(<#state as #has<#part>>::get(#state_arg));
            state_args.push(if lent {
                get
            } else {
                quote_spanned!(parse::focus_span(&p.ty)=> ::core::clone::Clone::clone(#get))
            });
            continue;
        }
        let field = name.unraw().to_string();
        let (read_ty, _) = read_type(&p.ty);
        let doc = match &tool.docs[i] {
            Some(lit) => quote!(::core::option::Option::Some(#lit)),
            None => quote!(::core::option::Option::None),
        };
        // Through `PhantomData`, spanned on the type: a type without a
        // schema is one error, there.
        let property = quote_spanned! {parse::focus_span(&p.ty)=>
            ::core::marker::PhantomData::<#read_ty>.argument_type_must_implement_json_schema
        };
        properties.push(quote! {
            #property(
                &mut #generator,
                #field,
                #doc,
                !#schema::accepts_null::<#read_ty>(),
            )
        });
    }
    let (spec_path, target) = match func.receiver {
        Some(_) => {
            bounds.insert(0, quote!(#has<Self>));
            (quote!(Self::#spec_fn()), quote!(<#state as #has<Self>>::get(#state_arg).#json_fn))
        }
        None => (quote!(#spec_fn()), quote!(#json_fn)),
    };
    // A value that does not serialize is one error, on its type.
    let outcome = Ident::new("__vt_outcome", Span::mixed_site());
    let to_outcome = quote_spanned! {parse::focus_span(ok)=>
        let #outcome = ::core::marker::PhantomData::<(#ok, #err)>.value_must_implement_serialize();
    };
    let ident_span = ident.span();
    let boxed = quote_spanned! {ident_span=>
        ::std::boxed::Box::pin(async move {
            #to_outcome
            match #target(#cx, #(#state_args,)* #arguments).await {
                ::core::result::Result::Ok(result) => #outcome(result),
                ::core::result::Result::Err(error) => {
                    ::verified_tools::toolset::ToolOutcome::invalid_arguments(&error)
                }
            }
        })
    };
    let doc = format!(
        " The `{ident}` verified tool for a [`ToolSet`](::verified_tools::toolset::ToolSet): its \
         descriptor, the JSON Schema of its arguments (and of its outcome, when the value type \
         has one) and its JSON entry point, for any state that \
         [`Has`](::verified_tools::toolset::Has) what the tool borrows."
    );
    let items = quote! {
        #(#cfgs)*
        #[doc = #doc]
        #[allow(dead_code)]
        #vis fn #tool_fn<#state>() -> ::verified_tools::toolset::ToolDef<#state>
        where
            #state: ?::core::marker::Sized
                + ::core::marker::Send
                + ::core::marker::Sync
                #(+ #bounds)*
        {
            #[allow(unused_imports)]
            use #schema::{
                ArgumentSchema as _, ValueOutcome as _, WithOutputSchema as _,
                WithoutOutputSchema as _,
            };
            ::verified_tools::toolset::ToolDef::new(
                #spec_path,
                || {
                    #[allow(unused_mut)]
                    let mut #generator = #schema::generator();
                    let properties = ::std::vec![#(#properties),*];
                    #schema::object(#generator, properties)
                },
                (&#schema::OutputProbe::<#ok>::new()).output_schema(),
                |#cx, #state_arg, #arguments| #boxed,
            )
        }
    };
    quote_spanned! {schema_span=>
        ::verified_tools::__private::schema_items! { #items }
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
            .with_params(&[#(#params),*])
    }
}

/// The per-attempt closure: clones owned parameters, binds the key, runs the
/// user's body in an `async move` block typed by the user's return type.
fn dispatch(tool: &Tool) -> TokenStream {
    let item = &tool.func.item;
    let block = &item.block;
    let ret = match &item.sig.output {
        syn::ReturnType::Type(_, ty) => quote!(#ty),
        syn::ReturnType::Default => quote!(()),
    };
    let rebinds = tool.func.params.iter().filter(|p| p.is_argument()).filter_map(|p| {
        let name = p.ident.as_ref()?;
        let mutability = p.is_mut().then(|| quote!(mut));
        if p.is_shared_ref() {
            // A shared reference is copied: no allocation.
            p.is_mut().then(|| quote!(let mut #name = #name;))
        } else {
            // Owned parameters are cloned per attempt (a no-op copy for
            // `Copy` types), spanned on the type so a missing `Clone`
            // lands there.
            Some(quote_spanned! {parse::focus_span(&p.ty)=>
                let #mutability #name = ::core::clone::Clone::clone(&#name);
            })
        }
    });
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
            };
            Some(quote!(let #pat: #ty = #attempt.#field;))
        })
        .collect();
    let attempt_arg = if bindings.is_empty() { quote!(_) } else { quote!(#attempt) };
    quote! {
        |#attempt_arg: ::verified_tools::engine::Attempt| {
            #(#rebinds)*
            async move {
                #(#bindings)*
                #[allow(
                    unknown_lints,
                    unreachable_code,
                    clippy::diverging_sub_expression,
                    clippy::empty_loop,
                    clippy::let_unit_value,
                    clippy::needless_return
                )]
                if false {
                    let __vt_type_of_body: #ret = loop {};
                    return __vt_type_of_body;
                }
                #block
            }
        }
    }
}

/// The verifier closure, its call spanned on the user's `verify = path` so a
/// signature mismatch, or a verdict of the wrong type, is reported there.
pub(crate) fn verifier(
    func: &ToolFn,
    path: &syn::Path,
    ok: &syn::Type,
    with_key: bool,
) -> TokenStream {
    let span = path.span();
    let is_method = func.receiver.is_some();
    let callee = if is_method && path.leading_colon.is_none() && path.segments.len() == 1 {
        quote_spanned!(span=> Self::#path)
    } else {
        quote!(#path)
    };
    let receiver = is_method.then(|| quote_spanned!(span=> self,));
    let args = func.params.iter().filter(|p| p.is_argument()).filter_map(|p| {
        let name = ident_at(p.ident.as_ref()?, span);
        Some(if p.is_shared_ref() {
            quote_spanned!(span=> #name)
        } else {
            quote_spanned!(span=> &#name)
        })
    });
    // Mixed-site hygiene, located at the path: errors on `__vt_read.await`
    // point at the user's path.
    let read = Ident::new("__vt_read", Span::mixed_site().located_at(span));
    let key = Ident::new("__vt_key", Span::mixed_site());
    let key_arg = with_key.then(|| quote_spanned!(span=> , #key));
    let call = quote_spanned!(span=> #callee(#receiver #(#args),* #key_arg));
    let ok = respan(quote!(#ok), span);
    let seen = Ident::new("__vt_seen", span);
    let verdict = quote_spanned!(span=> ::verified_tools::IntoVerdict::<#ok>::into_verdict(#seen));
    quote! {
        ::core::option::Option::Some(|#key: ::verified_tools::IdempotencyKey| {
            let #read = #call;
            async move {
                let #seen = #read.await;
                #verdict
            }
        })
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
