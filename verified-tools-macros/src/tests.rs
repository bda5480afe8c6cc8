//! Expansion snapshots: the generated code, pretty-printed with prettyplease
//! and checked in under `src/snapshots/`, so that every change to the
//! generated code is reviewed.

use proc_macro2::TokenStream;
use quote::quote;

/// Expands and pretty-prints; a method expansion is wrapped in an impl.
fn expand(args: TokenStream, item: TokenStream, in_impl: bool) -> String {
    let out = crate::run(args, item);
    let file = if in_impl { quote!(impl Mailer { #out }) } else { out };
    match syn::parse2::<syn::File>(file.clone()) {
        Ok(file) => prettyplease::unparse(&file),
        Err(e) => panic!("the expansion does not parse: {e}\n{file}"),
    }
}

#[test]
fn high_with_verifier_skip_and_key() {
    insta::assert_snapshot!(expand(
        quote!(side_effect = "high", verify = check_activated, skip(crm)),
        quote! {
            /// Sets the customer ACTIVE.
            pub async fn activate_customer(crm: &Crm, customer_id: u64, key: IdempotencyKey)
                -> Result<Customer, CrmError>
            {
                crm.activate(customer_id, key).await
            }
        },
        false,
    ));
}

#[test]
fn low_without_verifier_all_options() {
    insta::assert_snapshot!(expand(
        quote!(
            side_effect = "low",
            retries = 3,
            timeout = "250ms",
            bucket = "5m",
            name = "drafts.save",
            secret(token),
            send = true,
            json = true
        ),
        quote! {
            async fn save_draft(token: &str, mut body: String) -> Result<u32, std::io::Error> {
                body.push('!');
                Ok(body.len() as u32 + token.len() as u32)
            }
        },
        false,
    ));
}

#[test]
fn method_with_verifier_method() {
    insta::assert_snapshot!(expand(
        quote!(side_effect = "irreversible", verify = was_refunded, verify_response = true),
        quote! {
            pub async fn refund(&self, order: u64) -> Result<(), MailError> {
                self.refund_order(order).await
            }
        },
        true,
    ));
}

#[test]
fn none_without_parameters() {
    insta::assert_snapshot!(expand(
        quote!(side_effect = "none"),
        quote! {
            async fn ping() -> Result<(), ErrorClass> {
                Ok(())
            }
        },
        false,
    ));
}

#[test]
fn schema_with_params_and_two_skipped_parameters() {
    insta::assert_snapshot!(expand(
        quote!(
            side_effect = "high",
            verify = ticket_exists,
            skip(crm, mailer),
            schema = true,
            params(title = "A one-line summary.", r#type = "`bug` or `question`.")
        ),
        quote! {
            /// Opens a ticket and mails the customer.
            pub async fn open_ticket(
                crm: &Crm,
                mailer: Arc<Mailer>,
                title: &str,
                r#type: Option<Kind>,
                tags: &[String],
                key: IdempotencyKey,
            ) -> Result<Ticket, CrmError> {
                crm.open(title, r#type, tags, &mailer, key).await
            }
        },
        false,
    ));
}

#[test]
fn schema_on_a_method() {
    insta::assert_snapshot!(expand(
        quote!(side_effect = "none", schema = true),
        quote! {
            pub async fn find(&self, id: u64) -> Result<Option<Ticket>, CrmError> {
                self.lookup(id).await
            }
        },
        true,
    ));
}

#[test]
fn classify_fn_on_a_method_with_json_and_verify_key() {
    insta::assert_snapshot!(expand(
        quote!(
            side_effect = "high",
            verify = delivered,
            verify_key = true,
            classify = http::classify,
            json = true
        ),
        quote! {
            pub async fn deliver(&self, to: &str, key: IdempotencyKey) -> Result<u64, reqwest::Error> { Ok(self.post(to, key).await?) }
        },
        true,
    ));
}

#[test]
fn a_classify_fn_is_kept_in_the_stub() {
    let out = crate::run(
        quote!(side_effect = "hihg", classify = classify_http),
        quote! {
            async fn fetch(id: u64) -> Result<u64, HttpError> { Ok(id) }
        },
    )
    .to_string();
    assert!(out.contains("compile_error"), "{out}");
    assert!(
        out.contains(
            "let _ : fn (& HttpError) -> :: verified_tools :: ErrorClass = classify_http ;"
        ),
        "{out}"
    );
}

#[test]
fn errors_come_with_a_stub_of_the_entry_point() {
    insta::assert_snapshot!(expand(
        quote!(side_effect = "hihg", skip(nope)),
        quote! {
            pub async fn send(to: &str, key: IdempotencyKey) -> Result<(), MailError> {
                Ok(())
            }
        },
        false,
    ));
}

#[test]
fn a_broken_signature_keeps_the_function_as_written() {
    insta::assert_snapshot!(expand(
        quote!(side_effect = "low"),
        quote! {
            fn send(to: &str) -> Option<()> {
                None
            }
        },
        false,
    ));
}

#[test]
fn durations_and_suggestions() {
    let cx = crate::ctxt::Ctxt::default();
    let args = crate::parse::args(quote!(side_effect = "low", timeout = "90s", bucket = "2h"), &cx);
    assert!(cx.finish().is_ok());
    assert_eq!(args.timeout.map(|d| d.millis), Some(90_000));
    assert_eq!(args.bucket.map(|d| d.millis), Some(7_200_000));
    assert_eq!(crate::parse::suggest("hihg", crate::parse::CLASSES), Some("high"));
    assert_eq!(crate::parse::suggest("retry", crate::parse::ARGUMENTS), Some("retries"));
    assert_eq!(crate::parse::suggest("zzz", crate::parse::ARGUMENTS), None);
    let cx = crate::ctxt::Ctxt::default();
    let args = crate::parse::args(quote!(schema = true, params(a = "x", r#type = "y")), &cx);
    assert!(cx.finish().is_ok());
    let docs = args.params.expect("params");
    let names: Vec<String> = docs.docs.iter().map(|(n, d)| format!("{n}={}", d.value())).collect();
    assert_eq!(names, ["a=x", "r#type=y"]);
    assert!(args.schema.is_some_and(|l| l.value));
}

#[test]
fn type_strings_are_compact() {
    let ty: syn::Type = syn::parse_quote!(&'a std::collections::HashMap<String, Vec<u8>>);
    assert_eq!(crate::parse::type_string(&ty), "&'a std::collections::HashMap<String, Vec<u8>>");
    let ty: syn::Type = syn::parse_quote!(&mut dyn Fn(u8) -> u8);
    assert_eq!(crate::parse::type_string(&ty), "&mut dyn Fn(u8) -> u8");
}
