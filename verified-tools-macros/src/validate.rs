//! Validation: the rules a verified tool must follow, each reported once,
//! spanned on the token at fault, saying what to write instead.

use proc_macro2::Span;
use syn::ext::IdentExt as _;
use syn::{LitStr, ReceiverKind, Type};

use crate::ctxt::Ctxt;
use crate::parse::{self, Args, Class, Injected, NameList, ToolFn};

/// A checked tool: everything the expansion needs.
pub(crate) struct Tool {
    pub func: ToolFn,
    pub class: Class,
    /// `effect = ".."`: the variant of `verified_tools::EffectKind`.
    pub effect: Option<&'static str>,
    /// Action name in keys, audit and the descriptor.
    pub name: String,
    pub verify: Option<syn::Path>,
    /// `classify = path`: the tool's errors are classified by `path(&e)`
    /// instead of `E: Classify`.
    pub classify: Option<syn::Path>,
    pub retries: Option<u32>,
    pub timeout_ms: Option<u64>,
    pub call_timeout_ms: Option<u64>,
    pub settle_ms: Option<u64>,
    pub bucket_ms: Option<u64>,
    pub verify_response: Option<bool>,
    /// Whether the verifier receives the call's key as its last argument:
    /// `None` when the attribute does not say (the verifier's arity does).
    pub verify_key: Option<bool>,
    pub send: bool,
    /// Also generate `<name>_json`, taking the key-relevant arguments from JSON.
    pub json: bool,
    /// Also generate the arguments' JSON Schema and `<name>_tool()`, for a
    /// tool set: the span of `schema = true`.
    pub schema: Option<Span>,
    /// Per parameter of `func.params`: its description in the schema.
    pub docs: Vec<Option<LitStr>>,
    /// Per parameter of `func.params`: left out of the key and the audit.
    pub skipped: Vec<bool>,
    /// Per parameter of `func.params`: redacted in the audit.
    pub secret: Vec<bool>,
    /// Per parameter of `func.params`: part of the declared effect identity
    /// (`key(..)`); all `false` when none is declared.
    pub effect_key: Vec<bool>,
    /// `(T, E)` of the `Result<T, E>` return type.
    pub ok: Type,
    pub err: Type,
    /// `transactional`: called through `PostgresLedger::transact`, the
    /// parameter `&Tx<'_>` marked [`Injected::Tx`].
    pub transactional: bool,
}

