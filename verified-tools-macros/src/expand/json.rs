//! The entry points a tool gets from JSON: `<name>_json` (`json = true`),
//! which reads the key-relevant arguments from an LLM's tool call, and
//! `<name>_tool` (`schema = true`), the tool for a `ToolSet` with the JSON
//! Schema of those arguments. Apart because they are items of their own
//! beside the entry point, which they only call: nothing in it depends on
//! them.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::Ident;
use syn::ext::IdentExt as _;

use super::{context_ident, hygienic, spec_fn_ident};
use crate::parse;
use crate::validate::Tool;

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
pub(super) fn json_entry(tool: &Tool) -> TokenStream {
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
pub(super) fn schema_items(tool: &Tool, schema_span: Span) -> TokenStream {
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
