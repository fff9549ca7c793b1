//! Parsing a [`Sharding`] from its text form: the exact inverse of its `Display`.
//!
//! ```text
//! sharding := '(' [dim {',' dim}] ')' {attr}
//! attr     := ('replicated' | 'unreduced') '=' '{' [axis {',' axis}] '}'   (each at most once)
//! dim      := ['-'] ('_' | '?' | axis ['?'] | '(' axis {',' axis} ')' ['?']) ['@' digits]
//!             (`-`: reversed device order, only before a split dim)
//! axis     := name [':' '(' digits ')' digits]    (a sub-axis `name:(pre)size`)
//! name     := identifier other than `_`
//! ```
//!
//! Whitespace is allowed between any two tokens.

use std::str::FromStr;

use super::mesh::Mesh;
use super::spec::{DimSharding, Sharding};
use crate::error::{Error, ParseProblem, Result};

impl FromStr for Sharding {
    type Err = Error;

    /// Parses `(data, _)`, `((data, model)?@0, ?) replicated={x} unreduced={y}`, `()`.
    ///
    /// ```
    /// # use gspmd_core::sharding::{DimSharding, Sharding};
    /// let s: Sharding = "(data@1, (x, y)?)".parse().unwrap();
    /// assert_eq!(s.dims[0], DimSharding::closed(["data"]).with_priority(1));
    /// assert_eq!(s.dims[1], DimSharding::open(["x", "y"]));
    /// ```
    fn from_str(text: &str) -> Result<Self> {
        let mut parser = Parser { text, pos: 0 };
        parser
            .sharding()
            .map_err(|(offset, problem)| Error::ParseSharding {
                text: text.to_string(),
                offset,
                problem,
            })
    }
}

/// A cursor over the text; errors are problems at a byte offset.
struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

type ParseResult<T> = std::result::Result<T, (usize, ParseProblem)>;

