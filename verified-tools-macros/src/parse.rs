//! Parsing: the attribute's arguments and the function's signature into typed
//! nodes that keep the user's tokens (and so their spans) for later errors.
//!
//! Parsing judges only the *form* of each argument (`retries` takes an
//! integer, `skip` a list of names); whether the arguments make sense
//! together, and with the function, is decided in `validate.rs`. Every
//! problem is recorded in the [`Ctxt`] and parsing goes on, so the user sees
//! all of them at once.

use proc_macro2::{Delimiter, Span, TokenStream, TokenTree};
use syn::ext::IdentExt as _;
use syn::parse::{ParseStream, Parser as _};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned as _;
use syn::{
    Attribute, FnArg, GenericArgument, Ident, ItemFn, LitBool, LitInt, LitStr, Pat, PathArguments,
    Receiver, ReturnType, Token, Type,
};

use crate::ctxt::Ctxt;

/// Every argument the attribute accepts, in the order the docs list them.
pub(crate) const ARGUMENTS: &[&str] = &[
    "side_effect",
    "effect",
    "verify",
    "classify",
    "retries",
    "timeout",
    "call_timeout",
    "settle",
    "bucket",
    "name",
    "skip",
    "secret",
    "key",
    "verify_response",
    "verify_key",
    "send",
    "json",
    "schema",
    "params",
    "transactional",
];

/// The effect kinds, as written in `effect = "..."`.
pub(crate) const EFFECT_KINDS: &[&str] = &["additive", "overwrite", "delete"];

/// The side-effect classes, as written in `side_effect = "..."`.
pub(crate) const CLASSES: &[&str] = &["none", "low", "high", "irreversible"];

/// A side-effect class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    None,
    Low,
    High,
    Irreversible,
}

impl Class {
    fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "none" => Class::None,
            "low" => Class::Low,
            "high" => Class::High,
            "irreversible" => Class::Irreversible,
            _ => return None,
        })
    }

    /// The variant of `verified_tools::SideEffect`.
    pub(crate) fn variant(self) -> &'static str {
        match self {
            Class::None => "None",
            Class::Low => "Low",
            Class::High => "High",
            Class::Irreversible => "Irreversible",
        }
    }

    pub(crate) fn requires_verifier(self) -> bool {
        matches!(self, Class::High | Class::Irreversible)
    }
}

/// `side_effect = "high"`.
pub(crate) struct SideEffectArg {
    pub class: Class,
    pub lit: LitStr,
}

/// `timeout = "2s"`, `settle = "2s"` or `bucket = "5m"`, in milliseconds.
pub(crate) struct DurationArg {
    pub millis: u64,
    /// The literal's span.
    pub span: proc_macro2::Span,
}

/// `skip(a, b)` or `secret(a)`: the names, as written.
pub(crate) struct NameList {
    pub names: Vec<Ident>,
}

/// `params(a = "..", b = "..")`: one description per parameter.
pub(crate) struct ParamDocs {
    /// The `params` keyword.
    pub key: Ident,
    pub docs: Vec<(Ident, LitStr)>,
}

/// The attribute's arguments, each keeping its tokens for spans.
#[derive(Default)]
pub(crate) struct Args {
    /// Whether `side_effect` was written at all (even with a bad value).
    pub side_effect_given: bool,
    pub side_effect: Option<SideEffectArg>,
    /// `effect = "overwrite"`: the variant of `verified_tools::EffectKind`.
    pub effect: Option<&'static str>,
    pub verify: Option<syn::Path>,
    pub classify: Option<syn::Path>,
    pub retries: Option<u32>,
    pub timeout: Option<DurationArg>,
    pub call_timeout: Option<DurationArg>,
    pub settle: Option<DurationArg>,
    pub bucket: Option<DurationArg>,
    pub name: Option<LitStr>,
    pub skip: Option<NameList>,
    pub secret: Option<NameList>,
    /// `key(order)`: the effect identity.
    pub key: Option<NameList>,
    pub verify_response: Option<LitBool>,
    pub verify_key: Option<LitBool>,
    pub send: Option<LitBool>,
    pub json: Option<LitBool>,
    pub schema: Option<LitBool>,
    pub params: Option<ParamDocs>,
    /// `transactional`: the effect is rows in the ledger's PostgreSQL
    /// database, committed with the call's record.
    pub transactional: Option<LitBool>,
}

/// One argument before interpretation: `key`, `key = tokens` or `key(tokens)`.
struct RawArg {
    key: Ident,
    value: RawValue,
}