/// Checks the arguments against each other and against the function.
/// Returns the tool only when no error was recorded, else the function back
/// for the fallback.
pub(crate) fn tool(args: Args, mut func: ToolFn, cx: &Ctxt) -> Result<Tool, Box<ToolFn>> {
    let transactional = args.transactional.as_ref().is_some_and(|l| l.value);
    if transactional {
        transactional_rules(&args, &mut func, cx);
    }
    let class = match &args.side_effect {
        Some(arg) => Some(arg.class),
        // Written with a bad value: already reported.
        None if args.side_effect_given => None,
        None => {
            cx.error(
                Span::call_site(),
                "missing `side_effect`: write `#[verified_tool(side_effect = \"high\", verify = check)]`; \
                 the classes are \"none\", \"low\", \"high\", \"irreversible\"",
            );
            None
        }
    };
    if let (Some(arg), None) = (&args.side_effect, &args.verify)
        && arg.class.requires_verifier()
        && !transactional
    {
        cx.error(
            arg.lit.span(),
            format!(
                "a \"{}\" tool must declare a postcondition verifier: add `verify = check_fn`, \
                 an async fn that takes the tool's parameters by shared reference and returns \
                 `Verdict<T>`; if a duplicate effect is harmless, declare `side_effect = \"low\"`",
                arg.lit.value()
            ),
        );
    }
    if let (Some(lit), None) = (&args.verify_response, &args.verify) {
        cx.error(
            lit.span,
            "`verify_response` needs a verifier to confirm responses with: add `verify = check_fn` \
             or remove `verify_response`",
        );
    }
    if let (Some(lit), None) = (&args.verify_key, &args.verify) {
        cx.error(
            lit.span,
            "`verify_key` passes the key to a verifier: add `verify = check_fn` \
             or remove `verify_key`",
        );
    }
    let generic = !func.item.sig.generics.params.is_empty();
    if let Some(lit) = args.json.as_ref().filter(|l| l.value && generic) {
        cx.error(
            lit.span,
            "`json = true` is not supported on generic functions: the JSON arguments need \
             concrete types; remove `json` or the generic parameters",
        );
    }
    let schema = args.schema.as_ref().filter(|l| l.value);
    if let Some(lit) = schema.filter(|_| generic) {
        cx.error(
            lit.span,
            "`schema = true` is not supported on generic functions: the JSON Schema needs \
             concrete types; remove `schema` or the generic parameters",
        );
    }
    if let (Some(_), Some(json)) = (schema, args.json.as_ref().filter(|l| !l.value)) {
        cx.error(
            json.span,
            "`schema = true` lists the tool with its `<name>_json` entry point: remove `json = false`",
        );
    }
    if let (None, Some(docs)) = (schema, &args.params) {
        cx.error(
            docs.key.span(),
            "`params(..)` describes the arguments in the tool's JSON Schema: add `schema = true`, \
             or remove `params`",
        );
    }
    signature(&func, cx);
    let skipped = names(&func, args.skip.as_ref(), "skip", cx);
    let docs = param_docs(&func, args.params.as_ref(), &skipped, cx);
    if schema.is_some() {
        listed_name(&func, args.name.as_ref(), cx);
        state_types(&func, &skipped, cx);
    }
    let secret = names(&func, args.secret.as_ref(), "secret", cx);
    if let Some(list) = &args.secret {
        for name in &list.names {
            let both =
                func.params.iter().zip(&skipped).any(|(p, s)| *s && p.ident.as_ref() == Some(name));
            if both {
                cx.error(
                    name.span(),
                    format!(
                        "`{name}` is skipped, and skipped parameters are never written to the audit: \
                         remove it from `secret(..)`"
                    ),
                );
            }
        }
    }
    let effect_key = names(&func, args.key.as_ref(), "key", cx);
    if let Some(list) = &args.key {
        for name in &list.names {
            let skipped_too =
                func.params.iter().zip(&skipped).any(|(p, s)| *s && p.ident.as_ref() == Some(name));
            if skipped_too {
                cx.error(
                    name.span(),
                    format!(
                        "`{name}` is skipped, so it is not an argument of the call and cannot name \
                         its action: remove it from `key(..)`, or from `skip(..)` if it is an argument"
                    ),
                );
            }
        }
    }
    let result = func.result.clone();
    match (class, result) {
        (Some(class), Some((ok, err))) if !cx.has_errors() => Ok(Tool {
            name: args
                .name
                .as_ref()
                .map_or_else(|| func.item.sig.ident.unraw().to_string(), LitStr::value),
            func,
            class,
            effect: args.effect,
            verify: args.verify,
            classify: args.classify,
            retries: args.retries,
            timeout_ms: args.timeout.map(|d| d.millis),
            call_timeout_ms: args.call_timeout.map(|d| d.millis),
            settle_ms: args.settle.map(|d| d.millis),
            bucket_ms: args.bucket.map(|d| d.millis),
            verify_response: args.verify_response.map(|l| l.value),
            verify_key: args.verify_key.map(|l| l.value),
            json: args.json.is_some_and(|l| l.value) || schema.is_some(),
            schema: schema.map(|l| l.span),
            docs,
            send: args.send.is_some_and(|l| l.value),
            skipped,
            secret,
            effect_key,
            ok,
            err,
            transactional,
        }),
        _ => Err(Box::new(func)),
    }
}

