//! Names that cross the store's edge: enums in the domain, text in
//! Postgres, the API and the archive.
//!
//! Every closed set of values the platform stores as text (a delivery's
//! status, an attempt's outcome, error class, trigger and note, a circuit's
//! state, an archive partition's state) is declared once with
//! [`stored_names!`](crate::stored_names!): the enum, its stored spelling, the one parser that
//! turns a stored value back into the enum, and the serde form (the same
//! spelling) the API and the reports write. Code compares enums; only the
//! SQL edge sees the text, and a value this version does not know is an
//! [`UnknownName`] error naming the value and the ones it knows, never a
//! silent default.

use std::fmt;

/// A stored value that is not one of its enum's names: a row written by a
/// newer version, or edited by hand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownName {
    /// What the value names (`attempt outcome`, `circuit state`, …).
    pub what: &'static str,
    /// The value found.
    pub value: String,
    /// The names this version knows, separated by spaces.
    pub known: &'static str,
}

impl fmt::Display for UnknownName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown {} {:?}: this version of walhook knows {}; a newer version wrote it, or the row was edited by hand",
            self.what,
            self.value,
            self.known.trim_end().replace(' ', ", ")
        )
    }
}

impl std::error::Error for UnknownName {}

/// Declares an enum whose values are stored as text.
///
/// ```
/// walhook_pipeline::stored_names! {
///     /// A colour.
///     pub enum Colour as "colour" {
///         /// Red.
///         Red = "red",
///         /// Dark blue.
///         DarkBlue = "dark_blue",
///     }
/// }
/// assert_eq!(Colour::DarkBlue.as_str(), "dark_blue");
/// assert_eq!(Colour::try_from("red"), Ok(Colour::Red));
/// assert!(Colour::try_from("green").unwrap_err().to_string().contains("red, dark_blue"));
/// assert_eq!(serde_json::to_string(&Colour::Red).unwrap(), "\"red\"");
/// ```
#[macro_export]
macro_rules! stored_names {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident as $what:literal {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// Every stored name, in declaration order.
            pub const NAMES: &'static [&'static str] = &[$($text),+];

            /// The stored (and shown) name.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $text, )+
                }
            }
        }

        impl ::std::convert::TryFrom<&str> for $name {
            type Error = $crate::stored::UnknownName;

            fn try_from(value: &str) -> ::std::result::Result<Self, Self::Error> {
                match value {
                    $( $text => Ok($name::$variant), )+
                    _ => Err($crate::stored::UnknownName {
                        what: $what,
                        value: value.to_owned(),
                        known: concat!($($text, " "),+),
                    }),
                }
            }
        }

        $crate::stored_text!($name);
    };
}

/// The text forms of a type stored as one of a fixed set of names: its
/// `FromStr`, `Display`, and serde as that name. The type has
/// `fn as_str(self) -> &'static str` and `TryFrom<&str, Error =
/// UnknownName>`: [`stored_names!`](crate::stored_names!) uses it, and so does a type that joins
/// stored enums (a class or an end reason, a catalog state or `failed`).
#[macro_export]
macro_rules! stored_text {
    ($name:ty) => {
        impl ::std::str::FromStr for $name {
            type Err = $crate::stored::UnknownName;

            fn from_str(value: &str) -> ::std::result::Result<Self, Self::Err> {
                <$name as ::std::convert::TryFrom<&str>>::try_from(value)
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl $crate::stored::__serde::Serialize for $name {
            fn serialize<S: $crate::stored::__serde::Serializer>(
                &self,
                s: S,
            ) -> ::std::result::Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> $crate::stored::__serde::Deserialize<'de> for $name {
            fn deserialize<D: $crate::stored::__serde::Deserializer<'de>>(
                d: D,
            ) -> ::std::result::Result<Self, D::Error> {
                let text =
                    <::std::string::String as $crate::stored::__serde::Deserialize>::deserialize(
                        d,
                    )?;
                <$name as ::std::convert::TryFrom<&str>>::try_from(&text)
                    .map_err(<D::Error as $crate::stored::__serde::de::Error>::custom)
            }
        }
    };
}

#[doc(hidden)]
pub use serde as __serde;

#[cfg(test)]
mod tests {
    crate::stored_names! {
        /// For the tests.
        enum Probe as "probe" {
            /// One.
            One = "one",
            /// Two words.
            TwoWords = "two_words",
        }
    }

    #[test]
    fn every_name_round_trips_and_an_unknown_one_is_named() {
        for p in Probe::ALL {
            assert_eq!(Probe::try_from(p.as_str()), Ok(*p));
            assert_eq!(p.as_str().parse::<Probe>(), Ok(*p));
            assert!(Probe::NAMES.contains(&p.as_str()));
            let json = serde_json::to_string(p).unwrap();
            assert_eq!(serde_json::from_str::<Probe>(&json).unwrap(), *p);
        }
        let err = Probe::try_from("three").unwrap_err();
        assert_eq!(err.value, "three");
        let text = err.to_string();
        assert!(
            text.contains("unknown probe \"three\"") && text.contains("one, two_words"),
            "{text}"
        );
        assert!(serde_json::from_str::<Probe>("\"One\"").is_err());
    }
}