enum RawValue {
    Flag,
    Eq(TokenStream),
    List(TokenStream),
}

/// Splits the attribute's tokens into `key [= value | (list)]` items.
///
/// Only a malformed list (no key, a stray token) stops parsing; any problem
/// inside one argument is recorded and the next argument is still read.
fn raw_args(input: ParseStream) -> syn::Result<Vec<RawArg>> {
    let mut args = Vec::new();
    while !input.is_empty() {
        let key = input.call(Ident::parse_any).map_err(|e| {
            syn::Error::new(
                e.span(),
                format!(
                    "expected an argument name such as `side_effect = \"high\"`; \
                     the arguments are: {}",
                    list(ARGUMENTS)
                ),
            )
        })?;
        let value = if input.peek(Token![=]) {
            input.parse::<Token![=]>()?;
            let mut tokens = TokenStream::new();
            while !input.is_empty() && !input.peek(Token![,]) {
                tokens.extend([input.parse::<TokenTree>()?]);
            }
            if tokens.is_empty() {
                return Err(input.error(format!("expected a value after `{key} =`")));
            }
            RawValue::Eq(tokens)
        } else if input.peek(syn::token::Paren) {
            let content;
            syn::parenthesized!(content in input);
            RawValue::List(content.parse()?)
        } else {
            RawValue::Flag
        };
        args.push(RawArg { key, value });
        if input.is_empty() {
            break;
        }
        input.parse::<Token![,]>().map_err(|e| {
            syn::Error::new(
                e.span(),
                "expected `,` between arguments, or `=` after an argument name",
            )
        })?;
    }
    Ok(args)
}

