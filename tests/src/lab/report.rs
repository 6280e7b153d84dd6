//! One row per policy, the markdown table, and the section of
//! `docs/drain-lab.md` the table is written into (`--write-doc`).

use std::path::Path;
use std::time::Duration;

use super::LabError;

pub const BEGIN: &str = "<!-- drain-lab:begin -->";
pub const END: &str = "<!-- drain-lab:end -->";

/// What one policy's run measured. Cells are already formatted; the
/// booleans are what `--check` asserts.
#[derive(Debug, Default)]
pub struct Row {
    pub policy: String,
    pub short_failed: u64,
    pub short_total: u64,
    pub long_failed: u64,
    pub long_total: u64,
    /// `tidegate_pool_tunnels_opened_total` of the client gateway at the end.
    pub opened: f64,
    /// Tunnels the client needs without any drain: one per server pod it used.
    pub baseline: u32,
    pub old_gone: String,
    pub first_goaway: String,
    pub drain: String,
    pub cni: String,
    pub old_tunnel_at_end: bool,
    /// `Some(true)` when CNI DEL ran and returned; `None` when the scenario has none.
    pub cni_returned: Option<bool>,
    pub notes: Vec<String>,
}

pub fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1e3;
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1e3)
    } else {
        format!("{ms:.0} ms")
    }
}

pub fn table(rows: &[Row]) -> String {
    let mut s = String::from(
        "| policy | failed short requests | failed long-stream requests | tunnels opened by the client gateway | app exit → no client tunnel to the old pod | event → first GOAWAY (client) | drain duration (server) | CNI DEL |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let extra = r.opened - f64::from(r.baseline);
        s.push_str(&format!(
            "| `{}` | {} of {} | {} of {} | {} ({:+}) | {} | {} | {} | {} |\n",
            r.policy,
            r.short_failed,
            r.short_total,
            r.long_failed,
            r.long_total,
            r.opened,
            extra,
            r.old_gone,
            r.first_goaway,
            r.drain,
            r.cni
        ));
    }
    s
}

/// Per-row notes (first failures, what a cell could not say).
pub fn notes(rows: &[Row]) -> String {
    let mut s = String::new();
    for r in rows.iter().filter(|r| !r.notes.is_empty()) {
        s.push_str(&format!("- `{}`: {}\n", r.policy, r.notes.join("; ")));
    }
    s
}

/// Replaces the text between the markers of `doc` with `section`.
pub fn write_doc(doc: &Path, section: &str) -> Result<(), LabError> {
    let text = std::fs::read_to_string(doc)
        .map_err(|e| LabError::Doc(format!("read {}: {e}", doc.display())))?;
    let new = replace_section(&text, section).ok_or_else(|| {
        LabError::Doc(format!(
            "{} has no `{BEGIN}` … `{END}` section",
            doc.display()
        ))
    })?;
    std::fs::write(doc, new).map_err(|e| LabError::Doc(format!("write {}: {e}", doc.display())))
}

fn replace_section(text: &str, section: &str) -> Option<String> {
    let start = text.find(BEGIN)? + BEGIN.len();
    let end = start + text[start..].find(END)?;
    Some(format!(
        "{}\n{}\n{}",
        &text[..start],
        section.trim(),
        &text[end..]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_only_the_section() {
        let text = format!("a\n{BEGIN}\nold\n{END}\nb\n");
        let out = replace_section(&text, "new\n").unwrap();
        assert_eq!(out, format!("a\n{BEGIN}\nnew\n{END}\nb\n"));
        assert!(replace_section("no markers", "x").is_none());
    }

    #[test]
    fn table_has_a_row_per_policy() {
        let rows = [Row {
            policy: "recommended".into(),
            opened: 3.0,
            baseline: 2,
            ..Row::default()
        }];
        let t = table(&rows);
        assert!(
            t.contains("| `recommended` | 0 of 0 | 0 of 0 | 3 (+1) |"),
            "{t}"
        );
    }
}
