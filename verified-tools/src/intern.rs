//! Descriptors for tools known only at run time, kept once per content.
//!
//! A [`ToolSpec`] borrows its texts for `'static`, because the engine, the
//! audit and the spans hand them on without copying (a tool written with
//! `#[verified_tool]` has them in the binary). A tool read from another
//! server's `tools/list` has owned texts, so its descriptor must be kept for
//! the rest of the process. Leaking it each time (`Box::leak`) grows memory
//! with every listing a proxy reads; these functions keep one copy per
//! distinct content instead, so a listing read again, or a set rebuilt when
//! the upstream says its tools changed, costs no more memory: what is kept
//! grows with the distinct descriptors and texts the process ever saw, not
//! with how often it saw them. Nothing kept is freed, so an upstream that
//! keeps changing its texts (a description with a date in it) grows it
//! with every change.
//!
//! ```
//! use verified_tools::{intern, SideEffect, ToolSpec};
//!
//! // What an upstream lists, read twice (at start-up, then after
//! // `notifications/tools/list_changed`): owned strings each time.
//! let describe = |name: String, order: String| {
//!     intern::spec(
//!         ToolSpec::new(intern::text(&name), SideEffect::High)
//!             .with_verifier()
//!             .with_effect_key(intern::texts(&[order])),
//!     )
//! };
//! let first = describe("charge".to_owned(), "order".to_owned());
//! let again = describe("charge".to_owned(), "order".to_owned());
//! assert!(std::ptr::eq(first, again)); // one descriptor, kept once
//! assert_eq!(first.effect_key, ["order"]);
//! ```

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::Hash;
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::{Param, ToolSpec};

/// `text`, kept for the rest of the process: the same content always gives
/// the same `&'static str`, and is stored once.
pub fn text(text: &str) -> &'static str {
    static TEXTS: Pool<str> = Pool::new();
    TEXTS.get(text, |t| Box::leak(Box::from(t)))
}

/// A list of texts (an effect identity, [`ToolSpec::with_effect_key`]),
/// kept for the rest of the process, once per content.
pub fn texts<S: AsRef<str>>(items: &[S]) -> &'static [&'static str] {
    static LISTS: Pool<[&'static str]> = Pool::new();
    let items: Vec<&'static str> = items.iter().map(|item| text(item.as_ref())).collect();
    LISTS.get(&items[..], |list| Box::leak(Box::from(list)))
}

/// A list of parameters ([`ToolSpec::with_params`]), kept for the rest of
/// the process, once per content. Make their names and types with [`text`].
pub fn params(params: &[Param]) -> &'static [Param] {
    static PARAMS: Pool<[Param]> = Pool::new();
    PARAMS.get(params, |list| Box::leak(Box::from(list)))
}

/// `spec`, kept for the rest of the process: a descriptor equal to one kept
/// before gives that one back. Equal means equal content: two upstreams
/// listing the same tool share one descriptor (nothing compares
/// descriptors by address). Make its texts with [`text`] and [`texts`], or
/// they are kept once more with each call that builds them.
pub fn spec(spec: ToolSpec) -> &'static ToolSpec {
    static SPECS: Pool<ToolSpec> = Pool::new();
    SPECS.get(&spec, |s| Box::leak(Box::new(*s)))
}

/// One kind of kept value. A value is looked up under the lock and leaked
/// only when new, so two threads keeping the same content get one copy.
struct Pool<T: ?Sized + 'static> {
    kept: OnceLock<Mutex<HashSet<&'static T>>>,
}

impl<T: ?Sized + Eq + Hash + 'static> Pool<T> {
    const fn new() -> Self {
        Self { kept: OnceLock::new() }
    }

    fn get(&self, value: &T, leak: impl FnOnce(&T) -> &'static T) -> &'static T
    where
        &'static T: Borrow<T>,
    {
        let kept = self.kept.get_or_init(Mutex::default);
        // A panic while the lock was held cannot leave the set half
        // changed (an insert either happened or did not): go on with it.
        let mut kept = kept.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(found) = kept.get(value) {
            return found;
        }
        let new = leak(value);
        kept.insert(new);
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SideEffect;

    #[test]
    fn threads_keeping_the_same_content_get_one_copy() {
        // All eight ask at once, so that a lookup and an insert race.
        let start = std::sync::Barrier::new(8);
        let kept: Vec<usize> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..8)
                .map(|_| {
                    scope.spawn(|| {
                        start.wait();
                        let name = String::from("intern_threads_tool");
                        let spec = ToolSpec::new(text(&name), SideEffect::Low)
                            .with_params(params(&[Param::new(text("to"), text("String"))]));
                        std::ptr::from_ref(super::spec(spec)) as usize
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        assert!(kept.iter().all(|&p| p == kept[0]), "{kept:?}");
    }

    #[test]
    fn equal_texts_are_one_and_different_ones_are_not() {
        let (a, b) = (String::from("intern_text_a"), String::from("intern_text_a"));
        assert!(std::ptr::eq(text(&a), text(&b)));
        assert!(!std::ptr::eq(text(&a), text("intern_text_b")));
        assert_eq!(texts(&["x", "y"]), ["x", "y"]);
        assert!(std::ptr::eq(texts(&["x", "y"]), texts(&[String::from("x"), String::from("y")])));
        assert!(!std::ptr::eq(texts(&["x", "y"]), texts(&["y", "x"])));
    }
}
