//! String constants declared once together with their rustdoc, and a table of them: the
//! reasons ([`crate::reason::ALL`]) and the environment variables ([`crate::env::ALL`]) are
//! listed from there, in docs/reference/, by the code rather than by hand.

/// A constant as its table lists it: its name in the code, its value and its rustdoc.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Documented {
    /// The constant's name (`POD_CREATE_REFUSED`).
    pub name: &'static str,
    /// Its value (`PodCreateRefused`).
    pub value: &'static str,
    /// Its rustdoc as written, one line per `///` line.
    pub doc: &'static str,
}

impl Documented {
    /// The rustdoc as prose: wrapped lines joined, paragraphs kept apart by a blank line,
    /// intra-doc links shown as their code (`` [`crate::RankEnd`] `` -> `` `RankEnd` ``).
    pub fn text(&self) -> String {
        let mut paragraphs: Vec<String> = vec![String::new()];
        for line in self.doc.lines().map(str::trim) {
            let current = paragraphs.last_mut().expect("one paragraph at least");
            if line.is_empty() {
                paragraphs.push(String::new());
            } else {
                if !current.is_empty() {
                    current.push(' ');
                }
                current.push_str(line);
            }
        }
        paragraphs.retain(|p| !p.is_empty());
        unlink(&paragraphs.join("\n\n"))
    }
}

/// `` [`path::Name`] `` -> `` `Name` ``: rustdoc's links, as plain code.
fn unlink(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("[`") {
        let Some(end) = rest[at..].find("`]") else {
            break;
        };
        let inner = &rest[at + 2..at + end];
        out.push_str(&rest[..at]);
        out.push('`');
        out.push_str(inner.rsplit("::").next().unwrap_or(inner));
        out.push('`');
        rest = &rest[at + end + 2..];
    }
    out.push_str(rest);
    out
}

/// Declares `pub const NAME: &str = "value";` items, each with its rustdoc, and the table
/// `pub const TABLE: &[Documented]` of them in the order written:
///
/// ```ignore
/// documented! {
///     /// Every reason, in this order.
///     pub const ALL;
///     /// Created=True: every pod of the current attempt was created.
///     pub const PODS_CREATED: &str = "PodsCreated";
/// }
/// ```
macro_rules! documented {
    (
        $(#[doc = $table_doc:literal])*
        pub const $table:ident;
        $( $(#[doc = $doc:literal])+ pub const $name:ident: &str = $value:literal; )+
    ) => {
        $( $(#[doc = $doc])+ pub const $name: &str = $value; )+

        $(#[doc = $table_doc])*
        pub const $table: &[$crate::documented::Documented] = &[
            $( $crate::documented::Documented {
                name: stringify!($name),
                value: $value,
                doc: concat!($($doc, "\n"),+),
            }, )+
        ];
    };
}

pub(crate) use documented;

#[cfg(test)]
mod tests {
    documented! {
        /// A table for the test.
        pub const TABLE;
        /// First line
        /// wrapped, see [`SECOND`].
        ///
        /// Another paragraph, [`crate::RankEnd`].
        pub const FIRST: &str = "First";
        /// Second.
        pub const SECOND: &str = "Second";
    }

    #[test]
    fn each_constant_is_declared_and_listed_with_its_doc() {
        assert_eq!((FIRST, SECOND), ("First", "Second"));
        let names: Vec<_> = TABLE.iter().map(|c| (c.name, c.value)).collect();
        assert_eq!(names, [("FIRST", "First"), ("SECOND", "Second")]);
        assert_eq!(
            TABLE[0].text(),
            "First line wrapped, see `SECOND`.\n\nAnother paragraph, `RankEnd`."
        );
        assert_eq!(TABLE[1].text(), "Second.");
    }
}