impl<'a> Parser<'a> {
    fn rest(&self) -> &'a str {
        &self.text[self.pos..]
    }

    fn skip_ws(&mut self) {
        let rest = self.rest();
        self.pos += rest.len() - rest.trim_start().len();
    }

    /// Skips whitespace, then consumes `c` if it comes next.
    fn eat(&mut self, c: char) -> bool {
        self.skip_ws();
        if self.rest().starts_with(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: char) -> ParseResult<()> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(self.unexpected(&format!("`{c}`")))
        }
    }

    fn unexpected(&self, wanted: &str) -> (usize, ParseProblem) {
        let problem = ParseProblem::Expected {
            expected: wanted.to_string(),
            found: self.rest().chars().next(),
        };
        (self.pos, problem)
    }

    /// An identifier (`_` alone included); `None` if none starts here.
    fn identifier(&mut self) -> Option<&'a str> {
        self.skip_ws();
        let rest = self.rest();
        let first = rest.chars().next()?;
        if !(first.is_alphabetic() || first == '_') {
            return None;
        }
        let len = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        self.pos += len;
        Some(&rest[..len])
    }

    fn axis(&mut self) -> ParseResult<String> {
        let start = self.pos;
        let name = match self.identifier() {
            Some("_") => {
                self.pos = start;
                return Err(self.unexpected("a mesh axis name (`_` is not one)"));
            }
            Some(name) => name,
            None => return Err(self.unexpected("a mesh axis name")),
        };
        self.sub_axis(name)
    }

    /// After an axis name: `:(pre)size` makes it a sub-axis ([`Mesh::sub_axis`]).
    fn sub_axis(&mut self, name: &str) -> ParseResult<String> {
        if !self.eat(':') {
            return Ok(name.to_string());
        }
        self.expect('(')?;
        let pre = self.number("the digits of a sub-axis's `pre`")?;
        self.expect(')')?;
        let size = self.number("the digits of a sub-axis's size")?;
        Ok(Mesh::sub_axis(name, pre, size))
    }

    /// Decimal digits, after optional whitespace.
    fn number(&mut self, wanted: &str) -> ParseResult<usize> {
        self.skip_ws();
        let rest = self.rest();
        let len = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if len == 0 {
            return Err(self.unexpected(wanted));
        }
        let digits = &rest[..len];
        let too_large = || {
            let digits = digits.to_string();
            (self.pos, ParseProblem::Number { digits })
        };
        let n = digits.parse().map_err(|_| too_large())?;
        self.pos += len;
        Ok(n)
    }

    /// `axis {, axis} close`, after the opening bracket; at least one axis unless
    /// `allow_empty`.
    fn axis_list(&mut self, close: char, allow_empty: bool) -> ParseResult<Vec<String>> {
        let mut axes = Vec::new();
        if allow_empty && self.eat(close) {
            return Ok(axes);
        }
        loop {
            axes.push(self.axis()?);
            if self.eat(close) {
                return Ok(axes);
            }
            if !self.eat(',') {
                return Err(self.unexpected(&format!("`,` or `{close}`")));
            }
        }
    }

    fn sharding(&mut self) -> ParseResult<Sharding> {
        self.expect('(')?;
        let mut dims = Vec::new();
        if !self.eat(')') {
            loop {
                dims.push(self.dim()?);
                if self.eat(')') {
                    break;
                }
                if !self.eat(',') {
                    return Err(self.unexpected("`,` or `)`"));
                }
            }
        }
        let mut replicated = None;
        let mut unreduced = None;
        loop {
            self.skip_ws();
            if self.rest().is_empty() {
                break;
            }
            let start = self.pos;
            let slot = match self.identifier() {
                Some("replicated") => &mut replicated,
                Some("unreduced") => &mut unreduced,
                _ => {
                    self.pos = start;
                    return Err(self.unexpected("`replicated={..}`, `unreduced={..}` or end"));
                }
            };
            if slot.is_some() {
                let clause = self.text[start..self.pos].to_string();
                return Err((start, ParseProblem::GivenTwice { clause }));
            }
            self.expect('=')?;
            self.expect('{')?;
            *slot = Some(self.axis_list('}', true)?);
        }
        Ok(Sharding {
            dims,
            replicated: replicated.unwrap_or_default(),
            unreduced: unreduced.unwrap_or_default(),
        })
    }

    fn dim(&mut self) -> ParseResult<DimSharding> {
        let start = self.pos;
        let reversed = self.eat('-');
        let mut dim = if self.eat('?') {
            DimSharding::open(Vec::<String>::new())
        } else {
            let axes = if self.eat('(') {
                self.axis_list(')', false)?
            } else {
                match self.identifier() {
                    Some("_") => Vec::new(),
                    Some(name) => vec![self.sub_axis(name)?],
                    None => {
                        return Err(self.unexpected("a dim sharding (`_`, `?`, axis or `(..)`)"));
                    }
                }
            };
            // `_?` is not a form: an open unsplit dim is written `?`.
            let closed = axes.is_empty() || !self.eat('?');
            DimSharding {
                axes,
                closed,
                priority: None,
                reversed: false,
            }
        };
        if reversed {
            if dim.axes.is_empty() {
                return Err((start, ParseProblem::ReversedUnsplit));
            }
            dim = dim.with_reversed_order();
        }
        if self.eat('@') {
            let at = self.pos;
            let priority = self.number("a priority (digits) after `@`")?;
            let digits = priority.to_string();
            let priority =
                u32::try_from(priority).map_err(|_| (at, ParseProblem::Number { digits }))?;
            dim = dim.with_priority(priority);
        }
        Ok(dim)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn parse(text: &str) -> Result<Sharding> {
        text.parse()
    }

    fn no_axes() -> Vec<String> {
        Vec::new()
    }

    #[test]
    fn parses_every_dim_form() {
        let s = parse("(data, _, ?, model?, (a, b), (c, d)?@0, x@12, _@3, ?@4)").unwrap();
        let expected = Sharding::new([
            DimSharding::closed(["data"]),
            DimSharding::closed(no_axes()),
            DimSharding::open(no_axes()),
            DimSharding::open(["model"]),
            DimSharding::closed(["a", "b"]),
            DimSharding::open(["c", "d"]).with_priority(0),
            DimSharding::closed(["x"]).with_priority(12),
            DimSharding::closed(no_axes()).with_priority(3),
            DimSharding::open(no_axes()).with_priority(4),
        ]);
        assert_eq!(s, expected);
    }

    #[test]
    fn parses_sub_axes() {
        let s = parse("(model:(1)2, (data, model : ( 2 ) 2)?, _) replicated={x:(1)3}").unwrap();
        assert_eq!(s.dims[0], DimSharding::closed(["model:(1)2"]));
        assert_eq!(s.dims[1], DimSharding::open(["data", "model:(2)2"]));
        assert_eq!(s.replicated, ["x:(1)3"]);
        assert_eq!(
            s.to_string(),
            "(model:(1)2, (data, model:(2)2)?, _) replicated={x:(1)3}"
        );
    }

    #[test]
    fn parses_reversed_device_orders() {
        let s = parse("(-data, - (a, b)?@1, _)").unwrap();
        assert_eq!(
            s.dims[0],
            DimSharding::closed(["data"]).with_reversed_order()
        );
        assert_eq!(
            s.dims[1],
            DimSharding::open(["a", "b"])
                .with_priority(1)
                .with_reversed_order()
        );
        assert!(!s.is_in_mesh_order());
        assert!(s.in_mesh_order().is_in_mesh_order());
        assert_eq!(s.to_string(), "(-data, -(a, b)?@1, _)");
        for text in ["(-_)", "(-?)", "(-?@1, data)"] {
            assert!(
                matches!(
                    parse(text),
                    Err(Error::ParseSharding {
                        offset: 1,
                        problem: ParseProblem::ReversedUnsplit,
                        ..
                    })
                ),
                "{text}"
            );
        }
        assert!(parse("(--data)").is_err());
    }

    #[test]
    fn parses_rank_0_and_attributes() {
        assert_eq!(parse("()").unwrap(), Sharding::replicated(0));
        let s = parse("(_) replicated={a, b} unreduced={c}").unwrap();
        assert_eq!(s.dims, vec![DimSharding::closed(no_axes())]);
        assert_eq!(s.replicated, ["a", "b"]);
        assert_eq!(s.unreduced, ["c"]);
        // Either order; empty sets allowed.
        let s = parse("() unreduced={c} replicated={}").unwrap();
        assert_eq!(s.unreduced, ["c"]);
        assert!(s.replicated.is_empty());
    }

    #[test]
    fn tolerates_whitespace() {
        let tight = parse("((a,b)?@1,_)replicated={x}unreduced={y}").unwrap();
        let loose =
            parse("  ( ( a , b ) ? @ 1 ,\t_ )\n replicated = { x } unreduced = { y }  ").unwrap();
        assert_eq!(tight, loose);
        assert_eq!(
            tight.to_string(),
            "((a, b)?@1, _) replicated={x} unreduced={y}"
        );
    }

    #[test]
    fn rejects_malformed_text() {
        for text in [
            "",
            "data",
            "(data",
            "(data,)",
            "(,)",
            "(data model)",
            "(_?)",
            "(data??)",
            "(())",
            "((a,))",
            "((_, a))",
            "(a@)",
            "(a@x)",
            "(a@99999999999)",
            "(a) replicated",
            "(a) replicated={_}",
            "(a) replicated={x",
            "(a) replicated={x} replicated={y}",
            "(a) sharded={x}",
            "(a) extra",
            "(1a)",
            "(model:)",
            "(model:2)",
            "(model:(1))",
            "(model:(x)2)",
            "(model:(1)2x)",
            "(model:(1)99999999999999999999999)",
            "(_:(1)2)",
        ] {
            match parse(text) {
                Err(Error::ParseSharding {
                    text: t, offset, ..
                }) => {
                    assert_eq!(t, text);
                    assert!(offset <= text.len());
                }
                other => panic!("`{text}` parsed as {other:?}"),
            }
        }
    }

    #[test]
    fn error_names_the_offset() {
        let err = parse("(data, ]").unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot parse sharding `(data, ]` at offset 7: expected a dim sharding (`_`, `?`, axis or `(..)`), found `]`"
        );
        let expected = ParseProblem::Expected {
            expected: "a dim sharding (`_`, `?`, axis or `(..)`)".into(),
            found: Some(']'),
        };
        assert!(
            matches!(err, Error::ParseSharding { offset: 7, problem, .. } if problem == expected)
        );
    }

    #[test]
    fn constructors_and_queries() {
        let s = Sharding::open(2);
        assert_eq!(s.to_string(), "(?, ?)");
        assert!(s.is_replicated());
        assert_eq!(Sharding::replicated(3).to_string(), "(_, _, _)");
        let s = parse("((a, b), _, c?)").unwrap();
        assert!(!s.is_replicated());
        assert_eq!(s.axes().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert!(!parse("(_) unreduced={a}").unwrap().is_replicated());
        assert!(parse("(_) replicated={a}").unwrap().is_replicated());
    }

    /// An axis name, or a sub-axis of one (the parser keeps any digits; validation
    /// checks them against a mesh).
    fn axis_name() -> impl Strategy<Value = String> {
        let name = "[a-zA-Z_][a-zA-Z0-9_]{0,6}".prop_filter("`_` is not an axis", |s| s != "_");
        (name, prop::option::of((0usize..20, 0usize..20))).prop_map(|(name, sub)| match sub {
            Some((pre, size)) => Mesh::sub_axis(&name, pre, size),
            None => name,
        })
    }

    fn axes(max: usize) -> impl Strategy<Value = Vec<String>> {
        prop::collection::vec(axis_name(), 0..=max)
    }

    fn dim_sharding() -> impl Strategy<Value = DimSharding> {
        (
            axes(3),
            any::<bool>(),
            prop::option::of(any::<u32>()),
            any::<bool>(),
        )
            .prop_map(|(axes, closed, priority, reversed)| DimSharding {
                reversed: reversed && !axes.is_empty(),
                axes,
                closed,
                priority,
            })
    }

    fn sharding() -> impl Strategy<Value = Sharding> {
        (
            prop::collection::vec(dim_sharding(), 0..5),
            axes(3),
            axes(3),
        )
            .prop_map(|(dims, replicated, unreduced)| Sharding {
                dims,
                replicated,
                unreduced,
            })
    }

    proptest! {
        #[test]
        fn parse_inverts_display(s in sharding()) {
            prop_assert_eq!(parse(&s.to_string()).unwrap(), s);
        }
    }
}