/// Parses the attribute's arguments, recording every problem in `cx`.
pub(crate) fn args(tokens: TokenStream, cx: &Ctxt) -> Args {
    let mut args = Args::default();
    let raw = match raw_args.parse2(tokens) {
        Ok(raw) => raw,
        Err(e) => {
            cx.push(e);
            return args;
        }
    };
    let mut seen: Vec<String> = Vec::new();
    for RawArg { key, value } in raw {
        let name = key.unraw().to_string();
        if !ARGUMENTS.contains(&name.as_str()) {
            let hint = suggest(&name, ARGUMENTS)
                .map(|s| format!("did you mean `{s}`? "))
                .unwrap_or_default();
            cx.error(
                key.span(),
                format!("unknown argument `{name}`; {hint}expected one of: {}", list(ARGUMENTS)),
            );
            continue;
        }
        if seen.contains(&name) {
            let fix = if matches!(name.as_str(), "skip" | "secret" | "key") {
                format!("list all names in one `{name}(a, b)`")
            } else {
                "remove one of them".to_owned()
            };
            cx.error(
                key.span(),
                format!("duplicate argument `{name}`: it is already given above; {fix}"),
            );
            continue;
        }
        seen.push(name.clone());
        match name.as_str() {
            "side_effect" => {
                args.side_effect_given = true;
                if let Some(lit) = string_value(&key, value, "side_effect = \"high\"", cx) {
                    let written = lit.value();
                    match Class::from_name(&written) {
                        Some(class) => args.side_effect = Some(SideEffectArg { class, lit }),
                        None => {
                            let hint = suggest(&written, CLASSES)
                                .map(|s| format!("did you mean \"{s}\"? "))
                                .unwrap_or_default();
                            cx.error(
                                lit.span(),
                                format!(
                                    "unknown side effect \"{written}\"; {hint}expected one of: \
                                     \"none\", \"low\", \"high\", \"irreversible\""
                                ),
                            );
                        }
                    }
                }
            }
            "effect" => {
                if let Some(lit) = string_value(&key, value, "effect = \"overwrite\"", cx) {
                    let written = lit.value();
                    match written.as_str() {
                        "additive" => args.effect = Some("Additive"),
                        "overwrite" => args.effect = Some("Overwrite"),
                        "delete" => args.effect = Some("Delete"),
                        _ => {
                            let hint = suggest(&written, EFFECT_KINDS)
                                .map(|s| format!("did you mean \"{s}\"? "))
                                .unwrap_or_default();
                            cx.error(
                                lit.span(),
                                format!(
                                    "unknown effect \"{written}\"; {hint}expected one of: \
                                     \"additive\" (adds, changes nothing there), \"overwrite\" \
                                     (replaces a value), \"delete\" (removes)"
                                ),
                            );
                        }
                    }
                }
            }
            "verify" => {
                if let Some(tokens) = eq_value(&key, value, "verify = check_fn", cx) {
                    match syn::parse2::<syn::Path>(tokens.clone()) {
                        Ok(path) => args.verify = Some(path),
                        Err(_) => cx.error_spanned(
                            tokens,
                            "expected the path of the verifier function, e.g. `verify = check_activated`",
                        ),
                    }
                }
            }
            "classify" => {
                if let Some(tokens) = eq_value(&key, value, "classify = classify_fn", cx) {
                    match syn::parse2::<syn::Path>(tokens.clone()) {
                        Ok(path) => args.classify = Some(path),
                        Err(_) => cx.error_spanned(
                            tokens,
                            "expected the path of a function `fn(&E) -> ErrorClass`, e.g. \
                             `classify = classify_http`",
                        ),
                    }
                }
            }
            "retries" => {
                if let Some(tokens) = eq_value(&key, value, "retries = 2", cx) {
                    match syn::parse2::<LitInt>(tokens.clone()).and_then(|lit| lit.base10_parse::<u32>()) {
                        Ok(n) => args.retries = Some(n),
                        Err(_) => cx.error_spanned(
                            tokens,
                            "expected the number of retries after the first attempt, e.g. `retries = 2`",
                        ),
                    }
                }
            }
            "timeout" => {
                if let Some(lit) = string_value(&key, value, "timeout = \"2s\"", cx) {
                    args.timeout = duration(&lit, "timeout", cx);
                }
            }
            "call_timeout" => {
                if let Some(lit) = string_value(&key, value, "call_timeout = \"60s\"", cx) {
                    args.call_timeout = duration(&lit, "call_timeout", cx);
                }
            }
            "settle" => {
                if let Some(lit) = string_value(&key, value, "settle = \"2s\"", cx) {
                    args.settle = duration(&lit, "settle", cx);
                }
            }
            "bucket" => {
                if let Some(lit) = string_value(&key, value, "bucket = \"5m\"", cx) {
                    args.bucket = duration(&lit, "bucket", cx);
                }
            }
            "name" => {
                if let Some(lit) = string_value(&key, value, "name = \"activate_customer\"", cx) {
                    if lit.value().trim().is_empty() {
                        cx.error(
                            lit.span(),
                            "the tool name must not be empty; remove `name` to use the fn name",
                        );
                    } else {
                        args.name = Some(lit);
                    }
                }
            }
            "skip" | "secret" | "key" => {
                let list = name_list(&key, value, cx);
                match name.as_str() {
                    "skip" => args.skip = list,
                    "secret" => args.secret = list,
                    _ => args.key = list,
                }
            }
            "params" => args.params = param_docs(&key, value, cx),
            "verify_response" | "verify_key" | "send" | "json" | "schema" | "transactional" => {
                let example = format!("{name} = true");
                // A bare flag is `true`, as tracing's `err` and `ret` are.
                let value = match value {
                    RawValue::Flag => RawValue::Eq(quote::quote_spanned!(key.span()=> true)),
                    other => other,
                };
                if let Some(tokens) = eq_value(&key, value, &example, cx) {
                    match syn::parse2::<LitBool>(tokens.clone()) {
                        Ok(lit) if name == "send" => args.send = Some(lit),
                        Ok(lit) if name == "verify_key" => args.verify_key = Some(lit),
                        Ok(lit) if name == "json" => args.json = Some(lit),
                        Ok(lit) if name == "schema" => args.schema = Some(lit),
                        Ok(lit) if name == "transactional" => args.transactional = Some(lit),
                        Ok(lit) => args.verify_response = Some(lit),
                        Err(_) => cx.error_spanned(
                            tokens,
                            format!("expected `true` or `false`, e.g. `{example}`"),
                        ),
                    }
                }
            }
            // Every name of ARGUMENTS is handled above.
            _ => {}
        }
    }
    args
}

/// The tokens after `key =`, or an error saying how to write the argument.
fn eq_value(key: &Ident, value: RawValue, example: &str, cx: &Ctxt) -> Option<TokenStream> {
    match value {
        RawValue::Eq(tokens) => Some(tokens),
        RawValue::Flag | RawValue::List(_) => {
            cx.error(key.span(), format!("`{key}` takes a value: write `{example}`"));
            None
        }
    }
}

/// A string literal after `key =`.
fn string_value(key: &Ident, value: RawValue, example: &str, cx: &Ctxt) -> Option<LitStr> {
    let tokens = eq_value(key, value, example, cx)?;
    match syn::parse2::<LitStr>(tokens.clone()) {
        Ok(lit) => Some(lit),
        Err(_) => {
            cx.error_spanned(tokens, format!("expected a string literal: write `{example}`"));
            None
        }
    }
}