/// The rules of a `transactional` tool, and its `&Tx<'_>` parameter marked.
///
/// What it accepts: a free, non-generic `async fn` whose first parameter is
/// `tx: &Tx<'_>`, of class `low`, `high` or `irreversible`, with `key(..)`,
/// `skip`, `secret`, `name`, `retries`, `timeout` and `call_timeout`. What
/// it refuses, and why: a verifier (the record committed with the rows is
/// the proof; an effect outside the database is a tool of its own), a read
/// (`none`: nothing to commit), a settle margin (a commit is visible when it
/// answers), the key, deadline or holder as parameters (`tx.key()`; the
/// deadline is the transaction's `statement_timeout`), and the JSON, schema
/// and classify options (not built for this form yet).
fn transactional_rules(args: &Args, func: &mut ToolFn, cx: &Ctxt) {
    if let Some(arg) = args.side_effect.as_ref().filter(|a| a.class == Class::None) {
        cx.error(
            arg.lit.span(),
            "a read (`side_effect = \"none\"`) commits nothing: remove `transactional`",
        );
    }
    if let Some(path) = &args.verify {
        cx.error_spanned(
            path,
            "a transactional tool's proof is its ledger record, committed with its rows: remove \
             `verify`; an effect outside the database (a mail) is a tool of its own, with a verifier",
        );
    }
    if let Some(settle) = &args.settle {
        cx.error(
            settle.span,
            "a transactional tool's commit is visible when it answers: remove `settle`",
        );
    }
    let not_yet = [
        ("json", args.json.as_ref().map(|l| l.span)),
        ("schema", args.schema.as_ref().map(|l| l.span)),
        ("send", args.send.as_ref().map(|l| l.span)),
        ("classify", args.classify.as_ref().map(syn::spanned::Spanned::span)),
    ];
    for (option, span) in not_yet {
        if let Some(span) = span {
            cx.error(
                span,
                format!(
                    "`{option}` is not available with `transactional`: remove it (a \
                     transactional tool is called with its ledger and a client, and its call is \
                     always `Send`)"
                ),
            );
        }
    }
    if let Some(receiver) = &func.receiver {
        cx.error_spanned(receiver, "a transactional tool is a free fn: remove `self`");
    }
    if let Some(generics) = Some(&func.item.sig.generics).filter(|g| !g.params.is_empty()) {
        cx.error_spanned(generics, "a transactional tool cannot be generic: remove the parameters");
    }
    for param in &func.params {
        if let Some(injected) = param.injected {
            cx.error_spanned(
                &param.ty,
                format!(
                    "a transactional tool has no `{}` parameter: the call's key is `tx.key()`, and \
                     the attempt's deadline is its transaction's `statement_timeout`",
                    injected.type_name()
                ),
            );
        }
    }
    match func.params.first_mut() {
        Some(first) if is_tx(&first.ty) => first.injected = Some(Injected::Tx),
        _ => cx.error(
            func.item.sig.ident.span(),
            format!(
                "a transactional tool takes its transaction first: write \
                 `async fn {}(tx: &Tx<'_>, ..)` (`verified_tools::ledger::Tx`)",
                func.item.sig.ident
            ),
        ),
    }
}

/// `&Tx<..>` (any path ending so).
fn is_tx(ty: &Type) -> bool {
    match parse::peel(ty) {
        Type::Reference(r) if r.mutability.is_none() => match parse::peel(&r.elem) {
            Type::Path(p) => p.path.segments.last().is_some_and(|s| s.ident == "Tx"),
            _ => false,
        },
        _ => false,
    }
}

/// Whether the signature allows a stub of the entry point.
pub(crate) fn signature_ok(func: &ToolFn) -> bool {
    let cx = Ctxt::default();
    signature(func, &cx);
    !cx.has_errors()
}

