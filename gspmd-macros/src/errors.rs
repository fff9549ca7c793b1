//! [`Errors`]: collects every compile error a macro finds, so the user sees them all at
//! once (`syn::Error::combine`), each spanned on the user's token.

use std::fmt::Display;

use quote::ToTokens;

/// A growing list of spanned errors.
#[derive(Default)]
pub struct Errors(Option<syn::Error>);

impl Errors {
    /// Adds `error`.
    pub fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(error),
            None => self.0 = Some(error),
        }
    }

    /// Adds an error spanned on `tokens`.
    pub fn spanned(&mut self, tokens: impl ToTokens, message: impl Display) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    /// `Ok` if nothing was found, else all errors combined.
    pub fn finish(self) -> syn::Result<()> {
        self.0.map_or(Ok(()), Err)
    }
}