/// `key(a, b)`: a list of parameter names.
fn name_list(key: &Ident, value: RawValue, cx: &Ctxt) -> Option<NameList> {
    let RawValue::List(tokens) = value else {
        cx.error(
            key.span(),
            format!("`{key}` takes a list of parameter names: write `{key}(a, b)`"),
        );
        return None;
    };
    let parser = Punctuated::<Ident, Token![,]>::parse_terminated;
    match parser.parse2(tokens) {
        Ok(names) if names.is_empty() => {
            cx.error(
                key.span(),
                format!("`{key}()` names no parameter: remove it or write `{key}(a, b)`"),
            );
            None
        }
        Ok(names) => Some(NameList { names: names.into_iter().collect() }),
        Err(e) => {
            cx.error(
                e.span(),
                format!("expected parameter names separated by commas: write `{key}(a, b)`"),
            );
            None
        }
    }
}

/// `params(a = "..", b = "..")`: a description per parameter name.
fn param_docs(key: &Ident, value: RawValue, cx: &Ctxt) -> Option<ParamDocs> {
    const HOW: &str = "write `params(customer = \"The customer's id.\", note = \"..\")`";
    let RawValue::List(tokens) = value else {
        cx.error(key.span(), format!("`params` takes a description per parameter: {HOW}"));
        return None;
    };
    // Errors point at the name whose description is missing or malformed
    // (the end of the list has no span of its own).
    let entry = |input: ParseStream| -> syn::Result<(Ident, LitStr)> {
        let name = input.call(Ident::parse_any)?;
        let at = |input: ParseStream| if input.is_empty() { name.span() } else { input.span() };
        if input.parse::<Option<Token![=]>>()?.is_none() {
            return Err(syn::Error::new(at(input), "expected `=`"));
        }
        let doc =
            input.parse::<LitStr>().map_err(|_| syn::Error::new(at(input), "expected a string"))?;
        Ok((name, doc))
    };
    let parser = |input: ParseStream| {
        Punctuated::<(Ident, LitStr), Token![,]>::parse_terminated_with(input, entry)
    };
    match parser.parse2(tokens) {
        Ok(docs) if docs.is_empty() => {
            cx.error(key.span(), format!("`params()` describes no parameter: remove it or {HOW}"));
            None
        }
        Ok(docs) => Some(ParamDocs { key: key.clone(), docs: docs.into_iter().collect() }),
        Err(e) => {
            cx.error(
                e.span(),
                format!("expected `name = \"description\"` pairs separated by commas: {HOW}"),
            );
            None
        }
    }
}

/// `"250ms"`, `"2s"`, `"5m"`, `"1h"` in milliseconds.
fn duration(lit: &LitStr, what: &str, cx: &Ctxt) -> Option<DurationArg> {
    let text = lit.value();
    let text = text.trim();
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let how = format!(
        "write a whole number followed by `ms`, `s`, `m` or `h`, e.g. `{what} = \"{}\"`",
        if what == "bucket" { "5m" } else { "2s" }
    );
    let Ok(number) = number.parse::<u64>() else {
        cx.error(lit.span(), format!("cannot read {what} \"{text}\": {how}"));
        return None;
    };
    let scale: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "" => {
            cx.error(lit.span(), format!("{what} \"{text}\" has no unit: {how}"));
            return None;
        }
        other => {
            cx.error(lit.span(), format!("unknown unit `{other}` in {what} \"{text}\": {how}"));
            return None;
        }
    };
    let Some(millis) = number.checked_mul(scale) else {
        cx.error(lit.span(), format!("{what} \"{text}\" is too long"));
        return None;
    };
    if millis == 0 {
        cx.error(lit.span(), format!("{what} must be longer than zero: {how}"));
        return None;
    }
    Some(DurationArg { millis, span: lit.span() })
}

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

/// `` `a`, `b`, `c` ``.
pub(crate) fn list(names: &[&str]) -> String {
    names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
}

/// The closest of `candidates` to `word`, if it is a plausible typo.
pub(crate) fn suggest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    candidates
        .iter()
        .map(|c| (levenshtein(word, c), *c))
        .filter(|(d, c)| *d <= (c.len() / 2).max(1) && *d < word.len())
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Optimal string alignment distance: edits, with a swap of two neighbours
/// counting as one (`hihg` is one step from `high`).
fn levenshtein(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1).min(d[i][j - 1] + 1).min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}