/// The rules on the function itself.
fn signature(func: &ToolFn, cx: &Ctxt) {
    let sig = &func.item.sig;
    if let Some(constness) = &sig.constness {
        cx.error(constness.span, "a verified tool cannot be a `const fn`: remove `const`");
    }
    if sig.asyncness.is_none() {
        cx.error(
            sig.fn_token.span,
            format!(
                "#[verified_tool] needs an `async fn`: write `async fn {}(..)`; the wrapper awaits \
                 the body once per attempt",
                sig.ident
            ),
        );
    }
    if let syn::Safety::Unsafe(token) = &sig.safety {
        cx.error(token.span, "a verified tool cannot be an `unsafe fn`: remove `unsafe` and use an unsafe block inside");
    }
    if let Some(abi) = &sig.abi {
        cx.error_spanned(abi, "a verified tool cannot have an `extern` ABI: remove it");
    }
    if let Some(variadic) = &sig.variadic {
        cx.error_spanned(variadic, "a verified tool cannot be variadic");
    }
    if func.result.is_none() {
        let message = match &sig.output {
            syn::ReturnType::Default => format!(
                "a verified tool returns `Result<T, E>` where `E: Classify`: write `-> Result<T, E>` \
                 after the parameters of `{}`",
                sig.ident
            ),
            syn::ReturnType::Type(_, ty) => format!(
                "a verified tool returns `Result<T, E>` where `E: Classify`, found `{}`; write the \
                 `Result<T, E>` out in full (an alias such as `io::Result<T>` hides the error type \
                 the wrapper classifies)",
                parse::type_string(ty)
            ),
        };
        match &sig.output {
            syn::ReturnType::Type(_, ty) => cx.error_spanned(ty, message),
            syn::ReturnType::Default => cx.error(sig.ident.span(), message),
        }
    }
    if let Some(receiver) = &func.receiver {
        let ok = matches!(receiver.kind, ReceiverKind::Reference(_, _, None))
            && receiver.mutability.is_none();
        if !ok {
            cx.error_spanned(
                receiver,
                "a verified tool method takes `&self`: every attempt and every verifier read \
                 borrows the receiver; keep mutable state behind a `Mutex` or an atomic",
            );
        }
    }
    let mut seen: Vec<Injected> = Vec::new();
    for param in &func.params {
        if let Some(injected) = param.injected {
            if seen.contains(&injected) {
                let ty = injected.type_name();
                cx.error_spanned(
                    &param.ty,
                    format!(
                        "a second `{ty}` parameter: the wrapper passes one `{ty}` per attempt to \
                         the single `{ty}` parameter; remove this one"
                    ),
                );
            }
            seen.push(injected);
            continue;
        }
        if param.ident.is_none() {
            cx.error_spanned(
                &param.pat,
                "a verified tool's parameters are plain names (they are the tool's argument names): \
                 write `name: Type` and destructure inside the body",
            );
        }
        if let Some(span) = param.mut_ref() {
            cx.error(
                span,
                "a `&mut` parameter cannot be lent to every attempt and to the verifier: take `&T` \
                 (with a `Mutex` or `RefCell` inside for the state the body changes)",
            );
        }
    }
}

/// Resolves `skip(..)` or `secret(..)` to one flag per parameter.
fn names(func: &ToolFn, list: Option<&NameList>, what: &str, cx: &Ctxt) -> Vec<bool> {
    let mut flags = vec![false; func.params.len()];
    let Some(list) = list else { return flags };
    let known: Vec<String> = func
        .params
        .iter()
        .filter(|p| p.is_argument())
        .filter_map(|p| p.ident.as_ref().map(ToString::to_string))
        .collect();
    for (i, name) in list.names.iter().enumerate() {
        if list.names[..i].contains(name) {
            cx.error(name.span(), format!("`{name}` is listed twice in `{what}(..)`: remove one"));
            continue;
        }
        match func.params.iter().position(|p| p.ident.as_ref() == Some(name)) {
            Some(index) if !func.params[index].is_argument() => {
                let ty = func.params[index].injected.map_or("", Injected::type_name);
                cx.error(
                    name.span(),
                    format!(
                        "`{name}` is the `{ty}` parameter: the wrapper fills it in, and it is never \
                         part of the key or the audit; remove it from `{what}(..)`"
                    ),
                )
            }
            Some(index) => flags[index] = true,
            None => {
                let written = name.to_string();
                let candidates: Vec<&str> = known.iter().map(String::as_str).collect();
                let hint = parse::suggest(&written, &candidates)
                    .map(|s| format!("did you mean `{s}`? "))
                    .unwrap_or_default();
                let params = if candidates.is_empty() {
                    "it has none".to_owned()
                } else {
                    format!("its parameters are: {}", parse::list(&candidates))
                };
                cx.error(
                    name.span(),
                    format!(
                        "`{what}` names `{written}`, which is not a parameter of `{}`; {hint}{params}",
                        func.item.sig.ident
                    ),
                );
            }
        }
    }
    flags
}

