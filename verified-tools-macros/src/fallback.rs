//! What is emitted next to the errors when the attribute is wrong, so that
//! one mistake yields one message: callers of the tool and of its descriptor
//! keep compiling against a stub with the entry point's signature.

use proc_macro2::TokenStream;
use quote::quote;

use crate::expand;
use crate::parse::ToolFn;
use crate::validate;

/// A stub of the entry point when the signature allows one, else the
/// function as written; and a placeholder descriptor in both cases.
pub(crate) fn expand(
    func: &ToolFn,
    verify: Option<&syn::Path>,
    verify_key: Option<bool>,
    classify: Option<&syn::Path>,
) -> TokenStream {
    let item = &func.item;
    let name = item.sig.ident.to_string();
    let spec = quote!(::verified_tools::ToolSpec::new(#name, ::verified_tools::SideEffect::High));
    let spec_fn = expand::descriptor_fn(func, &spec);
    let Some((ok, err)) = func.result.as_ref().filter(|_| validate::signature_ok(func)) else {
        return quote!(#spec_fn #item);
    };
    let attrs = &item.attrs;
    let vis = &item.vis;
    let ident = &item.sig.ident;
    let generics = &item.sig.generics;
    let where_clause = &generics.where_clause;
    let cx = expand::context_ident();
    let receiver = func.receiver.as_ref().map(|r| quote!(#r,));
    let params = expand::entry_params(func);
    // Keep the verifier, the classifier and the key type used (and checked),
    // so that they add no "never used" warnings to the error.
    let verifier = verify.map(|path| {
        let closure = expand::verifier(func, path, ok, verify_key);
        quote!(let _ = #closure;)
    });
    let classifier = classify.map(|path| expand::classify_fn(path, err, &quote!(_)));
    let key_ty = func.params.iter().filter(|p| !p.is_argument()).map(|p| {
        let ty = &p.ty;
        quote!(let _: ::core::option::Option<#ty> = ::core::option::Option::None;)
    });
    quote! {
        #spec_fn

        #(#attrs)*
        #[allow(unused_variables, unreachable_code, clippy::unused_async)]
        #vis async fn #ident #generics (#receiver #cx: &::verified_tools::Context, #(#params),*)
            -> ::verified_tools::ToolResult<#ok, #err>
        #where_clause
        {
            #verifier
            #classifier
            #(#key_ty)*
            ::core::unimplemented!("#[verified_tool] could not expand: see the error above")
        }
    }
}
