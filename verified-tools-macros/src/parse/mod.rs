//! Parsing: the attribute's arguments and the function's signature into typed
//! nodes that keep the user's tokens (and so their spans) for later errors.
//!
//! Parsing judges only the *form* of each argument (`retries` takes an
//! integer, `skip` a list of names); whether the arguments make sense
//! together, and with the function, is decided in `validate.rs`. Every
//! problem is recorded in the [`Ctxt`] and parsing goes on, so the user sees
//! all of them at once.

mod signature;
mod suggest;

use proc_macro2::{TokenStream, TokenTree};
use syn::ext::IdentExt as _;
use syn::parse::{ParseStream, Parser as _};
use syn::punctuated::Punctuated;
use syn::{Ident, LitBool, LitInt, LitStr, Token};

pub(crate) use self::signature::{
    FnParam, Injected, ToolFn, doc_comment, focus_span, peel, tool_fn, type_string,
};
pub(crate) use self::suggest::{list, suggest};
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
