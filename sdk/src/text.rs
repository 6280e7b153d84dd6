//! [`text!`](crate::text!): a line of text from pieces, for log lines on a
//! policy's hot path.
//!
//! `format!` works in a plugin, but `core::fmt` is heavy inside the
//! sandbox: writing the one six-argument log line of the reference policy
//! `recommended` with `text!` instead took ~2,500 of its ~17,500
//! instructions per decision off. `text!` writes its pieces in order
//! straight into one `String` sized up front: text as it is, integers in
//! decimal, `bool` as `true`/`false`. No padding, precision, `Debug` or
//! floats: use `format!` for those.
//!
//! ```
//! use tidegate_sdk::{text, Action, LogLevel};
//!
//! let (tunnels, namespace, name) = (3u32, "shop", "cart-7d9f");
//! let line = text!("draining ", tunnels, " tunnels of ", namespace, "/", name);
//! assert_eq!(line, "draining 3 tunnels of shop/cart-7d9f");
//! let action = Action::log(LogLevel::Info, line);
//! # let _ = action;
//! ```

/// One piece of a [`text!`](crate::text!) line.
pub trait Piece {
    /// Appends this piece to `out`.
    fn push_to(&self, out: &mut String);

    /// At least the bytes [`Piece::push_to`] appends: the line is allocated
    /// once, at the sum (an integer counts its type's widest).
    fn len_hint(&self) -> usize;
}

impl<T: Piece + ?Sized> Piece for &T {
    #[inline]
    fn push_to(&self, out: &mut String) {
        (**self).push_to(out)
    }

    #[inline]
    fn len_hint(&self) -> usize {
        (**self).len_hint()
    }
}

impl Piece for str {
    #[inline]
    fn push_to(&self, out: &mut String) {
        out.push_str(self)
    }

    #[inline]
    fn len_hint(&self) -> usize {
        self.len()
    }
}

impl Piece for String {
    #[inline]
    fn push_to(&self, out: &mut String) {
        out.push_str(self)
    }

    #[inline]
    fn len_hint(&self) -> usize {
        self.len()
    }
}

impl Piece for char {
    #[inline]
    fn push_to(&self, out: &mut String) {
        out.push(*self)
    }

    #[inline]
    fn len_hint(&self) -> usize {
        self.len_utf8()
    }
}

impl Piece for bool {
    #[inline]
    fn push_to(&self, out: &mut String) {
        out.push_str(if *self { "true" } else { "false" })
    }

    #[inline]
    fn len_hint(&self) -> usize {
        5
    }
}

/// Appends `n` in decimal, `-` first when `negative`.
fn push_decimal(out: &mut String, mut n: u64, negative: bool) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if negative {
        out.push('-');
    }
    for &d in &digits[at..] {
        out.push(char::from(d));
    }
}

macro_rules! unsigned {
    ($($t:ty),*) => {$(
        impl Piece for $t {
            #[inline]
            fn push_to(&self, out: &mut String) {
                push_decimal(out, *self as u64, false)
            }

            #[inline]
            fn len_hint(&self) -> usize {
                <$t>::MAX.ilog10() as usize + 1
            }
        }
    )*};
}

macro_rules! signed {
    ($($t:ty),*) => {$(
        impl Piece for $t {
            #[inline]
            fn push_to(&self, out: &mut String) {
                push_decimal(out, self.unsigned_abs() as u64, *self < 0)
            }

            #[inline]
            fn len_hint(&self) -> usize {
                <$t>::MAX.ilog10() as usize + 2
            }
        }
    )*};
}

unsigned!(u8, u16, u32, u64, usize);
signed!(i8, i16, i32, i64, isize);

/// A `String` of its pieces in order: text as it is, integers in decimal,
/// `bool` as `true`/`false`, anything else that implements
/// [`text::Piece`](crate::text::Piece). Each piece is evaluated once, in
/// order, and borrowed; the line is allocated once. See
/// [`text`](crate::text) for when to prefer it to `format!`.
#[macro_export]
macro_rules! text {
    ($($piece:expr),* $(,)?) => {
        $crate::__text_pieces!([] $($piece,)*)
    };
}

/// [`text!`]'s steps: binds each piece to a fresh name (each step of the
/// expansion names its own `piece`), then sizes the line and writes it,
/// every call resolved at compile time.
#[doc(hidden)]
#[macro_export]
macro_rules! __text_pieces {
    ([$($bound:ident)*]) => {{
        // `text!()` writes nothing into it.
        #[allow(unused_mut)]
        let mut line = ::std::string::String::with_capacity(
            0 $(+ $crate::text::Piece::len_hint($bound))*
        );
        $($crate::text::Piece::push_to($bound, &mut line);)*
        line
    }};
    ([$($bound:ident)*] $next:expr, $($rest:expr,)*) => {
        match &$next {
            piece => $crate::__text_pieces!([$($bound)* piece] $($rest,)*),
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_join_in_order() {
        let name = String::from("cart-7d9f");
        let line = crate::text!("draining ", 3u32, " of ", "shop", '/', name, ": ", true);
        assert_eq!(line, "draining 3 of shop/cart-7d9f: true");
        assert_eq!(crate::text!(), "");
        assert_eq!(crate::text!("one piece",), "one piece");
    }

    #[test]
    fn integers_read_as_display_does() {
        let cases: Vec<(String, String)> = vec![
            (crate::text!(0u8), 0u8.to_string()),
            (crate::text!(u8::MAX), u8::MAX.to_string()),
            (crate::text!(10u16), 10u16.to_string()),
            (crate::text!(u32::MAX), u32::MAX.to_string()),
            (crate::text!(u64::MAX), u64::MAX.to_string()),
            (crate::text!(usize::MAX), usize::MAX.to_string()),
            (crate::text!(i8::MIN), i8::MIN.to_string()),
            (crate::text!(-1i32), (-1i32).to_string()),
            (crate::text!(i64::MIN), i64::MIN.to_string()),
            (crate::text!(i64::MAX), i64::MAX.to_string()),
            (crate::text!(isize::MIN), isize::MIN.to_string()),
        ];
        for (got, want) in cases {
            assert_eq!(got, want);
        }
        for n in [0u64, 9, 10, 99, 100, 101, 12_345, 9_999_999_999] {
            assert_eq!(crate::text!(n), n.to_string(), "{n}");
        }
    }

    #[test]
    fn the_line_is_allocated_once() {
        // Every piece's hint covers what it writes, so the line never grows
        // past the capacity it was given.
        let wide = String::from("x");
        let line = crate::text!("héllo ", u64::MAX, i64::MIN, 'é', false, wide, isize::MIN);
        let hint = "héllo ".len()
            + u64::MAX.len_hint()
            + i64::MIN.len_hint()
            + 'é'.len_utf8()
            + false.len_hint()
            + wide.len()
            + isize::MIN.len_hint();
        assert_eq!(
            line,
            format!("héllo {}{}éfalsex{}", u64::MAX, i64::MIN, isize::MIN)
        );
        assert_eq!(line.capacity(), hint);
    }

    #[test]
    fn each_piece_is_evaluated_once_in_order() {
        let mut calls = Vec::new();
        let mut next = |tag: &'static str| {
            calls.push(tag);
            calls.len()
        };
        let line = crate::text!("a", next("first"), "b", next("second"));
        assert_eq!(line, "a1b2");
        assert_eq!(calls, ["first", "second"]);
    }
}
