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

/// `json = true`: `<name>_json(cx, <skipped params>, &Value)`, which takes
/// the key-relevant arguments from a JSON object (an LLM's tool call) and
/// calls the entry point.
///
/// Each field is deserialized on its own (`__private::json_field`, checked
/// for `Deserialize` on the parameter's type), into a local with mixed-site
/// hygiene (so no parameter can shadow the tool's name), with the type as
/// written: borrowed types (`&str`, `Option<&str>`) borrow from the JSON;
/// `&[T]` arrives as `Vec<T>` and other `&T` as `T`, lent to the call.
/// Errors of `secret` fields never quote the value. Every refusal is
/// recorded (audit trail, tracing) before it is returned.
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
    let spec = Ident::new("__vt_spec", Span::mixed_site());
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
        // Spanned on the type: a type that does not deserialize is one
        // error, there.
        let read = quote_spanned!(parse::focus_span(ty)=> ::verified_tools::__private::json_field::<#read_ty>);
        reads.push(quote! {
            let #local: #read_ty = #read(#cx, #spec, #object, #field, #secret)?;
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
         field, before anything is dispatched (and recorded as a refused call)."
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
            let #spec: &'static ::verified_tools::ToolSpec = #spec_path;
            let #object =
                ::verified_tools::__private::json_object(#cx, #spec, #arguments, &[#(#known),*])?;
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
        // Checked on the type: a type without a schema is one error, there
        // (and its property a stand-in).
        let check = quote_spanned! {parse::focus_span(&p.ty)=>
            ::verified_tools::__private::schema_argument::<#read_ty>
        };
        properties.push(quote! {
            {
                #check();
                (&::verified_tools::__private::ArgumentProbe::<#read_ty>::new()).property(
                    &mut #generator,
                    #field,
                    #doc,
                    !(&::verified_tools::__private::NullProbe::<#read_ty>::new()).accepts_null(),
                )
            }
        });
    }
    let (spec_path, target) = match func.receiver {
        Some(_) => {
            bounds.insert(0, quote!(#has<Self>));
            (quote!(Self::#spec_fn()), quote!(<#state as #has<Self>>::get(#state_arg).#json_fn))
        }
        None => (quote!(#spec_fn()), quote!(#json_fn)),
    };
    // A value that does not serialize is one error, on its type (and its
    // outcome a stand-in).
    let outcome = Ident::new("__vt_outcome", Span::mixed_site());
    let check_value = quote_spanned! {parse::focus_span(ok)=>
        ::verified_tools::__private::schema_value::<#ok>
    };
    let to_outcome = quote! {
        #check_value();
        let #outcome = (&::verified_tools::__private::OutcomeProbe::<#ok, #err>::new()).outcome();
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
            use #schema::{WithOutputSchema as _, WithoutOutputSchema as _};
            #[allow(unused_imports)]
            use ::verified_tools::__private::{
                ReadsNoNull as _, ReadsNull as _, SerializeOutcome as _, UnserializableOutcome as _,
                WithArgumentSchema as _, WithoutArgumentSchema as _,
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
