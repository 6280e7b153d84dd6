//! Contract 0.3.0 passes every string of an event as a span of one text
//! buffer (see `events.span` in `sdk/wit/policy.wit`): one copy into the
//! sandbox for the whole event instead of one per string. The host writes
//! the text with [`Text`], the SDK reads it with [`get`]; both sides follow
//! the rule in this file and nowhere else.

/// The text of one event being written: strings are appended and their
/// spans handed back. Reused across events (`clear` keeps the allocation).
#[derive(Debug, Default, Clone)]
pub struct Text(String);

impl Text {
    /// An empty text.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets every string, keeping the capacity.
    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// Appends `s` and returns its `(start, len)`; an empty string is
    /// `(0, 0)` and appends nothing. A text grown past 4 GiB gives spans
    /// the guest refuses (the canonical ABI refuses such a string anyway).
    pub fn push(&mut self, s: &str) -> (u32, u32) {
        if s.is_empty() {
            return (0, 0);
        }
        let start = self.0.len();
        self.0.push_str(s);
        let fit = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        (fit(start), fit(s.len()))
    }

    /// The text written so far.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The string at `(start, len)` of `text`; `None` when the span is not
/// inside the text or does not fall on character boundaries.
pub fn get(text: &str, start: u32, len: u32) -> Option<&str> {
    let start = usize::try_from(start).ok()?;
    let end = start.checked_add(usize::try_from(len).ok()?)?;
    text.get(start..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pushed_strings_read_back_and_empty_ones_cost_nothing() {
        let mut t = Text::new();
        let a = t.push("uid-1");
        let e = t.push("");
        let b = t.push("näme");
        assert_eq!((a, e, b), ((0, 5), (0, 0), (5, 5)));
        assert_eq!(get(t.as_str(), a.0, a.1), Some("uid-1"));
        assert_eq!(get(t.as_str(), e.0, e.1), Some(""));
        assert_eq!(get(t.as_str(), b.0, b.1), Some("näme"));
        t.clear();
        assert_eq!(t.push("x"), (0, 1));
    }

    #[test]
    fn spans_outside_the_text_or_inside_a_character_are_refused() {
        let text = "aé";
        assert_eq!(get(text, 0, 4), None);
        assert_eq!(get(text, 2, 1), None, "inside é");
        assert_eq!(get(text, u32::MAX, u32::MAX), None, "no overflow");
        assert_eq!(get(text, 1, 2), Some("é"));
    }
}
