//! An error accumulator, so that one attribute reports all its problems at
//! once (the same idea as serde_derive's `Ctxt`).

use std::cell::RefCell;
use std::fmt::Display;

use proc_macro2::Span;

/// Collects spanned errors while the attribute and the function are parsed
/// and checked.
#[derive(Default)]
pub(crate) struct Ctxt {
    errors: RefCell<Option<syn::Error>>,
}

impl Ctxt {
    /// Records an error at `span`.
    pub(crate) fn error(&self, span: Span, message: impl Display) {
        self.push(syn::Error::new(span, message));
    }

    /// Records an error spanning all of `tokens`.
    pub(crate) fn error_spanned(&self, tokens: impl quote::ToTokens, message: impl Display) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    /// Records an error produced by a syn parser.
    pub(crate) fn push(&self, error: syn::Error) {
        let mut errors = self.errors.borrow_mut();
        match errors.as_mut() {
            Some(all) => all.combine(error),
            None => *errors = Some(error),
        }
    }

    /// Whether any error was recorded.
    pub(crate) fn has_errors(&self) -> bool {
        self.errors.borrow().is_some()
    }

    /// All errors recorded, combined.
    pub(crate) fn finish(self) -> Result<(), syn::Error> {
        match self.errors.into_inner() {
            Some(errors) => Err(errors),
            None => Ok(()),
        }
    }
}
