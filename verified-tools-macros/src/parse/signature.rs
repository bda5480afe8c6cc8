//! The function the attribute is on, read into its parts: the receiver, the
//! typed parameters (and which of them the wrapper fills in), the `Result`'s
//! two types; and the type helpers the later stages share (the token an
//! error points at, a type written out for a message). Apart because it
//! reads Rust as the user wrote it, where the rest of parsing reads the
//! attribute's own small language.

use proc_macro2::{Delimiter, Span, TokenStream, TokenTree};
use syn::spanned::Spanned as _;
use syn::{
    Attribute, FnArg, GenericArgument, Ident, ItemFn, Pat, PathArguments, Receiver, ReturnType,
    Token, Type,
};

/// The function the attribute is on, split into the parts the expansion
/// needs. Nothing here is judged yet (see `validate.rs`).
pub(crate) struct ToolFn {
    /// The function as the user wrote it.
    pub item: ItemFn,
    /// `self`, `&self`, ...
    pub receiver: Option<Receiver>,
    /// The typed parameters, in order.
    pub params: Vec<FnParam>,
    /// `(T, E)` of a `Result<T, E>` return type.
    pub result: Option<(Type, Type)>,
}

/// One typed parameter.
pub(crate) struct FnParam {
    pub attrs: Vec<Attribute>,
    pub pat: Pat,
    /// The binding, when the pattern is a plain `name` or `mut name`.
    pub ident: Option<Ident>,
    pub ty: Type,
    /// What the wrapper passes to it, if the caller does not.
    pub injected: Option<Injected>,
}

/// A parameter the wrapper fills in, recognised by its type's last path
/// segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Injected {
    /// `IdempotencyKey`: the call's key.
    Key,
    /// `Deadline`: the attempt's deadline.
    Deadline,
    /// `Holder`: the call's hold on its ledger record.
    Holder,
    /// `&Tx<'_>`: the attempt's transaction, of a `transactional` tool only
    /// (another tool's `Tx` is the user's own type).
    Tx,
}

impl Injected {
    /// The type's name.
    pub(crate) fn type_name(self) -> &'static str {
        match self {
            Injected::Key => "IdempotencyKey",
            Injected::Deadline => "Deadline",
            Injected::Holder => "Holder",
            Injected::Tx => "Tx",
        }
    }
}

impl FnParam {
    /// Whether the caller passes it (it is not filled in by the wrapper).
    pub(crate) fn is_argument(&self) -> bool {
        self.injected.is_none()
    }

    /// Whether the type is a shared reference `&T` (lent as is, never cloned).
    pub(crate) fn is_shared_ref(&self) -> bool {
        matches!(peel(&self.ty), Type::Reference(r) if r.mutability.is_none())
    }

    /// The `&mut` of a `&mut T` type.
    pub(crate) fn mut_ref(&self) -> Option<Span> {
        match peel(&self.ty) {
            Type::Reference(r) => r.mutability.map(|m| m.span),
            _ => None,
        }
    }

    /// The `mut` of a `mut name` pattern.
    pub(crate) fn mutability(&self) -> Option<Token![mut]> {
        match &self.pat {
            Pat::Ident(p) => p.mutability,
            _ => None,
        }
    }
}

/// Splits the function into its parts.
pub(crate) fn tool_fn(item: ItemFn) -> ToolFn {
    let mut receiver = None;
    let mut params = Vec::new();
    for arg in &item.sig.inputs {
        match arg {
            FnArg::Receiver(r) => receiver = Some(r.clone()),
            FnArg::Typed(typed) => {
                let ident = match &*typed.pat {
                    Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => {
                        Some(p.ident.clone())
                    }
                    _ => None,
                };
                params.push(FnParam {
                    attrs: typed.attrs.clone(),
                    pat: (*typed.pat).clone(),
                    ident,
                    ty: (*typed.ty).clone(),
                    injected: injected(&typed.ty),
                });
            }
        }
    }
    let result = match &item.sig.output {
        ReturnType::Type(_, ty) => result_args(ty),
        ReturnType::Default => None,
    };
    ToolFn { item, receiver, params, result }
}