/// Resolves `params(..)` to one description per parameter: each name must be
/// an argument the model sends (not skipped, not filled in by the wrapper).
fn param_docs(
    func: &ToolFn,
    docs: Option<&parse::ParamDocs>,
    skipped: &[bool],
    cx: &Ctxt,
) -> Vec<Option<LitStr>> {
    let mut out = vec![None; func.params.len()];
    let Some(docs) = docs else { return out };
    let arguments: Vec<String> = func
        .params
        .iter()
        .zip(skipped)
        .filter(|(p, s)| p.is_argument() && !**s)
        .filter_map(|(p, _)| p.ident.as_ref().map(|i| i.unraw().to_string()))
        .collect();
    for (i, (name, doc)) in docs.docs.iter().enumerate() {
        let written = name.unraw().to_string();
        if docs.docs[..i].iter().any(|(n, _)| n.unraw() == written) {
            cx.error(
                name.span(),
                format!("`{written}` is described twice in `params(..)`: remove one"),
            );
            continue;
        }
        if doc.value().trim().is_empty() {
            cx.error(doc.span(), format!("the description of `{written}` is empty: write what the model should pass, or remove it"));
            continue;
        }
        let index =
            func.params.iter().position(|p| p.ident.as_ref().is_some_and(|i| i.unraw() == written));
        match index {
            Some(index) if !func.params[index].is_argument() => {
                let ty = func.params[index].injected.map_or("", Injected::type_name);
                cx.error(
                    name.span(),
                    format!(
                        "`{written}` is the `{ty}` parameter: the wrapper fills it in, and the model \
                         never sends it; remove it from `params(..)`"
                    ),
                );
            }
            Some(index) if skipped[index] => cx.error(
                name.span(),
                format!(
                    "`{written}` is skipped: it comes from the tool set's state, and the model never \
                     sends it; remove it from `params(..)`"
                ),
            ),
            Some(index) => out[index] = Some(doc.clone()),
            None => {
                let candidates: Vec<&str> = arguments.iter().map(String::as_str).collect();
                let hint = parse::suggest(&written, &candidates)
                    .map(|s| format!("did you mean `{s}`? "))
                    .unwrap_or_default();
                let listed = if candidates.is_empty() {
                    "the model sends none".to_owned()
                } else {
                    format!("the arguments the model sends are: {}", parse::list(&candidates))
                };
                cx.error(
                    name.span(),
                    format!(
                        "`params` describes `{written}`, which is not a parameter of `{}`; {hint}{listed}",
                        func.item.sig.ident
                    ),
                );
            }
        }
    }
    out
}

/// A tool listed for models needs a name OpenAI, Anthropic and MCP all
/// accept: 1 to 64 ASCII letters, digits, `_` and `-`.
fn listed_name(func: &ToolFn, name: Option<&LitStr>, cx: &Ctxt) {
    let (written, span) = match name {
        Some(lit) => (lit.value(), lit.span()),
        None => (func.item.sig.ident.unraw().to_string(), func.item.sig.ident.span()),
    };
    let ok = (1..=64).contains(&written.len())
        && written.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !ok {
        cx.error(
            span,
            format!(
                "the tool name \"{written}\" cannot be listed for a model: OpenAI and Anthropic take \
                 1 to 64 ASCII letters, digits, `_` and `-`; set one with `name = \"..\"`"
            ),
        );
    }
}

/// With `schema = true`, the skipped parameters come from the tool set's
/// state (`S: Has<T>`), so their type must name no lifetime but the outer
/// reference's: `&Client` or an owned `Arc<Client>`.
fn state_types(func: &ToolFn, skipped: &[bool], cx: &Ctxt) {
    for (param, _) in func.params.iter().zip(skipped).filter(|(_, s)| **s) {
        let inner = match parse::peel(&param.ty) {
            Type::Reference(r) => &*r.elem,
            other => other,
        };
        if has_lifetime(quote::ToTokens::to_token_stream(inner)) {
            cx.error_spanned(
                inner,
                "with `schema = true` a skipped parameter is taken from the tool set's state: \
                 its type must be `&T` or an owned `T`, without lifetimes (but `'static`) or \
                 `impl Trait` (a client, an `Arc<Client>`)",
            );
        }
    }
}

/// Whether the type names a lifetime other than `'static`, or `impl Trait`.
fn has_lifetime(tokens: proc_macro2::TokenStream) -> bool {
    let mut tokens = tokens.into_iter().peekable();
    while let Some(tt) = tokens.next() {
        let named = match tt {
            proc_macro2::TokenTree::Punct(p) if p.as_char() == '\'' => {
                !matches!(tokens.peek(), Some(proc_macro2::TokenTree::Ident(i)) if i == "static")
            }
            proc_macro2::TokenTree::Group(g) => has_lifetime(g.stream()),
            // `impl Trait` cannot be named as a part of the state.
            proc_macro2::TokenTree::Ident(i) => i == "impl",
            _ => false,
        };
        if named {
            return true;
        }
    }
    false
}