/// Strips parentheses and invisible groups around a type.
pub(crate) fn peel(ty: &Type) -> &Type {
    match ty {
        Type::Paren(p) => peel(&p.elem),
        Type::Group(g) => peel(&g.elem),
        other => other,
    }
}

/// What the wrapper fills a parameter of this type with, if anything: a path
/// whose last segment is `IdempotencyKey`, `Deadline` or `Holder`.
fn injected(ty: &Type) -> Option<Injected> {
    let Type::Path(p) = peel(ty) else { return None };
    let last = &p.path.segments.last()?.ident;
    [Injected::Key, Injected::Deadline, Injected::Holder]
        .into_iter()
        .find(|i| last == i.type_name())
}

/// `(T, E)` when the type is written `Result<T, E>` (any path ending so).
fn result_args(ty: &Type) -> Option<(Type, Type)> {
    let Type::Path(p) = peel(ty) else { return None };
    if p.qself.is_some() {
        return None;
    }
    let last = p.path.segments.last()?;
    if last.ident != "Result" {
        return None;
    }
    let PathArguments::AngleBracketed(generic) = &last.arguments else { return None };
    let mut types = generic.args.iter().filter_map(|arg| match arg {
        GenericArgument::Type(ty) => Some(ty.clone()),
        _ => None,
    });
    match (types.next(), types.next(), types.next()) {
        (Some(ok), Some(err), None) => Some((ok, err)),
        _ => None,
    }
}

/// The one token of a type that a compiler error should point at: the name
/// in the last path segment (`Crm` in `&Crm`, `Vec` in `Vec<u8>`), else the
/// first token. (A `quote_spanned!` span is a single token on stable.)
pub(crate) fn focus_span(ty: &Type) -> Span {
    match peel(ty) {
        Type::Reference(r) => focus_span(&r.elem),
        Type::Path(p) => p.path.segments.last().map_or_else(|| ty.span(), |s| s.ident.span()),
        other => other.span(),
    }
}

/// The description of the tool: the doc comment, trimmed.
pub(crate) fn doc_comment(attrs: &[Attribute]) -> String {
    let mut lines = Vec::new();
    for attr in attrs {
        if !attr.path().is_ident("doc") {
            continue;
        }
        if let syn::Meta::NameValue(nv) = &attr.meta
            && let syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) = &nv.value
        {
            let value = s.value();
            lines.push(value.strip_prefix(' ').unwrap_or(&value).trim_end().to_owned());
        }
    }
    while lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    while lines.first().is_some_and(|l| l.is_empty()) {
        lines.remove(0);
    }
    lines.join("\n")
}

/// A type as a compact string: `&str`, `Vec<u8>`, `Option<&'a T>`.
pub(crate) fn type_string(ty: &Type) -> String {
    let mut out = String::new();
    write_tokens(&quote::ToTokens::to_token_stream(ty), &mut out);
    out.replace("->", " -> ")
}

fn write_tokens(tokens: &TokenStream, out: &mut String) {
    for tt in tokens.clone() {
        match tt {
            TokenTree::Group(g) => {
                let (open, close) = match g.delimiter() {
                    Delimiter::Parenthesis => ("(", ")"),
                    Delimiter::Bracket => ("[", "]"),
                    Delimiter::Brace => ("{ ", " }"),
                    Delimiter::None => ("", ""),
                };
                out.push_str(open);
                write_tokens(&g.stream(), out);
                out.push_str(close);
            }
            TokenTree::Punct(p) => {
                let c = p.as_char();
                match c {
                    ',' | ';' => out.push_str(&format!("{c} ")),
                    '+' | '=' => {
                        if !out.ends_with(' ') {
                            out.push(' ');
                        }
                        out.push_str(&format!("{c} "));
                    }
                    _ => out.push(c),
                }
            }
            TokenTree::Ident(i) => {
                let word = i.to_string();
                let prev_word = out.ends_with(|c: char| c.is_alphanumeric() || c == '_');
                if prev_word {
                    out.push(' ');
                }
                out.push_str(&word);
                if matches!(word.as_str(), "dyn" | "impl" | "mut") {
                    out.push(' ');
                }
            }
            TokenTree::Literal(l) => out.push_str(&l.to_string()),
        }
    }
    let trimmed = out.trim_end().len();
    out.truncate(trimmed);
}
